"""Findings of the hostile sweep in output paths.

A character device is written through (people send output to /dev/null on purpose), but a device that
refuses the write was an internal error: `-o /dev/full` (or a symlink to it, or `--report /dev/full`) ended in
`OSError: [Errno 28] No space left on device`, exit 1. Now it is one line naming the output, exit 2, as a full
disk is for a regular file.

`match MODEL NAME` with an unknown 4000-character pattern name quoted all of it (a 609-character line).
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

from tests.hostile.harness import check, run_cli
from tests.hostile.mutants import source

_DEV_FULL = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")


def _cnn(tmp_path):
    src = source("cnn")
    model = tmp_path / "model.onnx"
    onnx.save(src.model, model)
    calib = tmp_path / "calib.npz"
    np.savez(calib, **src.calib)
    return model, calib


@_DEV_FULL
@pytest.mark.parametrize("how", ["run -o", "quantize -o", "quantize --report", "symlink -o"])
def test_output_device_that_refuses_the_write(tmp_path, how):
    model, calib = _cnn(tmp_path)
    full = "/dev/full"
    if how == "symlink -o":
        full = tmp_path / "out.onnx"
        os.symlink("/dev/full", full)
    if how == "run -o":
        args = ["run", model, "-o", full, "--pipeline", "canonicalize"]
    elif how == "quantize --report":
        args = ["quantize", model, "--calib", calib, "-o", tmp_path / "q.onnx", "--report", full]
    else:
        args = ["quantize", model, "--calib", calib, "-o", full]
    r = check(run_cli(args, inputs=[model, calib], cwd=tmp_path), allowed=(2,), word=os.path.basename(full))
    assert "No space left" in r.stderr


def test_match_unknown_pattern_name_is_shortened(tmp_path):
    """`match MODEL <4000-character name>` quoted the whole name in its error line (609 characters, cut only by the
    CLI's last-resort bound); the name is now shortened like every other untrusted value."""
    model, _ = _cnn(tmp_path)
    r = check(run_cli(["match", model, "nope" * 1000], inputs=[model], cwd=tmp_path), allowed=(2,),
              word="unknown pattern")
    assert "nope" * 20 not in r.stderr and "layernorm" in r.stderr
