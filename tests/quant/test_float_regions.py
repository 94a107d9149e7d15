"""on ort_cpu a quantizer stays only next to an op that runs an integer kernel (the fusion table);
`--optimize` trades accuracy and latency; onnxruntime's optimized graph shows the kernels."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from qcompiler.quant.api import quantize
from qcompiler.quant.runtime.kernels import kernel_report
from tests.helpers import make_model, run, sqnr_db, tinfo


@pytest.fixture(autouse=True)
def _no_size_rule(monkeypatch):
    """These models are tiny: without the size rule (placement/cost.py; tests/quant/test_size_rule.py) their
    integer kernels stay under --optimize latency, as the rules under test need."""
    from qcompiler.quant.placement import float_regions
    monkeypatch.setattr(float_regions, "small_regions", lambda *a: set())


def _init(name, a):
    return numpy_helper.from_array(np.asarray(a, np.float32), name)


def _samples(shape, n=16, seed=0, scale=None):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.standard_normal(shape).astype(np.float32)
        if scale is not None:
            x = x * scale
        out.append({"x": x})
    return out


def _conv_chain():
    """x -> Conv+Relu -> Softplus -> Softplus -> Conv+Relu -> y: two float ops between integer Convs."""
    rng = np.random.default_rng(1)
    inits = [_init("w1", rng.standard_normal((8, 3, 3, 3)) * 0.3), _init("w2", rng.standard_normal((8, 8, 3, 3)) * 0.2)]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Softplus", ["r1"], ["s1"], name="sp1"),
             helper.make_node("Softplus", ["s1"], ["s2"], name="sp2"),
             helper.make_node("Conv", ["s2", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["y"], name="relu2")]
    return make_model(nodes, [tinfo("x", [1, 3, 8, 8])], [tinfo("y", [1, 8, 8, 8])], inits, opset=13)


def _q_inputs(model):
    """Names of values that a QuantizeLinear reads."""
    return {n.inputs[0].name for n in model.graph.nodes if n.op_type == "QuantizeLinear"}


def test_conv_relu_becomes_qlinearconv():
    m = _conv_chain()
    res = quantize(m, _samples([1, 3, 8, 8]))
    kr = kernel_report(res.model)
    kinds = {n.node: n for n in kr.nodes}
    assert kinds["conv1"].integer and kinds["conv2"].integer, [(n.node, n.kernel, n.reason) for n in kr.nodes]
    assert "QLinearConv" in kr.optimized_ops


def test_an_op_without_an_integer_kernel_gets_no_qdq_pair_of_its_own():
    m = _conv_chain()
    calib = _samples([1, 3, 8, 8])
    acc = quantize(m, calib, optimize="accuracy")
    lat = quantize(m, calib, optimize="latency")
    assert "s1" in _q_inputs(acc.model)            # every quantizer kept
    assert "s1" not in _q_inputs(lat.model)        # between two Softplus: nothing integer reads or writes it
    assert "no integer kernel" in lat.report["left_float"]["s1"]
    assert {"r1", "s2"} <= _q_inputs(lat.model)     # the integer Convs keep their output Q and input DQ
    kr = kernel_report(lat.model)
    assert all(n.integer for n in kr.nodes if n.op == "Conv")
    feeds = calib[0]
    ref = run(m, feeds)[0]
    assert sqnr_db(ref, run(lat.model, feeds)[0]) >= sqnr_db(ref, run(acc.model, feeds)[0]) - 1.0


def _widened_matmul():
    """x -> Mul(one channel x 2000) -> MatMul(W) -> y: the Mul output's bulk is a few steps of its 8-bit grid,
    so placement widens it to 16 bits; no onnxruntime CPU kernel reads or writes 16 bits."""
    rng = np.random.default_rng(2)
    c = np.ones((1, 64), np.float32)
    c[0, 5] = 2000.0
    inits = [_init("c", c), _init("w", rng.standard_normal((64, 32)) * 0.2)]
    nodes = [helper.make_node("Mul", ["x", "c"], ["h"], name="mul"),
             helper.make_node("MatMul", ["h", "w"], ["y"], name="mm")]
    return make_model(nodes, [tinfo("x", [1, 64])], [tinfo("y", [1, 32])], inits, opset=13)


def test_balanced_leaves_a_widened_value_float_where_no_integer_kernel_reads_it():
    m = _widened_matmul()
    calib = _samples([1, 64], n=32)
    acc = quantize(m, calib, optimize="accuracy")
    if "h" not in acc.report["widened"]:
        pytest.skip("placement did not widen 'h' (criteria changed); nothing to test")
    bal = quantize(m, calib)
    assert "h" in _q_inputs(acc.model) and "h" not in _q_inputs(bal.model)
    assert "16-bit Q/DQ pair" in bal.report["left_float"]["h"]
    # the MatMul runs a float kernel: its weight is float, or stored int8 for MatMulNBits (narrow-float-weights)
    assert any("MatMul runs a float kernel" in r for r in bal.report["left_float"].values()) \
        or bal.report.get("narrow_float_weights", {}).get("weights")
    feeds = calib[0]
    ref = run(m, feeds)[0]
    assert sqnr_db(ref, run(bal.model, feeds)[0]) >= sqnr_db(ref, run(acc.model, feeds)[0])


def test_an_explicit_width_is_kept_in_balanced_mode():
    m = _widened_matmul()
    res = quantize(m, _samples([1, 64], n=8), act_bits=16)
    assert "x" in _q_inputs(res.model)      # the user asked for 16 bits: balanced does not overrule it


def test_optimize_is_checked():
    from qcompiler.errors import ArgumentError
    with pytest.raises(ArgumentError, match="optimize must be one of"):
        quantize(_conv_chain(), _samples([1, 3, 8, 8], n=2), optimize="fast")


def test_other_targets_keep_every_quantizer():
    m = _conv_chain()
    res = quantize(m, _samples([1, 3, 8, 8]), target="trt", optimize="latency")
    assert "s1" in _q_inputs(res.model)      # no fusion table for trt: nothing is judged float
    assert TensorProto.FLOAT  # the module imports what it needs
