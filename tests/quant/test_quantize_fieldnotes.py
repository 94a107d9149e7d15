"""quantize() on small models built here, one per field-notes case: each exports, runs in onnxruntime with the
default session options, and meets an output SQNR floor of 25 dB against the float model (unless stated), measured
like the report's SQNR: on calibration samples (fresh samples can exceed the calibrated min/max and clip)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from qcompiler import model_to_proto
from qcompiler.errors import DataError
from qcompiler.quant.api import quantize
from tests.helpers import make_model, run, sqnr_db, tinfo

SQNR_FLOOR_DB = 25.0
RNG = np.random.default_rng(0)


def init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def conv_w(cout, cin, k=3, seed=0):
    return np.random.default_rng(seed).normal(0, 0.3, (cout, cin, k, k)).astype(np.float32)


def samples(shape, n=32, seed=1, name="x"):
    rng = np.random.default_rng(seed)
    return [{name: rng.normal(0, 1, shape).astype(np.float32)} for _ in range(n)]


def check_runs_and_sqnr(proto, res, feeds, floor=SQNR_FLOOR_DB):
    """Quantized outputs (same names, same order) within `floor` dB of the float model on fresh inputs."""
    q = model_to_proto(res.model)
    onnx.checker.check_model(q)
    assert [o.name for o in q.graph.output] == [o.name for o in proto.graph.output]
    for feed in feeds:
        ref, got = run(proto, feed), run(q, feed)
        for r, g in zip(ref, got):
            assert sqnr_db(r, g) >= floor, f"SQNR {sqnr_db(r, g):.1f} dB < {floor}"
    return q


def dq_nodes_reading(q, prefix):
    return [n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.input[0].startswith(prefix)]


def axis_of(node):
    return next((a.i for a in node.attribute if a.name == "axis"), None)


def quantized_value_names(q):
    return {n.input[0] for n in q.graph.node if n.op_type == "QuantizeLinear"}


# --- field notes §3: intermediate graph output --------------------------------------------------------------
def test_per_channel_on_every_conv_after_an_intermediate_output():
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["hidden"]),
             helper.make_node("Conv", ["hidden", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Conv", ["r2", "w3"], ["c3"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["hidden", "w4"], ["y"], pads=[1, 1, 1, 1])]
    inits = [init("w1", conv_w(8, 3, seed=1)), init("w2", conv_w(8, 8, seed=2)), init("w3", conv_w(4, 8, seed=3)),
             init("w4", conv_w(4, 8, seed=4))]
    proto = make_model(nodes, [tinfo("x", [1, 3, 8, 8])],
                       [tinfo("hidden", [1, 8, 8, 8]), tinfo("c3", [1, 4, 8, 8]), tinfo("y", [1, 4, 8, 8])], inits)
    res = quantize(proto, samples([1, 3, 8, 8]))
    q = check_runs_and_sqnr(proto, res, samples([1, 3, 8, 8], 3))
    for w, cout in (("w1", 8), ("w2", 8), ("w3", 4), ("w4", 4)):
        (dq,) = dq_nodes_reading(q, w + "_quantized")
        assert axis_of(dq) == 0
        scale = next(i for i in q.graph.initializer if i.name == dq.input[1])
        assert list(scale.dims) == [cout], w
    # the intermediate output is quantized on every use: graph output and both Convs read one DQ
    producer = {o: n for n in q.graph.node for o in n.output}
    assert producer["hidden"].op_type == "DequantizeLinear"
    readers = [n for n in q.graph.node if "hidden" in n.input]
    assert {n.op_type for n in readers} == {"Conv"} and len(readers) == 2


def test_outputs_hidden_output_and_hidden_output_1_both_kept():
    nodes = [helper.make_node("Conv", ["x", "w1"], ["hidden_output"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["hidden_output"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["hidden_output_1"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["hidden_output"], ["s"]),
             helper.make_node("Mul", ["s", "hidden_output"], ["z"])]
    inits = [init("w1", conv_w(4, 2, seed=5)), init("w2", conv_w(4, 4, seed=6))]
    proto = make_model(nodes, [tinfo("x", [1, 2, 6, 6])],
                       [tinfo("hidden_output_1", [1, 4, 6, 6]), tinfo("hidden_output", [1, 4, 6, 6]),
                        tinfo("z", [1, 4, 6, 6])], inits)
    res = quantize(proto, samples([1, 2, 6, 6]))
    check_runs_and_sqnr(proto, res, samples([1, 2, 6, 6], 3))
    assert set(res.report["output_sqnr_db"]) == {"hidden_output", "hidden_output_1", "z"}
    assert {"hidden_output", "hidden_output_1"} <= set(res.encodings["activations"])


# --- field notes §2: tying ----------------------------------------------------------------------------------
def test_concat_whose_producer_is_not_quantizable():
    # `ids` -> Cast(float) is not quantizable: the Concat ties its inputs and output, but the tie stops at the
    # Cast (its other reader keeps the float value) and the Concat input gets its own Q/DQ with the tied grid.
    nodes = [helper.make_node("Conv", ["x", "w"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Cast", ["ids"], ["b"], to=T.FLOAT),
             helper.make_node("Concat", ["a", "b"], ["cat"], axis=1),
             helper.make_node("Conv", ["cat", "w2"], ["y"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["b", "b"], ["b2"])]
    inits = [init("w", conv_w(3, 3, seed=7)), init("w2", conv_w(2, 4, seed=8))]
    proto = make_model(nodes, [tinfo("x", [1, 3, 5, 5]), tinfo("ids", [1, 1, 5, 5], T.INT64)],
                       [tinfo("y", [1, 2, 5, 5]), tinfo("b2", [1, 1, 5, 5])], inits)
    rng = np.random.default_rng(3)
    data = [{"x": rng.normal(0, 1, (1, 3, 5, 5)).astype(np.float32),
             "ids": rng.integers(0, 3, (1, 1, 5, 5)).astype(np.int64)} for _ in range(8)]
    res = quantize(proto, data)
    q = check_runs_and_sqnr(proto, res, data[:3])
    plan = res.plan
    assert plan.values["b"].keep_float and "not quantizable" in plan.values["b"].reason
    assert plan.find("a") == plan.find("cat")
    cat = next(n for n in q.graph.node if n.op_type == "Concat")
    producer = {o: n for n in q.graph.node for o in n.output}
    dqs = [producer[i] for i in cat.input]
    assert all(d.op_type == "DequantizeLinear" for d in dqs)
    scales = {numpy_helper.to_array(next(i for i in q.graph.initializer if i.name == d.input[1])).item() for d in dqs}
    assert len(scales) == 1                       # one encoding for the whole Concat
    mul = next(n for n in q.graph.node if n.op_type == "Mul")
    assert producer[mul.input[0]].op_type == "Cast"   # the float reader of `b` is untouched
    assert "ids" not in quantized_value_names(q)


def test_weight_shared_by_two_gemms():
    w = np.random.default_rng(4).normal(0, 0.5, (6, 6)).astype(np.float32)
    nodes = [helper.make_node("Gemm", ["x", "w"], ["g1"], transB=1),
             helper.make_node("Gemm", ["x", "w"], ["g2"], transB=1),
             helper.make_node("Gemm", ["x", "w"], ["g3"], transB=0),
             helper.make_node("Add", ["g1", "g2"], ["s"]),
             helper.make_node("Add", ["s", "g3"], ["y"])]
    proto = make_model(nodes, [tinfo("x", [2, 6])], [tinfo("y", [2, 6])], [init("w", w)])
    res = quantize(proto, samples([2, 6]))
    q = check_runs_and_sqnr(proto, res, samples([2, 6], 3))
    dqs = [n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.input[0].startswith("w_quantized")]
    assert sorted(axis_of(d) for d in dqs) == [0, 1]     # transB=1 pair shares one DQ; transB=0 gets its own
    gemms = [n for n in q.graph.node if n.op_type == "Gemm"]
    assert gemms[0].input[1] == gemms[1].input[1] != gemms[2].input[1]


def test_weights_in_constant_nodes_are_weights():
    nodes = [helper.make_node("Constant", [], ["w"], value=init("wv", conv_w(6, 3, seed=9))),
             helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    proto = make_model(nodes, [tinfo("x", [1, 3, 6, 6])], [tinfo("y", [1, 6, 6, 6])])
    res = quantize(proto, samples([1, 3, 6, 6]))
    q = check_runs_and_sqnr(proto, res, samples([1, 3, 6, 6], 3))
    assert not [n for n in q.graph.node if n.op_type == "Constant" and n.output[0] == "w"]
    (dq,) = [n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.input[0].startswith("w")]
    assert axis_of(dq) == 0
    wq = next(i for i in q.graph.initializer if i.name == dq.input[0])
    assert wq.data_type == T.INT8 and list(wq.dims) == [6, 3, 3, 3]


# --- field notes §6: integer tensors, masks ---------------------------------------------------------------
def test_integer_index_path_next_to_float_path():
    table = np.random.default_rng(5).normal(0, 1, (10, 8)).astype(np.float32)
    wm = np.random.default_rng(6).normal(0, 0.4, (8, 8)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"]),                 # float data, int indices
             helper.make_node("Shape", ["emb"], ["shp"]),
             helper.make_node("Gather", ["shp", "zero"], ["n"], axis=0),            # integer path
             helper.make_node("Unsqueeze", ["n", "axes"], ["n1"]),
             helper.make_node("Concat", ["n1", "m1"], ["newshape"], axis=0),
             helper.make_node("MatMul", ["emb", "wm"], ["h"]),
             helper.make_node("Reshape", ["h", "newshape"], ["y"])]
    inits = [init("table", table), init("wm", wm), init("zero", np.array(0, np.int64)),
             init("axes", np.array([0], np.int64)), init("m1", np.array([-1], np.int64))]
    proto = make_model(nodes, [tinfo("ids", [4], T.INT64)], [tinfo("y", [4, 8])], inits)
    data = [{"ids": np.random.default_rng(i).integers(0, 10, 4).astype(np.int64)} for i in range(8)]
    res = quantize(proto, data, optimize="accuracy")
    q = check_runs_and_sqnr(proto, res, data[:3])
    ints = {"ids", "shp", "n", "n1", "newshape"}
    assert not ints & quantized_value_names(q)
    assert ints <= set(res.report["integer_tensors_never_quantized"])
    assert {"emb", "h"} <= quantized_value_names(q)


@pytest.mark.parametrize("act_bits", [8, 16])
def test_attention_mask_and_softmax_input_stay_float(act_bits):
    # scores + (1 - mask) * -3.4e38 -> Softmax: a min/max grid over both zeroes the scores (ORT's minilm
    # failure); the mask product and the masked scores stay float, the Softmax output is quantized [0, 1].
    wq = np.random.default_rng(7).normal(0, 0.5, (8, 8)).astype(np.float32)
    nodes = [helper.make_node("Cast", ["mask"], ["maskf"], to=T.FLOAT),
             helper.make_node("Sub", ["one", "maskf"], ["inv"]),
             helper.make_node("Mul", ["inv", "fmin"], ["ext"]),
             helper.make_node("MatMul", ["x", "wq"], ["q"]),
             helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "xt"], ["scores"]),
             helper.make_node("Add", ["scores", "ext"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "x"], ["y"])]
    inits = [init("wq", wq), init("one", np.array(1.0, np.float32)),
             init("fmin", np.array(np.finfo(np.float32).min, np.float32))]
    proto = make_model(nodes, [tinfo("x", [1, 6, 8]), tinfo("mask", [1, 1, 6], T.INT64)], [tinfo("y", [1, 6, 8])],
                       inits)
    rng = np.random.default_rng(8)
    data = []
    for _ in range(8):
        m = np.ones((1, 1, 6), np.int64)
        m[..., rng.integers(3, 6):] = 0
        data.append({"x": rng.normal(0, 1, (1, 6, 8)).astype(np.float32), "mask": m})
    res = quantize(proto, data, act_bits=act_bits)  # a 16-bit grid cannot carry -3.4e38 either
    check_runs_and_sqnr(proto, res, data[:3])
    lf = res.report["left_float"]
    assert "sentinel" in lf["ext"] and "sentinel" in lf["masked"]
    assert res.encodings["activations"]["p"].scale == pytest.approx(1 / (2 ** act_bits - 1))


# --- field notes §1: recurrent ops ------------------------------------------------------------------------
def test_lstm_and_gru_weights_per_gate_channel():
    H, I, S = 6, 4, 5
    rng = np.random.default_rng(9)
    wl, rl = rng.normal(0, 0.4, (1, 4 * H, I)), rng.normal(0, 0.4, (1, 4 * H, H))
    wg, rg = rng.normal(0, 0.4, (1, 3 * H, H)), rng.normal(0, 0.4, (1, 3 * H, H))
    bl, bg = rng.normal(0, 0.1, (1, 8 * H)), rng.normal(0, 0.1, (1, 6 * H))
    nodes = [helper.make_node("LSTM", ["x", "wl", "rl", "bl"], ["yl", "hl", "cl"], hidden_size=H),
             helper.make_node("Squeeze", ["yl", "ax1"], ["yl2"]),
             helper.make_node("GRU", ["yl2", "wg", "rg", "bg"], ["yg", "hg"], hidden_size=H, linear_before_reset=1),
             helper.make_node("Squeeze", ["yg", "ax1"], ["y"])]
    inits = [init(n, a.astype(np.float32)) for n, a in (("wl", wl), ("rl", rl), ("bl", bl), ("wg", wg),
                                                         ("rg", rg), ("bg", bg))] + [init("ax1", np.array([1]))]
    proto = make_model(nodes, [tinfo("x", [S, 1, I])], [tinfo("y", [S, 1, H]), tinfo("hl", [1, 1, H])], inits)
    # explicit weight DQ (ort_cpu stores LSTM/GRU weights prefolded: test_quantize_latency_shape.py)
    res = quantize(proto, samples([S, 1, I], 8), target={"base": "ort_cpu", "prefold_unfused_weight_dq": False},
                   optimize="accuracy")
    q = check_runs_and_sqnr(proto, res, samples([S, 1, I], 3))
    for w, rows in (("wl", 4 * H), ("rl", 4 * H), ("wg", 3 * H), ("rg", 3 * H)):
        (dq,) = dq_nodes_reading(q, w + "_quantized")
        assert axis_of(dq) == 1
        scale = next(i for i in q.graph.initializer if i.name == dq.input[1])
        assert list(scale.dims) == [rows]
    lstm = next(n for n in q.graph.node if n.op_type == "LSTM")
    assert lstm.input[3] == "bl"                               # B stays float
    assert "cl" not in quantized_value_names(q)
    assert {"x", "yl", "yg"} <= quantized_value_names(q)
    producer = {o: n for n in q.graph.node for o in n.output}
    assert producer["hl"].op_type == "DequantizeLinear"          # Y_h graph output quantized, name kept


# --- data errors and frozen encodings -----------------------------------------------------------------------
def _tiny():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    return make_model(nodes, [tinfo("x", [1, 2, 4, 4])], [tinfo("y", [1, 3, 4, 4])], [init("w", conv_w(3, 2))])


@pytest.mark.parametrize("bad, msg", [
    ([{"z": np.zeros((1, 2, 4, 4), np.float32)}], "x"),
    ([{"x": np.zeros((1, 2, 4, 4), np.int8)}], "x"),
    ([{"x": np.full((1, 2, 4, 4), np.nan, np.float32)}], "x"),
    ([], "empty"),
])
def test_bad_calibration_data_names_the_input(bad, msg):
    with pytest.raises(DataError, match=msg):
        quantize(_tiny(), bad)


def test_load_encodings_freezes_and_quantizes_the_rest(tmp_path):
    proto = _tiny()
    first = quantize(proto, samples([1, 2, 4, 4]))
    path = str(tmp_path / "enc.json")
    first.write_encodings(path, "1.0.0")
    # freeze a deliberately different encoding for `x`; everything else is calibrated again

    doc = json.load(open(path))
    doc["activation_encodings"] = [e for e in doc["activation_encodings"] if e["name"] == "x"]
    doc["param_encodings"] = []
    doc["activation_encodings"][0]["scale"] = [0.05]
    json.dump(doc, open(path, "w"))
    second = quantize(proto, samples([1, 2, 4, 4], seed=5), load_encodings=path)
    assert second.encodings["activations"]["x"].frozen
    assert float(second.encodings["activations"]["x"].scale) == pytest.approx(0.05)
    assert not second.encodings["activations"]["y"].frozen
    check_runs_and_sqnr(proto, second, samples([1, 2, 4, 4], 2), floor=15.0)
    for version in ("1.0.0", "2.0.0"):
        second.write_encodings(str(tmp_path / f"e{version}.json"), version)
        doc = json.loads((tmp_path / f"e{version}.json").read_text())
        assert doc["version"] == version


def test_outlier_channel_is_widened_to_int16():
    # one value 1000x the bulk: an 8-bit grid leaves the bulk < 1 step, so the tensor goes to int16 (opset 21)
    spike = np.zeros((1, 8, 16, 16), np.float32)
    spike[0, 0, 0, 0] = 1000.0
    nodes = [helper.make_node("Add", ["x", "s"], ["big"]), helper.make_node("Conv", ["big", "w"], ["y"])]
    proto = make_model(nodes, [tinfo("x", [1, 8, 16, 16])], [tinfo("y", [1, 2, 14, 14])],
                       [init("s", spike), init("w", conv_w(2, 8))])
    res = quantize(proto, samples([1, 8, 16, 16]), optimize="accuracy")
    assert res.encodings["activations"]["big"].bits == 16
    assert "big" in res.report["widened"]
    q = check_runs_and_sqnr(proto, res, samples([1, 8, 16, 16], 2), floor=30.0)
    assert max(o.version for o in q.opset_import if o.domain in ("", "ai.onnx")) >= 21
    # the default (balanced) on ort_cpu: no integer kernel reads 16 bits there, so the value stays float instead
    bal = quantize(proto, samples([1, 8, 16, 16]))
    assert "big" not in bal.encodings["activations"] and "16-bit Q/DQ pair" in bal.report["left_float"]["big"]
    check_runs_and_sqnr(proto, bal, samples([1, 8, 16, 16], 2), floor=30.0)
    on_htp = quantize(proto, samples([1, 8, 16, 16]), target="qnn_htp")   # no fusion table: widening stays
    assert on_htp.encodings["activations"]["big"].bits == 16


def test_if_bodies_are_reported_float_and_outer_graph_is_quantized():
    # field notes §1: whatever is not quantized is named in the report with the reason
    then = helper.make_graph([helper.make_node("Relu", ["a"], ["t"])], "then", [], [tinfo("t", [2, 3])])
    els = helper.make_graph([helper.make_node("Neg", ["a"], ["e"])], "else", [], [tinfo("e", [2, 3])])
    nodes = [helper.make_node("Mul", ["x", "x"], ["a"]), helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els)]
    proto = make_model(nodes, [tinfo("x", [2, 3])], [tinfo("y", [2, 3])],
                       [helper.make_tensor("zero", T.FLOAT, [], [0.0])])
    res = quantize(proto, samples([2, 3]))
    check_runs_and_sqnr(proto, res, samples([2, 3], 3))
    bodies = [k for k, v in res.report["bodies"].items() if "subgraph body of If" in v]
    assert len(bodies) == 2
    assert "a" in res.encodings["activations"] and "c" not in res.encodings["activations"]
