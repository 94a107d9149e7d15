"""qcompiler/quant/runtime/kernels.py, qcompiler/quant/targets/fusions.py and qcompiler/quant/runtime/latency.py on small models whose onnxruntime rule is known."""
from __future__ import annotations

import os
import tempfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qcompiler.errors import ArgumentError, ConfigError
from qcompiler.onnx_io import model_to_proto
from qcompiler.ort_session import SESSION_PREFIX
from qcompiler.quant.api import quantize
from qcompiler.quant.targets.fusions import FusionTable, builtin_tables, load_fusions
from qcompiler.quant.runtime.kernels import kernel_report, optimized_graph
from qcompiler.quant.runtime.latency import Latency, measure_latency, time_interleaved
from tests.helpers import make_model, tinfo


@pytest.fixture(autouse=True)
def _no_size_rule(monkeypatch):
    """These models are tiny: without the size rule (placement/cost.py; tests/quant/test_size_rule.py) their
    integer kernels stay under --optimize latency, as the rules under test need."""
    from qcompiler.quant.placement import float_regions
    monkeypatch.setattr(float_regions, "small_regions", lambda *a: set())


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def _conv_w(cout, cin, seed=0):
    return np.random.default_rng(seed).normal(0, 0.3, (cout, cin, 3, 3)).astype(np.float32)


def _samples(shape, n=8, name="x"):
    rng = np.random.default_rng(1)
    return [{name: rng.normal(0, 1, shape).astype(np.float32)} for _ in range(n)]


def _conv_relu_model():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["y"], name="relu")]
    return make_model(nodes, [tinfo("x", [1, 3, 8, 8])], [tinfo("y", [1, 4, 8, 8])], [_init("w", _conv_w(4, 3))])


def _qdq(x, scale, zp, dtype, q_name):
    """Q -> DQ nodes for `x` with a scalar scale and zero point of `dtype`; returns (nodes, inits, dq output)."""
    zp_arr = np.array(zp, dtype=dtype)
    inits = [_init(f"{q_name}_s", np.array(scale, np.float32)), _init(f"{q_name}_z", zp_arr)]
    nodes = [helper.make_node("QuantizeLinear", [x, f"{q_name}_s", f"{q_name}_z"], [f"{q_name}_q"], name=f"{q_name}_Q"),
             helper.make_node("DequantizeLinear", [f"{q_name}_q", f"{q_name}_s", f"{q_name}_z"], [f"{q_name}_dq"],
                              name=f"{q_name}_DQ")]
    return nodes, inits, f"{q_name}_dq"


def _hand_qdq_conv(weight_through_dq=True, act_dtype=np.uint8, output_q=True, then="Relu", out_zp=None):
    """DQ(Q(x)) -> Conv(w) -> `then` [-> Q -> DQ] -> y, built by hand (opset 21 for 16-bit Q/DQ)."""
    w = _conv_w(4, 3)
    ws = np.abs(w).reshape(4, -1).max(1) / 127
    wq = np.round(w / ws[:, None, None, None]).astype(np.int8)
    zp = 0 if act_dtype != np.uint8 else 128
    nodes, inits, xdq = _qdq("x", 0.02 if act_dtype == np.uint8 else 1e-4, zp, act_dtype, "x")
    if weight_through_dq:
        inits += [_init("wq", wq), _init("ws", ws.astype(np.float32)), _init("wz", np.zeros(4, np.int8))]
        nodes.append(helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wdq"], axis=0, name="w_DQ"))
        wname = "wdq"
    else:   # the same values, stored float on their int grid
        inits.append(_init("wf", (wq * ws[:, None, None, None]).astype(np.float32)))
        wname = "wf"
    nodes.append(helper.make_node("Conv", [xdq, wname], ["c"], pads=[1, 1, 1, 1], name="conv"))
    nodes.append(helper.make_node(then, ["c"], ["a"], name="act"))
    out = "a"
    if output_q:
        ozp = (0 if then == "Relu" else zp) if out_zp is None else out_zp   # a Relu folds into a Q whose zp is qmin
        more, more_i, out = _qdq("a", 0.03 if act_dtype == np.uint8 else 1e-4, ozp, act_dtype, "a")
        nodes += more
        inits += more_i
    nodes.append(helper.make_node("Identity", [out], ["y"], name="out"))
    return make_model(nodes, [tinfo("x", [1, 3, 8, 8])], [tinfo("y", [1, 4, 8, 8])], inits, opset=21)


def _row(report, name):
    return next(r for r in report.nodes if r.node == name)


# ---- kernels -------------------------------------------------------------------------------------------------

def test_conv_relu_quantized_by_qcompiler_runs_on_qlinearconv():
    m = _conv_relu_model()
    q = model_to_proto(quantize(m, _samples([1, 3, 8, 8])).model)
    rep = kernel_report(q)
    conv, relu = _row(rep, "conv"), _row(rep, "relu")
    assert conv.integer and conv.kernel == "QLinearConv" and conv.reason == ""
    assert relu.integer and relu.kernel == "absorbed by QLinearConv"
    assert rep.integer_count == 2 and rep.float_nodes == []
    d = rep.to_dict()
    assert d["integer_nodes"] == 2 and d["nodes"][0]["node"] == "conv"


def test_hand_built_qdq_conv_relu_becomes_qlinearconv():
    rep = kernel_report(_hand_qdq_conv())
    assert _row(rep, "conv").kernel == "QLinearConv"
    assert rep.optimized_ops.get("QLinearConv") == 1 and "Conv" not in rep.optimized_ops


def test_conv_with_float_weight_on_its_grid_and_no_output_q_stays_float_with_reasons():
    rep = kernel_report(_hand_qdq_conv(weight_through_dq=False, output_q=False, then="HardSwish"))
    conv = _row(rep, "conv")
    assert not conv.integer and conv.kernel == "Conv"
    assert "input 1 'wf' is a float weight initializer" in conv.reason
    assert "feeds float HardSwish 'act'" in conv.reason and "QLinearConv needs a Q on its output" in conv.reason
    hs = _row(rep, "act")
    assert not hs.integer and "no integer kernel for HardSwish" in hs.reason


def test_relu_the_output_q_does_not_make_redundant_keeps_the_conv_float():
    rep = kernel_report(_hand_qdq_conv(out_zp=128))
    conv = _row(rep, "conv")
    assert not conv.integer and "not made redundant by the Q" in conv.reason


def test_conv_with_16bit_activations_stays_float_and_says_so():
    rep = kernel_report(_hand_qdq_conv(act_dtype=np.uint16))
    conv = _row(rep, "conv")
    assert not conv.integer
    assert "input 0 is 16-bit (uint16): QLinearConv takes uint8/int8 only" in conv.reason


def test_matmul_add_quantized_by_qcompiler_is_an_integer_kernel():
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["y"], name="bias")]
    m = make_model(nodes, [tinfo("x", [1, 16, 32])], [tinfo("y", [1, 16, 8])],
                   [_init("w", rng.normal(0, 0.2, (32, 8)).astype(np.float32)),
                    _init("b", rng.normal(0, 0.1, 8).astype(np.float32))])
    rep = kernel_report(model_to_proto(quantize(m, _samples([1, 16, 32])).model))
    mm = _row(rep, "mm")
    assert mm.integer and mm.kernel in ("MatMulIntegerToFloat", "QLinearMatMul", "QGemm"), mm


def test_optimized_graph_folder_is_removed_and_holds_no_weights(tmp_path, monkeypatch):
    # a private temporary folder: another test process's sessions come and go in the shared one
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    g = optimized_graph(_hand_qdq_conv())
    assert not [e for e in os.listdir(tmp_path) if e.startswith(SESSION_PREFIX)]
    assert any(n.op_type == "QLinearConv" for n in g.graph.node)


# ---- fusions ------------------------------------------------------------------------------------------------

def test_ort_cpu_fusion_table_records():
    t = load_fusions("ort_cpu")
    assert isinstance(t, FusionTable) and "ort_cpu" in builtin_tables()
    conv = t.for_op("Conv")[0]
    assert conv.kernel_for("Conv") == "QLinearConv" and conv.output_q == "required"
    assert "int16" not in conv.act_dtypes and conv.bias_dtype == "int32" and "Relu" in conv.absorbs
    mm = t.for_op("MatMul")
    assert [f.kernel_for("MatMul", with_q=False) for f in mm] == ["MatMulIntegerToFloat", "MatMulNBits"]
    assert t.for_op("Add")[0].kernel_for("Add") == "QLinearAdd"
    drop = t.for_op("Reshape")[0]
    assert drop.action == "drop_qdq" and drop.equal_qparams and drop.allows_16bit
    assert t.for_op("MaxPool")[0].positive_scale and not t.for_op("MaxPool")[0].allows_16bit
    assert t.for_op("HardSwish") == [] and t.is_integer_kernel("QLinearSigmoid")


def test_fusion_table_from_a_file_and_its_errors(tmp_path):
    good = tmp_path / "b.yaml"
    good.write_text("target: b\nruntime: r\nfusions:\n  - {name: c, ops: [Conv], action: replace, kernel: QC}\n")
    t = load_fusions(str(good))
    assert t.target == "b" and t.for_op("Conv")[0].kernel == "QC" and t.is_integer_kernel("QC")
    for text, needle in (("target: b\nruntime: r\nfusions: []\n", "non-empty list"),
                         ("target: b\nruntime: r\nfusions:\n  - {name: c, ops: [Conv], action: fuse}\n", "action"),
                         ("target: b\nruntime: r\nfusions:\n  - {name: c, ops: [Conv], action: drop_qdq, bogus: 1}\n",
                          "unknown key 'bogus'"),
                         ("target: b\nruntime: r\nfusions:\n  - {name: c, ops: [Conv], action: replace}\n",
                          "needs a 'kernel'"),
                         ("target: [\n", "invalid YAML")):
        good.write_text(text)
        with pytest.raises(ConfigError) as e:
            load_fusions(str(good))
        msg = str(e.value)
        assert "\n" not in msg and needle in msg and "b.yaml" in msg, msg
    with pytest.raises(ConfigError, match="no fusion table for target 'nope'"):
        load_fusions("nope")


# ---- latency ------------------------------------------------------------------------------------------------

def test_measure_latency_returns_both_medians_and_their_ratio():
    m = _conv_relu_model()
    q = model_to_proto(quantize(m, _samples([1, 3, 8, 8])).model)
    lat = measure_latency(m, q, runs=3, warmup=1)
    assert isinstance(lat, Latency) and lat.float_ms > 0 and lat.quant_ms > 0 and lat.runs == 3
    assert lat.ratio == pytest.approx(lat.quant_ms / lat.float_ms)
    d = lat.to_dict()
    assert set(d) == {"float_ms", "quant_ms", "runs", "threads", "clock", "ratio"}
    cpu = measure_latency(m, q, runs=2, warmup=0, clock="cpu")
    assert cpu.clock == "cpu" and cpu.float_ms > 0 and cpu.quant_ms > 0
    med = time_interleaved({"a": m, "b": q, "c": m}, _samples([1, 3, 8, 8])[0], runs=2, warmup=0)
    assert list(med) == ["a", "b", "c"] and all(v > 0 for v in med.values())


def test_time_interleaved_times_a_list_of_feeds_as_one_round():
    m = _conv_relu_model()
    feeds = _samples([1, 3, 8, 8])
    one = time_interleaved({"a": m}, feeds[:1], runs=5, warmup=1, clock="cpu")["a"]
    eight = time_interleaved({"a": m}, feeds, runs=5, warmup=1, clock="cpu")["a"]
    assert eight > 2 * one, (one, eight)     # a round runs every feed: about 8x one run
    with pytest.raises(ArgumentError, match="at least one feed"):
        time_interleaved({"a": m}, [], runs=1)
    with pytest.raises(ArgumentError, match="no input 'x'"):
        time_interleaved({"a": m}, [feeds[0], {"y": feeds[1]["x"]}], runs=1)


@pytest.mark.parametrize("kw", [{"runs": 0}, {"warmup": -1}, {"threads": 0}, {"runs": True}, {"clock": "tsc"},
                                {"clock": "cpu", "threads": 2}])
def test_measure_latency_argument_errors(kw):
    m = _conv_relu_model()
    with pytest.raises(ArgumentError):
        measure_latency(m, m, **kw)


def test_measure_latency_feed_missing_an_input_is_one_line():
    m = _conv_relu_model()
    with pytest.raises(ArgumentError, match="no input 'x'"):
        measure_latency(m, m, feed={"z": np.zeros(1, np.float32)}, runs=1)


def test_unnamed_nodes_get_unique_labels():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Relu", ["r"], ["y"])]
    m = make_model(nodes, [tinfo("x", [1, 3, 8, 8])], [tinfo("y", [1, 4, 8, 8])], [_init("w", _conv_w(4, 3))])
    rep = kernel_report(model_to_proto(quantize(m, _samples([1, 3, 8, 8])).model))
    labels = [r.node for r in rep.nodes]
    assert len(labels) == len(set(labels)) == 3 and all(x.startswith("<unnamed ") or x for x in labels)
