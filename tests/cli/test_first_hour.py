"""The first hour of a new user: each stumble a newcomer met, as a test. Errors name what was supplied and the
nearest right spelling; what docs/promises.md says about notes and names holds; a user's own exception surfaces."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from qcompiler.errors import ArgumentError, DataError, InvalidModelError, UnknownPassError
from qcompiler.onnx_io import model_to_proto
from qcompiler.quant import quantize
from qcompiler.quant.interop.report import format_summary
from tests.helpers import assert_one_line_error, make_model, run, sqnr_db, tinfo

FLOOR_DB = 25.0


def _cli(tiny, *args, calib=None):
    return subprocess.run([sys.executable, "-m", "qcompiler", "quantize", str(tiny / "tiny_cnn.onnx"), "--calib",
                           str(calib or tiny / "tiny_cnn_calib.npz"), "-o", str(tiny / "fh.onnx"), *args],
                          capture_output=True, text=True)


def _images(tiny) -> np.ndarray:
    return np.load(tiny / "tiny_cnn_calib.npz")["image"]


# --- what the caller passed is cut short -----------------------------------------------------------------

def test_model_bytes_are_one_short_line(tiny):
    data = (tiny / "tiny_cnn.onnx").read_bytes()
    with pytest.raises(ArgumentError) as e:
        quantize(data, str(tiny / "tiny_cnn_calib.npz"))
    msg = str(e.value)
    assert len(msg) < 200 and "onnx.load_model_from_string" in msg, msg
    with pytest.raises(ArgumentError) as e:   # a path of 10,000 characters: cut, and said why
        quantize("m" * 10_000 + ".onnx", str(tiny / "tiny_cnn_calib.npz"))
    assert len(str(e.value)) < 250 and "10005 characters" in str(e.value)


# --- did you mean ----------------------------------------------------------------------------------------

def test_op_type_that_is_no_onnx_op_is_exit_2_with_the_nearest(tiny):
    r = _cli(tiny, "--op-types", "matmul,Conv")
    line = assert_one_line_error(r, "'matmul'", "did you mean 'MatMul'?")
    assert "no ONNX op" in line
    r = _cli(tiny, "--op-types", "Conv,Foo")
    assert_one_line_error(r, "'Foo'")
    assert not (tiny / "fh.onnx").exists()
    # an ONNX op the model lacks stays a warning (the include-list of onnxruntime's quantize_static)
    r = _cli(tiny, "--op-types", "Conv,MatMul")
    assert r.returncode == 0 and "'MatMul' matches no node" in r.stderr


def test_mistyped_recipe_names_the_nearest_pass(tiny):
    r = _cli(tiny, "--recipe", "seqmse")
    assert_one_line_error(r, "unknown pass 'seqmse'", "did you mean 'seq-mse'?")
    with pytest.raises(UnknownPassError, match="did you mean 'bias-correction'"):
        quantize(str(tiny / "tiny_cnn.onnx"), str(tiny / "tiny_cnn_calib.npz"), recipe=["bias_correction"])


# --- calibration data errors name what was supplied ---------------------------------------------------------

def test_missing_input_names_the_file_keys_and_how_to_name_arrays(tiny, tmp_path):
    a = _images(tiny)
    np.savez(tmp_path / "other.npz", pixels=a)
    with pytest.raises(DataError, match=r"missing input 'image' \(model inputs: image; the data holds pixels\)"):
        quantize(str(tiny / "tiny_cnn.onnx"), str(tmp_path / "other.npz"))
    np.savez(tmp_path / "two.npz", a, a)      # positional: arr_0, arr_1
    with pytest.raises(DataError) as e:
        quantize(str(tiny / "tiny_cnn.onnx"), str(tmp_path / "two.npz"))
    assert "arr_0, arr_1" in str(e.value) and "np.savez(f, image=...)" in str(e.value)


def test_exhausted_reader_says_rewind(tiny):
    class Reader:
        def __init__(self, feeds):
            self.feeds = list(feeds)

        def get_next(self):
            return self.feeds.pop(0) if self.feeds else None

    reader = Reader({"image": x} for x in _images(tiny)[:4])
    quantize(str(tiny / "tiny_cnn.onnx"), reader)
    with pytest.raises(DataError, match=r"rewind\(\)"):   # the same reader, read to its end by the first run
        quantize(str(tiny / "tiny_cnn.onnx"), reader)


def test_unknown_extension_lists_the_formats(tiny, tmp_path):
    (tmp_path / "calib.pt").write_bytes(b"\x80\x02torch pickle")
    r = _cli(tiny, calib=tmp_path / "calib.pt")
    assert_one_line_error(r, "calib.pt", ".npz", ".npy", "folder", "not a .pt file")


def test_bare_ndarray_says_what_a_single_input_model_takes(tiny):
    with pytest.raises(DataError) as e:
        quantize(str(tiny / "tiny_cnn.onnx"), _images(tiny))
    msg = str(e.value)
    assert "bare numpy array" in msg and "[{'image': a}]" in msg and "np.save" in msg, msg


def test_a_raising_generator_surfaces_the_users_exception(tiny):
    images = _images(tiny)

    def feeds():
        yield {"image": images[0]}
        raise KeyError("no such image: cat_0017.png")

    with pytest.raises(DataError) as e:
        quantize(str(tiny / "tiny_cnn.onnx"), feeds())
    msg = str(e.value)
    assert msg.startswith("KeyError: 'no such image: cat_0017.png'") and "sample 1" in msg, msg
    assert "pass '" not in msg     # no list of the passes that ran before calibrate
    assert isinstance(e.value.__cause__, KeyError)


# --- notes docs/promises.md promises-------------------------------------------------------------------------

def test_data_conversions_are_notes_in_the_report(tiny, tmp_path):
    a = _images(tiny)[:6]
    np.savez(tmp_path / "f64.npz", image=a.astype(np.float64))
    np.savez(tmp_path / "positional.npz", a)
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(3):
        np.save(folder / f"img_{i:03d}.npy", a[i, 0])    # (C, H, W): one sample without its batch dim
    expect = {"f64.npz": "converted float64 to float32", "positional.npz": "key 'arr_0' read as input 'image'",
              "images": "batch dim of 1 added"}
    for name, words in expect.items():
        res = quantize(str(tiny / "tiny_cnn.onnx"), str(tmp_path / name))
        assert any(words in n for n in res.report["notes"]), (name, res.report["notes"])
        out = run(model_to_proto(res.model), {"image": a[0]})[0]
        ref = run(onnx.load(str(tiny / "tiny_cnn.onnx")), {"image": a[0]})[0]
        assert sqnr_db(ref, out) > FLOOR_DB


# --- the summary speaks of the user's values --------------------------------------------------------------

def test_summary_lines_name_their_values(tiny):
    r = _cli(tiny, "--report", "-", "--op-types", "Conv")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    lines = [ln for ln in format_summary(report).splitlines() if ln.startswith("  float ")]
    assert lines
    for ln in lines:
        named = ln.split(":", 1)[0]
        assert "'" in named, ln          # `float 'r2': ...` or `float x2 ('c1', 'c2'): ...`
    assert not any("bias: bias" in ln for ln in lines)
    report["widened"] = {"sm_in": "16 bits: an 8-bit grid gives ~26 dB"}
    report["counts"]["widened"] = 1
    assert "  widened to 16 bits 'sm_in': " in format_summary(report)


def _fp16_mlp():
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float16) * 0.3, "w")
    b = numpy_helper.from_array(np.zeros(4, np.float16), "b")
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc"),
             helper.make_node("Relu", ["h"], ["y"], name="act")]
    return make_model(nodes, [tinfo("x", [1, 8], T.FLOAT16)], [tinfo("y", [1, 4], T.FLOAT16)], [w, b])


def test_float16_reasons_name_the_users_nodes():
    m = _fp16_mlp()
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((1, 8)).astype(np.float16)} for _ in range(8)]
    res = quantize(m, feeds)
    text = format_summary(res.report) + json.dumps(res.report["left_float"])
    assert "_to_float32" not in text and "_to_float16" not in text, text
    assert "float16 input 'x'" in text and "of 'act' (Relu)" in text, text
    out = run(model_to_proto(res.model), feeds[0])[0].astype(np.float32)
    assert sqnr_db(run(m, feeds[0])[0].astype(np.float32), out) > FLOOR_DB


def test_aimet_config_on_the_default_target_names_target_aimet(tiny, tmp_path):
    cfg = {"defaults": {"ops": {"is_output_quantized": "True"}, "params": {"is_quantized": "True"}},
           "params": {}, "op_type": {}, "supergroups": [{"op_list": ["Conv", "Relu"]}],
           "model_input": {"is_input_quantized": "True"}, "model_output": {}}
    (tmp_path / "quantsim.json").write_text(json.dumps(cfg))
    r = _cli(tiny, "--config", str(tmp_path / "quantsim.json"))
    assert r.returncode == 0, r.stderr
    assert "AIMET quantsim config" in r.stderr and "--target aimet" in r.stderr, r.stderr
    r = _cli(tiny, "--config", str(tmp_path / "quantsim.json"), "--target", "aimet")
    assert r.returncode == 0 and "AIMET quantsim config" not in r.stderr, r.stderr


# --- Q/DQ names say what a value is ------------------------------------------------------------------------

def test_qdq_names_say_what_a_value_is():
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.standard_normal((8, 6)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["feature"], name="act")]
    m = make_model(nodes, [tinfo("x", [1, 8])], [tinfo("feature", [1, 6])], [w], opset=13)
    feeds = [{"x": rng.standard_normal((1, 8)).astype(np.float32)} for _ in range(8)]
    res = quantize(m, feeds, optimize="accuracy")
    q = model_to_proto(res.model)
    assert [o.name for o in q.graph.output] == ["feature"]
    by_out = {o: n for n in q.graph.node for o in n.output}
    dq = by_out["feature"]
    assert dq.op_type == "DequantizeLinear" and dq.input[0] == "feature_q"
    assert by_out["feature_q"].op_type == "QuantizeLinear" and by_out["feature_q"].input[0] == "feature_float"
    assert by_out["feature_float"].op_type == "Relu"
    names = {o for n in q.graph.node for o in n.output}
    assert "x_q" in names and "x_dq" in names
    assert not any("quantizelinear" in n.lower() for n in names), names
    assert sqnr_db(run(m, feeds[0])[0], run(q, feeds[0])[0]) > FLOOR_DB


# --- an invalid old-opset model is named as such -------------------------------------------------------------

def test_invalid_old_opset_model_names_the_node(tmp_path):
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w"], ["y"], name="fc")], "g",
                          [tinfo("x", [1, 4]), tinfo("w", [4, 3])], [tinfo("y", [1, 3])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 7)])
    m.ir_version = 3
    path = tmp_path / "gemm7.onnx"
    onnx.save(m, str(path))
    np.savez(tmp_path / "calib.npz", x=np.random.default_rng(0).random((4, 1, 4), np.float32))
    with pytest.raises(InvalidModelError, match=r"node 'fc' \(Gemm\) has 2 inputs, but Gemm at the model's "
                                                r"opset 7 \(version 7\) takes 3"):
        quantize(str(path), str(tmp_path / "calib.npz"))
    r = subprocess.run([sys.executable, "-m", "qcompiler", "quantize", str(path), "--calib",
                        str(tmp_path / "calib.npz"), "-o", str(tmp_path / "q.onnx")], capture_output=True, text=True)
    assert_one_line_error(r, "node 'fc' (Gemm)")
    assert not os.path.exists(tmp_path / "q.onnx")


def test_mistyped_target_and_preset_name_the_nearest(tiny):
    assert_one_line_error(_cli(tiny, "--target", "ort-cpu"), "unknown target 'ort-cpu'", "did you mean 'ort_cpu'?")
    assert_one_line_error(_cli(tiny, "--config", "w8a16"), "no built-in preset", "did you mean", "w8a8")
