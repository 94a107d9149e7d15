"""Placement rules that leave out quantizers or narrow grids only where they buy nothing:
a MatMul's product goes to its bias Add unquantized; weights of float kernels use the whole int8 grid (no
reduce_range); values read only for their shape, and data movement read only by LSTM/GRU, get no second Q/DQ.
Exported models run in onnxruntime within an SQNR floor of the float model."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from qcompiler import model_to_proto
from qcompiler.quant.api import quantize
from tests.helpers import make_model, run, sqnr_db, tinfo
from tests.quant.test_quantize_fieldnotes import init, samples

H, I, S = 8, 6, 5


def _quantized_inputs(q) -> set:
    """Names of the values a QuantizeLinear reads."""
    return {n.input[0] for n in q.graph.node if n.op_type == "QuantizeLinear"}


def _linear_model(outlier: float = 0.0):
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.2, (16, 12)).astype(np.float32)
    w[3, 5] += outlier
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
             helper.make_node("Add", ["mm", "b"], ["y"], name="bias")]
    return make_model(nodes, [tinfo("x", [4, 16])], [tinfo("y", [4, 12])],
                      [init("w", w), init("b", rng.normal(0, 0.1, 12).astype(np.float32))])


def test_matmul_product_goes_to_its_bias_add_unquantized():
    proto = _linear_model()
    res = quantize(proto, samples((4, 16)))
    q = model_to_proto(res.model)
    quantized = _quantized_inputs(q)
    assert "mm" not in quantized, "a Q/DQ between MatMul and its bias Add only rounds twice"
    assert any(n.op_type == "DequantizeLinear" and n.output[0] == "y" for n in q.graph.node)
    assert "mm" in res.report["left_float"] or res.plan.spec("mm").keep_float
    for feed in samples((4, 16), n=4, seed=7):
        assert sqnr_db(run(proto, feed)[0], run(q, feed)[0]) >= 30.0


def test_weight_range_is_reduced_only_for_integer_kernels():
    # 8-bit input: MatMulIntegerToFloat, 7-bit weight range (reduce_range); LSTM: float kernel, full 8 bits
    res = quantize(_linear_model(), samples((4, 16)))
    assert res.plan.uses[("mm", 1)].range_bits == 7
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=H, name="lstm")]
    proto = make_model(nodes, [tinfo("x", [S, 1, I])], [tinfo("y", [S, 1, 1, H])],
                       [init("w", rng.normal(0, 0.4, (1, 4 * H, I)).astype(np.float32)),
                        init("r", rng.normal(0, 0.3, (1, 4 * H, H)).astype(np.float32))])
    res = quantize(proto, samples((S, 1, I)), optimize="accuracy")   # balanced keeps an LSTM's weights float
    assert res.plan.uses[("lstm", 1)].range_bits == 8 and res.plan.uses[("lstm", 2)].range_bits == 8
    assert res.encodings["params"]["w"].meta["range_bits"] == 8


def test_16bit_input_matmul_weight_uses_full_grid():
    # an outlier weight in one output channel: 7 bits would leave its small weights ~2 levels; the MatMul runs in
    # float anyway once its input is 16-bit, so its int8 weight uses all 255 levels (accuracy: on its grid;
    # balanced and size leave it float in the plan: narrow-float-weights stores it int8 for MatMulNBits)
    proto = _linear_model(outlier=6.0)
    res = quantize(proto, samples((4, 16)), act_bits=16, optimize="accuracy")
    assert res.plan.uses[("mm", 1)].range_bits == 8
    for optimize in ("balanced", "size"):
        res = quantize(proto, samples((4, 16)), act_bits=16, optimize=optimize)
        assert res.plan.uses[("mm", 1)].keep_float
        assert [n.op_type for n in res.model.graph.nodes if n.name == "mm" or n.op_type == "MatMulNBits"] \
            == ["MatMulNBits"], optimize


def _stacked_rnn_model():
    """char_rnn's shape: batch-first input Transposed for the LSTM, Squeeze of Y feeding the next LSTM and a
    Transpose read only by Shape (the exporter's batch size for the initial state)."""
    rng = np.random.default_rng(2)
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2], name="t_in"),
             helper.make_node("LSTM", ["xt", "w1", "r1"], ["y1"], hidden_size=H, name="lstm1"),
             helper.make_node("Squeeze", ["y1", "ax"], ["s1"], name="sq1"),
             helper.make_node("Transpose", ["s1"], ["t1"], perm=[1, 0, 2], name="t_shape"),
             helper.make_node("Shape", ["t1"], ["shape"], name="shape"),
             helper.make_node("LSTM", ["s1", "w2", "r2"], ["y2"], hidden_size=H, name="lstm2")]
    inits = [init("w1", rng.normal(0, 0.4, (1, 4 * H, I)).astype(np.float32)),
             init("r1", rng.normal(0, 0.3, (1, 4 * H, H)).astype(np.float32)),
             init("w2", rng.normal(0, 0.4, (1, 4 * H, H)).astype(np.float32)),
             init("r2", rng.normal(0, 0.3, (1, 4 * H, H)).astype(np.float32)),
             init("ax", np.array([1], np.int64))]
    return make_model(nodes, [tinfo("x", [1, S, I])],
                      [tinfo("y2", [S, 1, 1, H]), tinfo("shape", [3], onnx.TensorProto.INT64)], inits)


def test_no_second_quantizer_on_data_movement_read_by_float_kernels_or_shape():
    proto = _stacked_rnn_model()
    res = quantize(proto, samples((1, S, I)), optimize="accuracy")
    q = model_to_proto(res.model)
    onnx.checker.check_model(q)
    quantized = _quantized_inputs(q)
    assert {"x", "y1"} <= quantized, "LSTM boundary activations stay quantized"
    assert not {"xt", "s1", "t1"} & quantized, "Transpose/Squeeze outputs are on their input's grid already"
    for name in ("xt", "s1"):
        assert res.plan.spec(name).keep_float and res.plan.spec(name).reason
    assert res.plan.spec("t1") is None  # simplify-shape-of reads the shape before the Transpose, which dies
    assert [o.name for o in q.graph.output] == ["y2", "shape"]
    for feed in samples((1, S, I), n=4, seed=9):
        ref, got = run(proto, feed), run(q, feed)
        assert sqnr_db(ref[0], got[0]) >= 25.0
        assert np.array_equal(ref[1], got[1])


def test_trt_keeps_data_movement_quantizers_before_lstm():
    # float_kernel_ops is ort_cpu data: trt keeps the Squeeze output's own quantizer (shape-only values never get one)
    res = quantize(_stacked_rnn_model(), samples((1, S, I)), target="trt")
    assert not res.plan.spec("s1").keep_float
    assert res.plan.spec("t1") is None  # Shape(Transpose(s1)) became Gather(Shape(s1), perm)
