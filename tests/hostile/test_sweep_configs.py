"""Findings of the hostile sweep in config files and calibration archives.

- A YAML config of 20000 rules (0.8 MB) took 21 s to read and one of 200000 names 17 s: PyYAML's safe loader is
  pure Python (~1 us per character, ~40-80 us per node on the shared machine), and the 16 MB a config may be
  would have taken minutes. YAML text is now bounded to MAX_YAML_CHARS and MAX_NODES composed nodes (JSON, parsed
  in C, keeps the file-size limit): one line, at once.
- A --load-encodings scale of 3.5e38 printed numpy's cast RuntimeWarning before its one line (three lines).
- An .npz of 30000 extra members read every member's .npy header (8.6 s) before saying the first key was
  unknown; the keys come from the archive's directory now, so the unknown key is named before any member is read.
"""
from __future__ import annotations

import io
import time
import zipfile

import numpy as np
import pytest

from qcompiler.quant.settings.untrusted import MAX_NODES, MAX_YAML_CHARS
from tests.hostile.harness import check, run_cli
from tests.hostile.mutants import source


def _cnn(tmp_path):
    import onnx
    src = source("cnn")
    model = tmp_path / "model.onnx"
    onnx.save(src.model, model)
    calib = tmp_path / "calib.npz"
    np.savez(calib, **src.calib)
    return model, calib


def _config(tmp_path, text, name="c.yaml", word=None, limit=5.0):
    model, calib = _cnn(tmp_path)
    cfg = tmp_path / name
    cfg.write_text(text)
    t0 = time.monotonic()
    r = check(run_cli(["quantize", model, "--calib", calib, "-o", tmp_path / "q.onnx", "--config", cfg],
                      inputs=[model, calib, cfg], cwd=tmp_path), allowed=(2,), word=word)
    assert time.monotonic() - t0 < limit, f"took {time.monotonic() - t0:.1f} s"
    assert not (tmp_path / "q.onnx").exists()
    return r


def test_yaml_config_over_the_character_limit(tmp_path):
    text = "rules:\n" + "  - match: {op_type: Relu}\n    keep_float: true\n" * (MAX_YAML_CHARS // 45 + 1)
    _config(tmp_path, text, word="character limit")


def test_yaml_scalar_over_the_character_limit(tmp_path):
    _config(tmp_path, "scheme: " + "x" * (MAX_YAML_CHARS + 1) + "\n", word="character limit")


@pytest.mark.slow
def test_yaml_config_over_the_node_limit(tmp_path):
    # ~MAX_NODES composed before the refusal: a few seconds of pure-Python parsing, hence slow
    _config(tmp_path, "rules: [" + "1," * (MAX_NODES + 10) + "]\n", word="YAML nodes", limit=60.0)


def test_large_json_config_still_reads(tmp_path):
    """JSON is parsed in C: the YAML bounds do not apply (a 20000-rule JSON config reads in well under a second)."""
    import json
    rules = [{"match": {"name": f"no_such_node_{i}"}, "keep_float": True} for i in range(20000)]
    model, calib = _cnn(tmp_path)
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"rules": rules}))
    check(run_cli(["quantize", model, "--calib", calib, "-o", tmp_path / "q.onnx", "--config", cfg, "-q"],
                  inputs=[model, calib, cfg], cwd=tmp_path, timeout=60), allowed=(0,))


def _npy(a) -> bytes:
    b = io.BytesIO()
    np.lib.format.write_array(b, a)
    return b.getvalue()


def test_npz_with_many_unknown_members_is_refused_before_reading_them(tmp_path):
    model, _ = _cnn(tmp_path)
    x = source("cnn").calib["image"]
    bad = tmp_path / "many.npz"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("image.npy", _npy(x))
        for i in range(30000):
            z.writestr(f"extra{i}.npy", b"not an npy header")   # never read: the key is unknown
    t0 = time.monotonic()
    r = check(run_cli(["quantize", model, "--calib", bad, "-o", tmp_path / "q.onnx"], inputs=[model, bad],
                      cwd=tmp_path), allowed=(2,), word="extra0")
    assert "unknown key" in r.stderr
    assert time.monotonic() - t0 < 6.0


def test_encodings_scale_over_float32_is_one_line(tmp_path):
    """A scale of 3.5e38 (finite in float64, inf in float32) was refused after numpy's 'overflow encountered in
    cast' RuntimeWarning: three lines on stderr, not one."""
    import json
    model, calib = _cnn(tmp_path)
    enc = tmp_path / "e.json"
    enc.write_text(json.dumps({"version": "2.0.0", "encodings": [
        {"name": "image", "output_dtype": "uint8", "y_scale": 3.5e38}]}))
    check(run_cli(["quantize", model, "--calib", calib, "-o", tmp_path / "q.onnx", "--load-encodings", enc],
                  inputs=[model, calib, enc], cwd=tmp_path), allowed=(2,), word="overflows")
