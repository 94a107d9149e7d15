"""ort_cpu exports the structure that makes the model fast (quant/placement/storage.py), not a timing.

A weight whose node cannot fuse its DequantizeLinear into an ORT integer kernel (LSTM/GRU, a MatMul fed by an
int16 activation, a Conv without an 8-bit output Q) is stored fake-quantized: no DQ on it, outputs bit-identical
to the explicit-DQ export with graph optimizations off, its encoding still exported, the report naming it.
Fused weights (QLinearConv) keep int8 storage and their DQ; trt keeps every DQ.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import helper

from qcompiler import model_to_proto
from qcompiler.quant.api import quantize
from tests.helpers import make_model, run, tinfo
from tests.quant.test_quantize_fieldnotes import conv_w, init, samples

EXPLICIT = {"base": "ort_cpu", "prefold_unfused_weight_dq": False}
NO_OPT = ort.GraphOptimizationLevel.ORT_DISABLE_ALL


def _rnn_model():
    H, I, S = 6, 4, 5
    rng = np.random.default_rng(9)
    nodes = [helper.make_node("LSTM", ["x", "wl", "rl", "bl"], ["yl", "hl"], hidden_size=H),
             helper.make_node("Squeeze", ["yl", "ax1"], ["yl2"]),
             helper.make_node("GRU", ["yl2", "wg", "rg"], ["yg"], hidden_size=H, linear_before_reset=1),
             helper.make_node("Squeeze", ["yg", "ax1"], ["y"])]
    inits = [init(n, rng.normal(0, 0.4, s).astype(np.float32)) for n, s in
             (("wl", (1, 4 * H, I)), ("rl", (1, 4 * H, H)), ("bl", (1, 8 * H)), ("wg", (1, 3 * H, H)),
              ("rg", (1, 3 * H, H)))] + [init("ax1", np.array([1]))]
    return make_model(nodes, [tinfo("x", [S, 1, I])], [tinfo("y", [S, 1, H])], inits), [S, 1, I]


def _conv_model():
    # c1: Conv->Relu->Q fuses into QLinearConv; c2 feeds HardSwish (no output Q): a float Conv in ORT
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c1"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c2"], ["y"])]
    return make_model(nodes, [tinfo("x", [1, 3, 8, 8])], [tinfo("y", [1, 4, 8, 8])],
                      [init("w1", conv_w(4, 3)), init("w2", conv_w(4, 4, seed=1))], opset=17), [1, 3, 8, 8]


def _dq_weight_readers(proto):
    """{consumer op: number of its inputs read from a DequantizeLinear of an initializer}."""
    inits = {i.name for i in proto.graph.initializer}
    dq_of_init = {n.output[0] for n in proto.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits}
    out = {}
    for n in proto.graph.node:
        k = sum(i in dq_of_init for i in n.input)
        if k:
            out[n.op_type] = out.get(n.op_type, 0) + k
    return out


def _same_outputs(a, b, feeds):
    for f in feeds:
        for x, y in zip(run(a, f, NO_OPT), run(b, f, NO_OPT)):
            np.testing.assert_array_equal(x, y)


def test_lstm_gru_weights_prefolded_and_bit_identical():
    proto, shape = _rnn_model()
    fast = quantize(proto, samples(shape, 8), optimize="accuracy")
    slow = quantize(proto, samples(shape, 8), target=EXPLICIT, optimize="accuracy")
    pf, ps = model_to_proto(fast.model), model_to_proto(slow.model)
    assert "LSTM" not in _dq_weight_readers(pf) and "GRU" not in _dq_weight_readers(pf)
    assert _dq_weight_readers(ps)["LSTM"] == 2 and _dq_weight_readers(ps)["GRU"] == 2
    _same_outputs(pf, ps, samples(shape, 3, seed=5))
    for w in ("wl", "rl", "wg", "rg"):
        assert w in fast.encodings["params"] and "no integer kernel" in fast.report["prefolded_params"][w]
        q = fast.encodings["params"][w]
        arr = next(i for i in pf.graph.initializer if i.name.startswith(w + "_"))   # the prefolded float
        from onnx import numpy_helper
        vals = numpy_helper.to_array(arr) / np.asarray(q.scale).reshape(1, -1, 1)
        np.testing.assert_allclose(vals, np.round(vals), atol=1e-3)                 # on the int grid


def test_fused_conv_keeps_dq_unfused_conv_prefolded():
    proto, shape = _conv_model()
    fast = quantize(proto, samples(shape, 8), optimize="accuracy")
    slow = quantize(proto, samples(shape, 8), target=EXPLICIT, optimize="accuracy")
    pf, ps = model_to_proto(fast.model), model_to_proto(slow.model)
    assert set(fast.report["prefolded_params"]) == {"w2"}                  # c2: no Q after it (HardSwish)
    assert _dq_weight_readers(pf) == {"Conv": 1} and _dq_weight_readers(ps) == {"Conv": 2}
    _same_outputs(pf, ps, samples(shape, 3, seed=5))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    s = ort.InferenceSession(pf.SerializeToString(), so, providers=["CPUExecutionProvider"])
    assert s.run(None, samples(shape, 1)[0])[0].shape == (1, 4, 8, 8)


def test_int16_matmul_weight_prefolded():
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])]
    proto = make_model(nodes, [tinfo("x", [2, 8])], [tinfo("y", [2, 5])],
                       [init("w", rng.normal(0, 0.3, (8, 5)).astype(np.float32))])
    # accuracy: the weight on its grid (balanced leaves a float kernel's weight exact float)
    fast = quantize(proto, samples([2, 8], 8), act_bits=16, optimize="accuracy")
    assert "not 8-bit" in fast.report["prefolded_params"]["w"]
    assert _dq_weight_readers(model_to_proto(fast.model)) == {}
    _same_outputs(model_to_proto(fast.model), model_to_proto(quantize(proto, samples([2, 8], 8), act_bits=16,
                                                                       target=EXPLICIT, optimize="accuracy").model),
                  samples([2, 8], 3, seed=5))


def test_trt_keeps_explicit_weight_dq():
    proto, shape = _rnn_model()
    res = quantize(proto, samples(shape, 8), target="trt")
    assert not res.report.get("prefolded_params")
    assert _dq_weight_readers(model_to_proto(res.model)).get("LSTM") == 2
