"""The mixed-precision search's per-layer switchable model (mixed_precision/switched.py through switchable.py),
run in onnxruntime: all off gives the float model's outputs; one layer on gives that layer's QDQ values (its
constant weight DQ folded to a grid constant, bit-identical to the DQ) with the other layer float."""
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from qcompiler.onnx_io import model_from_proto
from qcompiler.ort_session import create_session
from qcompiler.passes.quantize.mixed_precision.switched import SWITCH, switchable_proto
from qcompiler.quant.core.qdq import constant_dq_value

RNG = np.random.default_rng(3)
W1 = (RNG.standard_normal((16, 8)) * 0.3).astype(np.float32)
W2 = (RNG.standard_normal((8, 4)) * 0.3).astype(np.float32)
S_X = np.float32(0.02)


def _grid(w):
    s = np.float32(np.abs(w).max() / 127)
    return np.clip(np.round(w / s), -127, 127).astype(np.int8), s


def _model(nodes, inits):
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [3, 16])],
                     [h.make_tensor_value_info("y", T.FLOAT, [3, 4])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)])


def _float():
    return _model([h.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
                   h.make_node("MatMul", ["a", "w2"], ["y"], name="mm2")],
                  [nh.from_array(W1, "w1"), nh.from_array(W2, "w2")])


def _lowered():
    """Layer 0 (mm1): input Q/DQ and an int8 weight through a DQ; layer 1 (mm2): its weight stored float on its
    grid (a prefolded weight), no DQ."""
    q1, s1 = _grid(W1)
    q2, s2 = _grid(W2)
    mk = h.make_node
    return _model([mk("QuantizeLinear", ["x", "sx", "z"], ["xq"], name="qx"),
                   mk("DequantizeLinear", ["xq", "sx", "z"], ["xd"], name="dqx"),
                   mk("DequantizeLinear", ["w1_quantized", "s1", "z"], ["w1_dequantized"], name="dqw1"),
                   mk("MatMul", ["xd", "w1_dequantized"], ["a"], name="mm1"),
                   mk("MatMul", ["a", "w2_prefolded"], ["y"], name="mm2")],
                  [nh.from_array(q1, "w1_quantized"), nh.from_array(s1, "s1"), nh.from_array(S_X, "sx"),
                   nh.from_array(np.int8(0), "z"),
                   nh.from_array((q2.astype(np.float32) * s2).astype(np.float32), "w2_prefolded")])


def _run(proto, feed, opt_level=None):
    return create_session(proto.SerializeToString(), role="test", opt_level=opt_level).run(["y"], feed,
                                                                                          where="test")[0]


def test_each_layer_alone_gives_its_qdq_values_and_all_off_the_float_ones():
    x = RNG.standard_normal((3, 16)).astype(np.float32)
    base, lowered = model_from_proto(_float()), _lowered()
    layers = [SimpleNamespace(nodes=["mm1"]), SimpleNamespace(nodes=["mm2"])]
    proto, has = switchable_proto(model_from_proto(lowered), base, layers)
    assert has == [0, 1]
    # the weight DQ is folded (onnxruntime would run it on every call); the activation's Q/DQ stays
    assert [n.name for n in proto.graph.node if n.op_type == "DequantizeLinear"] == ["dqx"]
    onnx.checker.check_model(proto)
    want_float = x @ W1 @ W2
    got = {k: _run(proto, {"x": x, SWITCH: np.array(on, bool)})
           for k, on in {"off": [0, 0], "l0": [1, 0], "l1": [0, 1], "both": [1, 1]}.items()}
    np.testing.assert_allclose(got["off"], want_float, rtol=1e-5, atol=1e-5)
    # both on is the lowered model itself, to the bit (the folded weight is what its DQ computes; without
    # onnxruntime's QDQ fusions, which round differently)
    plain = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    np.testing.assert_array_equal(_run(proto, {"x": x, SWITCH: np.ones(2, bool)}, plain),
                                  _run(lowered, {"x": x}, plain))
    np.testing.assert_allclose(got["both"], _run(lowered, {"x": x}), rtol=1e-5, atol=1e-6)
    # one layer on: that layer's QDQ values, the other layer float
    q1, s1 = _grid(W1)
    xd = np.clip(np.round(x / S_X), -128, 127).astype(np.float32) * S_X
    np.testing.assert_allclose(got["l0"], xd @ (q1.astype(np.float32) * s1) @ W2, rtol=1e-4, atol=1e-5)
    q2, s2 = _grid(W2)
    np.testing.assert_allclose(got["l1"], x @ W1 @ (q2.astype(np.float32) * s2), rtol=1e-4, atol=1e-5)
    assert not np.allclose(got["l0"], got["off"]) and not np.allclose(got["l1"], got["off"])


def test_constant_dq_value_matches_onnxruntime_dequantize_linear_per_channel():
    q = RNG.integers(-128, 128, (4, 6)).astype(np.int8)
    scale = (RNG.random(6) * 0.1 + 0.01).astype(np.float32)
    zp = RNG.integers(-3, 4, 6).astype(np.int8)
    dq = h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq", axis=1)
    g = h.make_graph([dq], "g", [], [h.make_tensor_value_info("y", T.FLOAT, [4, 6])],
                     [nh.from_array(q, "q"), nh.from_array(scale, "s"), nh.from_array(zp, "z")])
    proto = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m = model_from_proto(proto)
    value = constant_dq_value(m.graph.nodes_by_op("DequantizeLinear")[0])
    want = create_session(proto.SerializeToString(), role="test").run(["y"], {}, where="test")[0]
    assert value.dtype == np.float32
    np.testing.assert_array_equal(value, want)
