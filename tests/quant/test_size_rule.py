"""The size rule and the inputs rule of the ort_cpu fusion table (placement/cost.py, float_regions.py): an integer
kernel too small to pay for its Q/DQ, or an elementwise integer unit whose inputs would need Qs of their own,
leaves its op float with no Q/DQ pair under --optimize latency, so float chains stay unbroken; big kernels keep
their integer units."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from qcompiler.errors import ConfigError
from qcompiler.onnx_io import model_to_proto
from qcompiler.quant.api import quantize
from qcompiler.quant.targets.fusions import load_fusions, parse_fusions
from qcompiler.quant.runtime.kernels import kernel_report
from qcompiler.quant.placement.cost import macs_per_call, reduction_length
from tests.helpers import make_model, run, sqnr_db, tinfo


def _conv_relu(c, hw, seed=0):
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) * 0.2).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) * 0.2).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["y"], name="relu2")]
    m = make_model(nodes, [tinfo("x", [1, c, hw, hw])], [tinfo("y", [1, c, hw, hw])], inits, opset=13)
    cal = [{"x": rng.standard_normal((1, c, hw, hw)).astype(np.float32)} for _ in range(4)]
    return m, cal


def test_the_table_carries_the_rule_for_ort_cpu_only():
    t = load_fusions("ort_cpu")
    assert t.for_op("Conv")[0].min_macs > 0
    assert t.for_op("Mul")[0].inputs_from_integer and t.for_op("GlobalAveragePool")[0].inputs_from_integer
    for other in ("trt", "qnn_htp"):
        assert all(not r.min_macs and not r.inputs_from_integer for r in load_fusions(other).fusions)


def test_a_big_conv_relu_chain_runs_integer_and_a_tiny_one_stays_float_without_qdq():
    m, cal = _conv_relu(16, 48)            # 16 x 48 x 48 x 144 = 5.3 M MACs per Conv
    kr = kernel_report(quantize(m, cal, optimize="latency").model)
    assert all(n.integer for n in kr.nodes), [(n.node, n.kernel, n.reason) for n in kr.nodes]
    m, cal = _conv_relu(4, 8)              # 4 x 8 x 8 x 36 = 9 k MACs per Conv
    res = quantize(m, cal, optimize="latency")
    kr = kernel_report(res.model)
    assert not any(n.integer for n in kr.nodes)
    assert not kr.runtime_qdq, kr.runtime_qdq                      # no Q/DQ pair left to cost time
    assert not res.report.get("prefolded_params")                  # float kernels read float weights
    # balanced (the default) and accuracy keep a model's one integer region whatever its size: under balanced
    # only a border with a float Conv counts (tests below), never a graph input or output
    for opt in ("balanced", "accuracy"):
        kr = kernel_report(quantize(m, cal, optimize=opt).model)
        assert kr.runtime_qdq and all(n.integer for n in kr.nodes)


def test_macs_per_call_from_the_statistics_and_the_weight_dims():
    m, cal = _conv_relu(4, 8)
    from qcompiler.onnx_io import model_from_proto
    g = model_from_proto(m).graph
    conv = next(n for n in g.nodes if n.name == "conv1")
    assert reduction_length(conv) == 4 * 3 * 3
    # conv1's output is the interior of Conv -> Relu: sized by the Relu output behind it
    stats = {"r1": {"count": 4 * 4 * 8 * 8, "calls": 4}}
    assert macs_per_call(conv, stats) == pytest.approx(4 * 8 * 8 * 36)
    assert macs_per_call(conv, {}) is None


def test_an_elementwise_unit_between_float_ops_gets_no_qdq():
    """Mul of two float branches (Sin, Cos have no integer kernel): a QLinearMul would need a Q on each input;
    the Mul stays float and the values carry no Q/DQ."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Sin", ["x"], ["s"], name="sin"), helper.make_node("Cos", ["x"], ["c"], name="cos"),
             helper.make_node("Mul", ["s", "c"], ["y"], name="mul")]
    m = make_model(nodes, [tinfo("x", [1, 64, 64])], [tinfo("y", [1, 64, 64])], [], opset=13)
    cal = [{"x": rng.standard_normal((1, 64, 64)).astype(np.float32)} for _ in range(4)]
    kr = kernel_report(quantize(m, cal, optimize="latency").model)
    assert {n.node: n.integer for n in kr.nodes}["mul"] is False
    assert not kr.runtime_qdq, kr.runtime_qdq


def test_an_lstm_gets_no_qdq_pair_and_its_weights_stay_float_unless_asked():
    rng = np.random.default_rng(2)
    h, i = 16, 8
    inits = [numpy_helper.from_array((rng.standard_normal((1, 4 * h, i)) * 0.2).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal((1, 4 * h, h)) * 0.2).astype(np.float32), "R")]
    nodes = [helper.make_node("LSTM", ["x", "W", "R"], ["y"], name="lstm", hidden_size=h)]
    m = make_model(nodes, [tinfo("x", [5, 1, i])], [tinfo("y", [5, 1, 1, h])], inits, opset=14)
    cal = [{"x": rng.standard_normal((5, 1, i)).astype(np.float32)} for _ in range(4)]
    kr = kernel_report(quantize(m, cal, optimize="latency").model)
    assert not kr.runtime_qdq, kr.runtime_qdq
    res = quantize(m, cal)          # balanced: no Q/DQ pair either (no integer kernel for LSTM on ort_cpu), but
    assert not kernel_report(res.model).runtime_qdq, kernel_report(res.model).runtime_qdq
    # ... and its weights stay exact float: onnxruntime runs the LSTM float, a grid would only cost accuracy
    assert not res.report.get("prefolded_params") and "lstm:input1" in res.report["left_float"]
    acc = quantize(m, cal, optimize="accuracy")
    for w in ("W", "R"):            # asked for: 8-bit per channel, stored on their grid (test_corpus_targets)
        assert acc.report["quantized_params"][w]["bits"] == 8 and w in acc.report["prefolded_params"]
    assert not quantize(m, cal, optimize="latency").report.get("prefolded_params")     # latency: float weights


@pytest.mark.parametrize("key", ["min_macs", "macs_per_border_element"])
@pytest.mark.parametrize("bad", [-1, True, "big", 1.5])
def test_a_bad_min_macs_is_one_config_error(bad, key):
    doc = {"target": "x", "runtime": "y", "fusions": [{"name": "conv", "ops": ["Conv"], "action": "replace",
                                                      "kernel": "QLinearConv", key: bad}]}
    with pytest.raises(ConfigError, match=key):
        parse_fusions(doc, "t.yaml")


def _island(c, hw, seed=4):
    """Conv -> HardSwish (a float Conv unit on ort_cpu) -> Conv -> Relu (an integer island) -> Conv -> HardSwish."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) * 0.2).astype(np.float32), f"w{i}")
             for i in range(3)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c0"], ["h0"], name="hs0"),
             helper.make_node("Conv", ["h0", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c2"], ["y"], name="hs2")]
    m = make_model(nodes, [tinfo("x", [1, c, hw, hw])], [tinfo("y", [1, c, hw, hw])], inits, opset=14)
    cal = [{"x": rng.standard_normal((1, c, hw, hw)).astype(np.float32)} for _ in range(4)]
    return m, cal


def test_balanced_sends_a_small_island_between_float_convs_float_and_keeps_a_big_one():
    m, cal = _island(4, 8)                  # conv1: 9 k MACs, 2 borders with float Convs
    kr = kernel_report(quantize(m, cal).model)
    assert not any(n.integer for n in kr.nodes) and not kr.runtime_qdq, kr.runtime_qdq
    m, cal = _island(32, 32)                # conv1: 9.4 M MACs >= 2 x 500 k + 64 x 65.5 k border elements
    kr = kernel_report(quantize(m, cal).model)
    assert {n.node: n.integer for n in kr.nodes}.get("conv1") is True
    # accuracy keeps every quantizer, small island or not
    m, cal = _island(4, 8)
    assert kernel_report(quantize(m, cal, optimize="accuracy").model).runtime_qdq


def _pointwise_island(cin, cout, hw, k, seed=6):
    """Depthwise Conv+HardSwish (a float unit) -> Conv kxk cin->cout (an island) -> depthwise Conv+HardSwish (a
    float unit): a MobileNet projection when k == 1."""
    rng = np.random.default_rng(seed)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w(cin, 1, 3, 3), "w0"), (w(cout, cin, k, k), "w1"),
                                                          (w(cout, 1, 3, 3), "w2"))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=[1] * 4, group=cin),
             helper.make_node("HardSwish", ["c0"], ["h0"], name="hs0"),
             helper.make_node("Conv", ["h0", "w1"], ["c1"], name="conv1", pads=[k // 2] * 4),
             helper.make_node("Conv", ["c1", "w2"], ["c2"], name="conv2", pads=[1] * 4, group=cout),
             helper.make_node("HardSwish", ["c2"], ["y"], name="hs2")]
    m = make_model(nodes, [tinfo("x", [1, cin, hw, hw])], [tinfo("y", [1, cout, hw, hw])], inits, opset=14)
    cal = [{"x": rng.standard_normal((1, cin, hw, hw)).astype(np.float32)} for _ in range(4)]
    return m, cal


def _output_sqnr(float_model, quant_model, feeds) -> float:
    return sqnr_db(np.concatenate([run(float_model, f)[0] for f in feeds]),
                   np.concatenate([run(quant_model, f)[0] for f in feeds]))


@pytest.mark.parametrize("optimize", ["balanced", "latency"])
def test_a_pointwise_island_on_a_wide_tensor_stays_float_a_3x3_one_runs_qlinearconv(optimize):
    """The size rule weighs the elements at a border, not only its count: a 1x1 Conv 64->24 at 40x40 between float
    depthwise Conv+HardSwish units (2.5 M MACs, 141 k border elements) ran 330 us as a QLinearConv island against
    280 us float (MobileNet-style models 1.08x float), so it stays float with no Q/DQ; a 3x3 Conv 64->64 at 20x20
    (15 M MACs, 51 k elements) ran 215 us against 364 us, so it runs QLinearConv at its accuracy (onnxruntime
    1.32, one thread, AVX-512 VNNI, CPU clock, median of 150 interleaved runs; timing is stated, not asserted)."""
    m, cal = _pointwise_island(64, 24, 40, 1)
    q = model_to_proto(quantize(m, cal, optimize=optimize, progress=False).model)
    assert {n.node: n.kernel for n in kernel_report(q).nodes}["conv1"] == "Conv"
    assert not [n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0] in ("h0", "c1")]
    assert _output_sqnr(m, q, cal) >= 60      # float kernels with exact weights
    m, cal = _pointwise_island(64, 64, 20, 3)
    q = model_to_proto(quantize(m, cal, optimize=optimize, progress=False).model)
    kr = kernel_report(q)
    assert {n.node: n.kernel for n in kr.nodes}["conv1"] == "QLinearConv"
    assert _output_sqnr(m, q, cal) >= 25


def test_balanced_counts_no_border_at_a_float_op_that_is_no_conv():
    """Conv+Relu whose output goes to a graph output and a float ConvTranspose: no layout border, so the small
    region stays integer under balanced (latency sends it float)."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array((rng.standard_normal((4, 2, 3, 3)) * 0.3).astype(np.float32), "wc"),
             numpy_helper.from_array((rng.standard_normal((4, 3, 2, 2)) * 0.3).astype(np.float32), "wt")]
    nodes = [helper.make_node("Conv", ["x", "wc"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("ConvTranspose", ["r", "wt"], ["z"], name="convt", group=2, strides=[2, 2])]
    m = make_model(nodes, [tinfo("x", [1, 2, 4, 4])], [tinfo("z", [1, 6, 8, 8])], inits, opset=13)
    cal = [{"x": rng.standard_normal((1, 2, 4, 4)).astype(np.float32)} for _ in range(4)]
    kr = kernel_report(quantize(m, cal).model)
    assert {n.node: n.integer for n in kr.nodes}["conv"] is True
    kr = kernel_report(quantize(m, cal, optimize="latency").model)
    assert not any(n.integer for n in kr.nodes)


def _conv_hardswish_chain(c, hw):
    r = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(3):
        inits += [numpy_helper.from_array((r.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32),
                                          f"w{i}"),
                  numpy_helper.from_array((r.standard_normal(c) * 0.1).astype(np.float32), f"b{i}")]
        nodes += [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("HardSwish", [f"c{i}"], [f"h{i}"], name=f"hs{i}")]
        x = f"h{i}"
    g = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, c, hw, hw])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m, [{"x": r.standard_normal((1, c, hw, hw)).astype(np.float32)} for _ in range(4)]


@pytest.mark.parametrize("optimize", ["balanced", "latency"])
def test_a_big_conv_hardswish_chain_runs_qlinearconv(optimize):
    """A Conv+HardSwish chain on ort_cpu leaves no float Conv once its Convs are big enough
    for QLinearConv to pay (profile split_fused_above_macs: 64 channels at 32x32, 38 M MACs per Conv); a tiny one
    (8 channels at 8x8) stays one float unit per pair, with no Q/DQ between Conv and HardSwish."""
    from qcompiler.quant.runtime.kernels import kernel_report
    big, feeds = _conv_hardswish_chain(64, 32)
    res = quantize(big, feeds, optimize=optimize, progress=False)
    rep = kernel_report(model_to_proto(res.model))
    convs = [n for n in rep.nodes if n.op == "Conv"]
    assert len(convs) == 3 and all(n.integer and n.kernel == "QLinearConv" for n in convs), convs
    assert min(res.report["output_sqnr_db"].values()) >= 25
    small, feeds = _conv_hardswish_chain(8, 8)
    q = model_to_proto(quantize(small, feeds, optimize=optimize, progress=False).model)
    assert not [n for n in q.graph.node if n.op_type == "QuantizeLinear" and n.input[0].startswith("c")]
