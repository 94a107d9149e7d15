"""an output whose SQNR stays below the floor is a loud warning line and exit 3, after the model,
encodings and report are written; --allow-low-sqnr keeps exit 0; the API never raises on it (report['below_floor'])."""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
from click.testing import CliRunner

from qcompiler.cli import main
from qcompiler.quant import quantize
from tests.quant.test_safety_net import ln_moments_model, small_conv_model

HIGH = "90"   # no 8-bit model reaches it: the gate must fire


def _files(tmp_path, ln=False):
    m, x = ln_moments_model() if ln else small_conv_model()
    mp, dp = str(tmp_path / "m.onnx"), str(tmp_path / "calib.npz")
    onnx.save(m, mp)
    np.savez(dp, x=x)
    return mp, dp


def _digest(p):
    with open(p, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _args(tmp_path, mp, dp, *extra):
    return ["quantize", mp, "--calib", dp, "-o", str(tmp_path / "q.onnx"), "--report", str(tmp_path / "r.json"),
            "--encodings", str(tmp_path / "e.json"), *extra]


def test_below_the_floor_exits_3_after_writing_everything(tmp_path):
    mp, dp = _files(tmp_path)
    before = (_digest(mp), _digest(dp))
    r = CliRunner().invoke(main, _args(tmp_path, mp, dp, "--min-sqnr", HIGH))
    assert r.exit_code == 3, r.output
    warn = [ln for ln in r.stderr.splitlines() if ln.startswith("qcompiler: warning: output 'y' SQNR")]
    assert len(warn) == 1 and "below the floor 90 dB" in warn[0], r.stderr
    for f in ("q.onnx", "r.json", "e.json"):
        assert os.path.isfile(tmp_path / f), f
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["below_floor"][0]["output"] == "y" and rep["min_sqnr_db"] == 90.0
    assert rep["safety_net"]["triggered"] is True
    ort.InferenceSession(str(tmp_path / "q.onnx")).run(None, {"x": np.zeros((1, 3, 8, 8), np.float32)})
    assert (_digest(mp), _digest(dp)) == before


def test_allow_low_sqnr_keeps_exit_0(tmp_path):
    mp, dp = _files(tmp_path)
    r = CliRunner().invoke(main, _args(tmp_path, mp, dp, "--min-sqnr", HIGH, "--allow-low-sqnr"))
    assert r.exit_code == 0, r.output
    assert "below the floor" in r.stderr and os.path.isfile(tmp_path / "q.onnx")


def test_default_floor_passes_a_healthy_model(tmp_path):
    mp, dp = _files(tmp_path)
    r = CliRunner().invoke(main, _args(tmp_path, mp, dp))
    assert r.exit_code == 0 and "warning" not in r.stderr, r.output


def test_the_unrecognised_normalization_passes_after_the_safety_net(tmp_path):
    mp, dp = _files(tmp_path, ln=True)
    (tmp_path / "cfg.yaml").write_text("supergroups: false\n")
    r = CliRunner().invoke(main, _args(tmp_path, mp, dp, "--config", str(tmp_path / "cfg.yaml"),
                                       "--optimize", "accuracy"))
    assert r.exit_code == 0 and "warning" not in r.stderr, r.output
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["safety_net"]["changed"] and rep["below_floor"] == []


def test_subprocess_exit_codes(tmp_path):
    mp, dp = _files(tmp_path)
    cmd = [sys.executable, "-m", "qcompiler"] + _args(tmp_path, mp, dp, "--min-sqnr", HIGH)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 3, p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines and all(ln.startswith("qcompiler: warning: output ") for ln in lines), p.stderr
    assert "Traceback" not in p.stderr and os.path.isfile(tmp_path / "q.onnx")
    p = subprocess.run(cmd + ["--allow-low-sqnr"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    p = subprocess.run(cmd[:-2] + ["--min-sqnr", "lots"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr


def test_api_does_not_raise_and_lists_the_outputs(tmp_path):
    m, x = small_conv_model()
    res = quantize(m, [{"x": s} for s in x], min_sqnr=90)
    low = res.report["below_floor"]
    assert [b["output"] for b in low] == ["y"] and low[0]["sqnr_db"] < 90 and low[0]["floor_db"] == 90
