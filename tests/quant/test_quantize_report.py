"""The quantize report: per-output SQNR and max abs error over all calibration samples (at most 256, stated),
and no progress bar when stderr is not a terminal."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qcompiler import model_to_proto
from qcompiler.quant.api import quantize
from qcompiler.quant.interop.report import SQNR_MAX_SAMPLES
from tests.helpers import make_model, run, tinfo


def _model():
    w = np.random.default_rng(0).normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Sigmoid", ["c"], ["y"])]
    return make_model(nodes, [tinfo("x", [1, 3, 6, 6])], [tinfo("c", [1, 4, 6, 6]), tinfo("y", [1, 4, 6, 6])],
                      [numpy_helper.from_array(w, "w")])


def _feeds(n, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (1, 3, 6, 6)).astype(np.float32)} for _ in range(n)]


def test_sqnr_and_max_error_over_every_calibration_sample():
    proto, feeds = _model(), _feeds(40)
    res = quantize(proto, feeds)
    q = model_to_proto(res.model)
    rep = res.report
    assert rep["sqnr_samples"] == 40 and rep["sqnr_samples_note"] == "all 40 calibration samples"
    for k, name in enumerate(("c", "y")):
        ref = np.concatenate([run(proto, f)[k].ravel() for f in feeds]).astype(np.float64)
        got = np.concatenate([run(q, f)[k].ravel() for f in feeds]).astype(np.float64)
        expect = 10 * np.log10(np.sum(ref ** 2) / np.sum((ref - got) ** 2))
        assert abs(rep["output_sqnr_db"][name] - expect) < 0.01
        assert rep["output_max_abs_error"][name] == float(f"{np.abs(ref - got).max():.4g}")
        assert rep["output_sqnr_db"][name] >= 25.0


def test_sqnr_samples_are_bounded_and_stated():
    res = quantize(_model(), _feeds(SQNR_MAX_SAMPLES + 20))
    assert res.report["sqnr_samples"] == SQNR_MAX_SAMPLES
    assert res.report["sqnr_samples_note"].startswith(f"first {SQNR_MAX_SAMPLES} of {SQNR_MAX_SAMPLES + 20}")


def test_cli_prints_no_progress_bar_when_stderr_is_not_a_tty(tmp_path):
    model = tmp_path / "m.onnx"
    onnx.save(_model(), str(model))
    np.savez(tmp_path / "c.npz", x=np.stack([f["x"] for f in _feeds(12)]))
    out = tmp_path / "q.onnx"
    p = subprocess.run([sys.executable, "-m", "qcompiler.cli", "quantize", str(model), "--calib",
                        str(tmp_path / "c.npz"), "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert out.exists()
    assert "calibrating" not in p.stderr and "sample/s" not in p.stderr and "\r" not in p.stderr, p.stderr
    assert "SQNR" in p.stdout and "all 12 calibration samples" in p.stdout


def test_progress_bar_when_asked(capsys):
    """The check above is not vacuous: with progress on, tqdm writes 'calibrating' to stderr."""
    quantize(_model(), _feeds(4), progress=True)
    assert "calibrating" in capsys.readouterr().err
