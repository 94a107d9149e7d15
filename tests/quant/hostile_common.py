"""Shared bits of the hostile config/encodings/calibration tests: a tiny CNN, its calibration set, CLI runners."""
from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys

import numpy as np
import onnx
from click.testing import CliRunner

from qcompiler.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_cnn(folder) -> tuple:
    """(model path, calibration .npz path) of examples/make_tiny_cnn.py's model: image (N, 3, 16, 16)."""
    spec = importlib.util.spec_from_file_location("make_tiny_cnn", os.path.join(ROOT, "examples", "make_tiny_cnn.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rng = np.random.default_rng(0)
    model, calib = os.path.join(folder, "tiny_cnn.onnx"), os.path.join(folder, "calib.npz")
    onnx.save(mod.build(rng), model)
    np.savez(calib, image=rng.random((4, 1, 3, 16, 16)).astype(np.float32))
    return model, calib


def cli(*args):
    """(exit code, stderr lines) of `qcompiler ARGS` run in-process."""
    r = CliRunner().invoke(main, [str(a) for a in args])
    err = r.stderr if hasattr(r, "stderr") else r.output
    return r.exit_code, [ln for ln in err.splitlines() if ln.strip()]


def quantize_cli(model, calib, out, *extra):
    return cli("quantize", model, "--calib", calib, "-o", out, "--limit", "2", *extra)


def assert_one_line(code_lines, *needles):
    code, lines = code_lines
    assert code == 2, (code, lines)
    assert len(lines) == 1, lines
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert "Traceback" not in lines[0] and len(lines[0]) < 700, lines[0]
    return lines[0]


def run_cli_subprocess(args, timeout=60, mem_bytes=None, cwd=None):
    """`python -m qcompiler ARGS` in a child with an optional address-space limit; (code, stdout, stderr)."""
    def limit():
        if mem_bytes:
            import resource
            resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    p = subprocess.run([sys.executable, "-m", "qcompiler"] + [str(a) for a in args], capture_output=True, text=True,
                       timeout=timeout, preexec_fn=limit, cwd=cwd)
    return p.returncode, p.stdout, p.stderr


def sha(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()
