"""The CLI as a new user runs it: real subprocesses, one-line errors with exit code 2, no tracebacks."""
import json
import os
import subprocess
import sys

import numpy as np
import onnx

from tests.helpers import assert_one_line_error


def qc(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "qcompiler", *args], capture_output=True, text=True, cwd=cwd)


def test_inspect_text_and_json(tiny):
    r = qc("inspect", str(tiny / "tiny_cnn.onnx"))
    assert r.returncode == 0, r.stderr
    assert "Conv" in r.stdout and "image" in r.stdout and "logits" in r.stdout
    r = qc("inspect", str(tiny / "tiny_cnn.onnx"), "--json")
    info = json.loads(r.stdout)
    assert info["op_histogram"]["Conv"] == 2 and info["outputs"][0]["name"] == "logits"


def test_run_with_all_instrumentation(tiny, tmp_path):
    out = tmp_path / "o.onnx"
    r = qc("run", str(tiny / "tiny_cnn.onnx"), "-o", str(out), "--pipeline", "canonicalize,fold-constants",
           "--verify-each", "--print-after", "all", "--dump-dir", str(tmp_path / "dump"), "--time-passes", "--stats")
    assert r.returncode == 0, r.stderr
    assert "IR after canonicalize" in r.stdout
    assert "Pass execution timing report" in r.stderr and "Pass statistics" in r.stderr
    assert "outputs match" in r.stderr or "verify" in r.stderr
    assert len(os.listdir(tmp_path / "dump")) == 3
    onnx.checker.check_model(onnx.load(str(out)))


def test_list_passes():
    r = qc("list-passes")
    assert r.returncode == 0 and "canonicalize" in r.stdout and "fold-constants" in r.stdout


def test_bad_inputs_one_line_exit_2(tiny, tmp_path):
    text = tmp_path / "notonnx.onnx"
    text.write_text("hello, I am not a model\n" * 10)
    assert_one_line_error(qc("inspect", str(text)), "notonnx.onnx", "not an ONNX model")
    data = (tiny / "tiny_cnn.onnx").read_bytes()
    trunc = tmp_path / "trunc.onnx"
    trunc.write_bytes(data[: len(data) // 2])
    assert_one_line_error(qc("inspect", str(trunc)), "trunc.onnx")
    assert_one_line_error(qc("inspect", str(tmp_path / "missing.onnx")), "no such file")
    assert_one_line_error(qc("run", str(tiny / "tiny_cnn.onnx"), "-o", str(tmp_path / "x.onnx"),
                             "--pipeline", "canonicalize,no-such-pass"), "unknown pass 'no-such-pass'")
    # an input file is never overwritten
    src = tmp_path / "in.onnx"
    src.write_bytes(data)
    assert_one_line_error(qc("run", str(src), "-o", str(src), "--pipeline", "canonicalize"), "would overwrite the input file")
    assert src.read_bytes() == data


def test_cycle_and_dangling_input(tmp_path):
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    cyc = helper.make_model(helper.make_graph([helper.make_node("Add", ["x", "b"], ["a"], name="n1"),
                                               helper.make_node("Relu", ["a"], ["b"], name="n2"),
                                               helper.make_node("Neg", ["a"], ["y"], name="n3")], "g", [x], [y]))
    p = tmp_path / "cycle.onnx"
    onnx.save(cyc, str(p))
    assert_one_line_error(qc("run", str(p), "-o", str(tmp_path / "o.onnx"), "--pipeline", "canonicalize"), "cycle")
    dang = helper.make_model(helper.make_graph([helper.make_node("Add", ["x", "ghost"], ["y"], name="add0")], "g", [x], [y]))
    p = tmp_path / "dangling.onnx"
    onnx.save(dang, str(p))
    assert_one_line_error(qc("inspect", str(p)), "add0", "ghost")


def test_quantize_refuses_to_overwrite_any_input_before_working(tiny, tmp_path):
    model, calib = str(tiny / "tiny_cnn.onnx"), str(tiny / "tiny_cnn_calib.npz")
    before = (open(model, "rb").read(), open(calib, "rb").read())
    out = str(tmp_path / "q.onnx")
    assert_one_line_error(qc("quantize", model, "--calib", calib, "-o", out, "--encodings", model),
                          "--encodings would overwrite the input file")
    assert_one_line_error(qc("quantize", model, "--calib", calib, "-o", out, "--report", calib),
                          "--report would overwrite the input file")
    assert_one_line_error(qc("quantize", model, "--calib", calib, "-o", out, "--report", out), "given for both")
    assert (open(model, "rb").read(), open(calib, "rb").read()) == before
    assert not os.path.exists(out)


def test_quantize_end_to_end(tiny, tmp_path):
    out, enc, rep = (str(tmp_path / n) for n in ("q.onnx", "enc.json", "report.json"))
    r = qc("quantize", str(tiny / "tiny_cnn.onnx"), "--calib", str(tiny / "tiny_cnn_calib.npz"), "-o", out,
           "--encodings", enc, "--encodings-version", "2.0.0", "--report", rep)
    assert r.returncode == 0, r.stderr
    assert "SQNR" in r.stdout and "Traceback" not in r.stderr and "%|" not in r.stderr  # no progress bar off a TTY
    report = json.load(open(rep))
    assert report["output_sqnr_db"]["logits"] >= 30
    assert json.load(open(enc))["version"] == "2.0.0"
    import onnxruntime as ort
    x = np.load(str(tiny / "tiny_cnn_calib.npz"))["image"][0]
    ort.InferenceSession(out, providers=["CPUExecutionProvider"]).run(None, {"image": x})
