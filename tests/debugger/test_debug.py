"""`qcompiler debug` on a model with one deliberately bad layer: an activation channel 100x the others (a bias
outlier) that a per-tensor 8-bit grid cannot carry together with the rest, and a next layer that does not read
that channel. The debugger must rank that layer first, and its fallback config, fed back to `quantize`, must
reach the SQNR it was asked for, measured in onnxruntime."""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import qcompiler
from qcompiler.cli import main
from qcompiler.debugger import engine
from qcompiler.sqnr import sqnr_db

TARGET = 30.0


def _outlier_model(path):
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.3, (8, 4, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.4, (8, 8, 1, 1)).astype(np.float32)
    b2 = np.zeros(8, np.float32)
    b2[0] = 300.0                                   # the outlier channel
    w3 = rng.normal(0, 0.4, (4, 8, 1, 1)).astype(np.float32)
    w3[:, 0] = 0.0                                  # ... which the next layer does not read
    w4 = rng.normal(0, 0.4, (4, 4, 3, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (w2, "w2"), (b2, "b2"), (w3, "w3"), (w4, "w4"))]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2_outlier"),
             helper.make_node("Conv", ["c2", "w3"], ["c3"], name="conv3"),
             helper.make_node("Relu", ["c3"], ["r3"], name="relu3"),
             helper.make_node("Conv", ["r3", "w4"], ["y"], name="conv4", pads=[1, 1, 1, 1])]
    g = helper.make_graph(nodes, "outlier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    x = rng.normal(0, 1, (16, 1, 4, 8, 8)).astype(np.float32)
    return x


def _output_sqnr(float_path, quant_path, x) -> float:
    f = ort.InferenceSession(str(float_path), providers=["CPUExecutionProvider"])
    q = ort.InferenceSession(str(quant_path), providers=["CPUExecutionProvider"])
    ref = np.concatenate([f.run(None, {"x": s})[0] for s in x])
    got = np.concatenate([q.run(None, {"x": s})[0] for s in x])
    return sqnr_db(ref, got)


QUANTIZE = ["--optimize", "accuracy", "--min-sqnr", "0", "--allow-low-sqnr", "-q"]


@pytest.fixture(scope="module")
def outlier(tmp_path_factory):
    d = tmp_path_factory.mktemp("outlier")
    x = _outlier_model(d / "m.onnx")
    np.savez(d / "calib.npz", x=x)
    r = CliRunner().invoke(main, ["quantize", str(d / "m.onnx"), "--calib", str(d / "calib.npz"), "-o",
                                  str(d / "q.onnx")] + QUANTIZE)
    assert r.exit_code == 0, r.output
    return d, x


def test_debug_ranks_the_outlier_layer_first_and_its_fix_reaches_the_target(outlier, tmp_path):
    d, x = outlier
    before = _output_sqnr(d / "m.onnx", d / "q.onnx", x)
    assert before < TARGET - 5, before          # the bad layer really is bad
    fix = tmp_path / "fix.yaml"
    r = CliRunner().invoke(main, ["debug", str(d / "m.onnx"), str(d / "q.onnx"), "--calib", str(d / "calib.npz"),
                                  "--json", "--target-sqnr", str(TARGET), "--write-config", str(fix)])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    top = out["values"][0]
    assert top["node"] == "conv2_outlier" and top["kind"] == "activation", out["values"][:3]
    assert set(top) >= {"name", "sqnr_db", "alone_sqnr_db", "max_abs_error", "order", "node", "op_type"}
    assert top["alone_sqnr_db"] < TARGET
    assert abs(out["outputs"]["y"] - before) < 0.5   # the same model, the same samples
    fb = out["fallback"]
    assert fb["reached"] and "conv2_outlier" in fb["nodes"] and len(fb["nodes"]) <= 2, fb
    # the config, as written, fed back to quantize: the requested SQNR in onnxruntime
    r = CliRunner().invoke(main, ["quantize", str(d / "m.onnx"), "--calib", str(d / "calib.npz"), "-o",
                                  str(tmp_path / "fixed.onnx"), "--config", str(fix)] + QUANTIZE)
    assert r.exit_code == 0, r.output
    assert _output_sqnr(d / "m.onnx", tmp_path / "fixed.onnx", x) >= TARGET


def test_api_result_and_table(outlier):
    d, _ = outlier
    res = qcompiler.debug(str(d / "m.onnx"), str(d / "q.onnx"), str(d / "calib.npz"), limit=4)
    assert isinstance(res, qcompiler.DebugResult) and res.samples == 4
    assert "conv2_outlier" in repr(res) or res.values[0].node == "conv2_outlier"
    dct = res.to_dict()
    assert [v["order"] for v in dct["values"]] and dct["modules"] and set(dct["outputs"]) == {"y"}
    # every quantized activation of the main graph is listed (relu1 ends the Conv+Relu group, conv2, relu3, y)
    names = {v["name"] for v in dct["values"] if v["kind"] == "activation"}
    assert {"r1", "c2", "r3", "y"} <= names, names
    assert "conv2_outlier" in res.table(5)


def test_bad_input_is_one_line(outlier, tmp_path):
    d, _ = outlier
    r = CliRunner().invoke(main, ["debug", str(d / "m.onnx"), str(tmp_path / "missing.onnx"), "--calib",
                                  str(d / "calib.npz")])
    assert r.exit_code == 2 and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["debug", str(d / "m.onnx"), str(d / "q.onnx"), "--calib", str(d / "calib.npz"),
                                  "--write-config", str(tmp_path / "f.yaml")])
    assert r.exit_code == 2 and "--target-sqnr" in r.output


def test_quantize_debug_puts_the_table_and_the_report_entry(outlier, tmp_path):
    d, _ = outlier
    rep = tmp_path / "r.json"
    r = CliRunner().invoke(main, ["quantize", str(d / "m.onnx"), "--calib", str(d / "calib.npz"), "-o",
                                  str(tmp_path / "q.onnx"), "--debug", "--report", str(rep), "--optimize", "accuracy",
                                  "--min-sqnr", "0", "--allow-low-sqnr"])
    assert r.exit_code == 0, r.output
    dbg = json.loads(rep.read_text())["debug"]
    assert dbg["values"][0]["node"] == "conv2_outlier" and dbg["outputs"]["y"] < TARGET
    assert "alone dB" in r.output and "conv2_outlier" in r.output


def _matmul_model(path):
    rng = np.random.default_rng(2)
    w1 = rng.normal(0, 0.2, (64, 64)).astype(np.float32)
    w2 = rng.normal(0, 0.2, (64, 32)).astype(np.float32)
    w1[:, 5] = 0.0                      # hidden unit 5 is always 0 after the Relu ...
    w2[5, :] *= 300.0                   # ... and its row of w2, 300x the others, takes its blocks' grids
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2_outlier")]
    g = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 64])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 32])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return rng.normal(0, 1, (8, 1, 64)).astype(np.float32)


def test_weight_only_operators_are_switchable_weights(tmp_path, monkeypatch):
    x = _matmul_model(tmp_path / "m.onnx")
    np.savez(tmp_path / "c.npz", x=x)
    r = CliRunner().invoke(main, ["quantize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "w.onnx"),
                                  "--weight-only", "--weight-bits", "4", "--block-size", "32", "-q",
                                  "--allow-low-sqnr"])
    assert r.exit_code == 0, r.output
    assert sum(n.op_type == "MatMulNBits" for n in onnx.load(str(tmp_path / "w.onnx")).graph.node) == 2
    res = qcompiler.debug(str(tmp_path / "m.onnx"), str(tmp_path / "w.onnx"), str(tmp_path / "c.npz"))
    # the last MatMul makes the output: --head-bits keeps it at 8
    assert {(v.name, v.node, v.bits) for v in res.values} == {("w1", "mm1", 4), ("w2", "mm2_outlier", 8)}
    assert res.values[0].node == "mm2_outlier"
    assert not res.notes, res.notes     # every quantizer switchable: with all off, the outputs are float
    # samples stacked 8 to a run (a dynamic batch dim) give what one sample a run gives
    monkeypatch.setattr(engine, "BATCH", 1)
    single = qcompiler.debug(str(tmp_path / "m.onnx"), str(tmp_path / "w.onnx"), str(tmp_path / "c.npz"))
    assert [round(v.alone_sqnr_db, 3) for v in single.values] == [round(v.alone_sqnr_db, 3) for v in res.values]
    # a weight's figure is its dequantized table against the float one, computed from the packed blocks
    assert all(abs(v.sqnr_db - v.local_sqnr_db) < 1e-9 and 5 < v.sqnr_db < 60 for v in res.values)
    # the outlier row dominates w2, so w2 reads well on its own (local) and still ruins the output (alone)
    assert res.values[0].local_sqnr_db > 30 > res.values[0].alone_sqnr_db + 10


def test_on_a_16_bit_target_the_fallback_widens_instead(outlier, tmp_path):
    d, x = outlier
    htp = QUANTIZE + ["--target", "qnn_htp"]
    r = CliRunner().invoke(main, ["quantize", str(d / "m.onnx"), "--calib", str(d / "calib.npz"), "-o",
                                  str(tmp_path / "q.onnx")] + htp)
    assert r.exit_code == 0, r.output
    fix = tmp_path / "fix.yaml"
    r = CliRunner().invoke(main, ["debug", str(d / "m.onnx"), str(tmp_path / "q.onnx"), "--calib",
                                  str(d / "calib.npz"), "--target", "qnn_htp", "--target-sqnr", str(TARGET),
                                  "--write-config", str(fix), "--json", "--no-modules"])
    assert r.exit_code == 0, r.output
    fb = json.loads(r.stdout)["fallback"]
    assert fb["widened"] == ["conv2_outlier"] and fb["nodes"] == [] and fb["reached"], fb
    r = CliRunner().invoke(main, ["quantize", str(d / "m.onnx"), "--calib", str(d / "calib.npz"), "-o",
                                  str(tmp_path / "fixed.onnx"), "--config", str(fix)] + htp)
    assert r.exit_code == 0, r.output
    fixed = onnx.load(str(tmp_path / "fixed.onnx"))
    assert any(t.data_type in (TensorProto.UINT16, TensorProto.INT16) for t in fixed.graph.initializer)
    assert _output_sqnr(d / "m.onnx", tmp_path / "fixed.onnx", x) >= TARGET


def test_quantizers_inside_bodies_are_switched_and_their_fallback_holds(tmp_path):
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.normal(0, 0.3, (16, 16)).astype(np.float32), "w")
    then_g = helper.make_graph([helper.make_node("MatMul", ["h", "w"], ["t"], name="then_mm"),
                                helper.make_node("Relu", ["t"], ["tr"], name="then_relu")], "then", [],
                               [helper.make_tensor_value_info("tr", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["h"], ["e"], name="else_neg")], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
             helper.make_node("Greater", ["s", "floor"], ["c"], name="gt"),
             helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)]
    g = helper.make_graph(nodes, "body", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])],
                          [w, numpy_helper.from_array(np.array(-100.0, np.float32), "floor")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "c.npz", x=rng.normal(0, 1, (8, 1, 16)).astype(np.float32))
    r = CliRunner().invoke(main, ["quantize", str(tmp_path / "m.onnx"), "--calib", str(tmp_path / "c.npz"), "-o",
                                  str(tmp_path / "q.onnx"), "--optimize", "accuracy", "-q", "--allow-low-sqnr"])
    assert r.exit_code == 0, r.output
    res = qcompiler.debug(str(tmp_path / "m.onnx"), str(tmp_path / "q.onnx"), str(tmp_path / "c.npz"),
                          target_sqnr=100.0)
    assert any("inside If/Loop/Scan bodies are listed" in n for n in res.notes), res.notes
    # every quantizer is switchable, those in the branch too: with all of them off the output is float again
    assert not any("still at" in n for n in res.notes), res.notes
    by_node = {(v.node, v.kind): v for v in res.values}
    # the body's Relu output (no float twin: only its cost), the body's copy of w, h read only by the bodies
    assert by_node[("then_relu", "activation")].matched is False and ("then_mm", "weight") in by_node
    assert by_node[("mm", "activation")].name == "h" and by_node[("mm", "activation")].sqnr_db < 60
    # keeping every node float but the graph input's quantizer: measured, then the same through quantize
    fb = res.fallback
    assert {"mm", "sum", "then_mm", "then_relu"} <= set(fb["nodes"]) and not fb["reached"]
    (tmp_path / "fix.yaml").write_text(qcompiler.debugger.config_text(fb))
    r = CliRunner().invoke(main, ["quantize", str(tmp_path / "m.onnx"), "--calib", str(tmp_path / "c.npz"), "-o",
                                  str(tmp_path / "f.onnx"), "--optimize", "accuracy", "-q", "--allow-low-sqnr",
                                  "--config", str(tmp_path / "fix.yaml")])
    assert r.exit_code == 0, r.output
    x = np.load(tmp_path / "c.npz")["x"]
    assert abs(_output_sqnr(tmp_path / "m.onnx", tmp_path / "f.onnx", x) - fb["sqnr_after_db"]) < 0.1


def test_debug_writes_the_html_page(outlier, tmp_path):
    pytest.importorskip("jinja2")
    d, _ = outlier
    page = tmp_path / "d.html"
    r = CliRunner().invoke(main, ["debug", str(d / "m.onnx"), str(d / "q.onnx"), "--calib", str(d / "calib.npz"),
                                  "--report-html", str(page), "--no-modules"])
    assert r.exit_code == 0, r.output
    text = page.read_text()
    assert "conv2_outlier" in text and "<script src=" not in text


def test_debug_phases_show_bars_in_a_log_and_nothing_without(outlier, tmp_path):
    d, _ = outlier
    args = ["debug", str(d / "m.onnx"), str(d / "q.onnx"), "--calib", str(d / "calib.npz"), "--target-sqnr",
            str(TARGET)]
    r = CliRunner().invoke(main, args + ["--progress"])
    assert r.exit_code == 0, r.stderr
    lines = r.stderr.splitlines()
    for b in ("debug: comparing values: 100%", "debug: quantizers alone: 100%", "debug: modules alone: 100%",
              "debug: fallback search"):
        assert any(line.startswith(b) for line in lines), r.stderr
    assert "\r" not in r.stderr
    r = CliRunner().invoke(main, args + ["--no-progress"])
    assert r.exit_code == 0 and r.stderr == ""
    r = CliRunner().invoke(main, ["quantize", str(d / "m.onnx"), "--calib", str(d / "calib.npz"), "-o",
                                  str(tmp_path / "q.onnx"), "--debug", "--progress"] + QUANTIZE)
    assert r.exit_code == 0 and r.stderr == "", r.stderr     # -q: no bars, the debug table neither
