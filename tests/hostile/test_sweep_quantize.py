"""Findings of the hostile sweep in `quantize` itself (a model or setting the importer accepts, then a pass broke).

Each case runs the CLI in a limited child (tests/hostile/harness.py: 3 GB address space, wall timeout, inputs
hashed before and after) and names what happened before the fix:

- a MatMul weight with a zero dim (shape (4, 0), a valid model): `assign-encodings` failed on reshape(0, -1), then
  the report on min() of an empty array: exit 1. Now the weight stays float with the reason in the report.
- a block size longer than the weight's axis (`--block-size 2**30 --weight-bits 4`, or `per_block` in a config)
  padded the block to its full length and repeated the scale as many times: tens of GB for a 4x4 weight (exit 1
  out of memory; 2**62: "array is too big"). Now a block longer than the axis is one block of K.
- weights of +-Inf or 3e38 printed numpy RuntimeWarning lines (All-NaN slice, overflow) on stderr around an exit 0.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from tests.hostile.harness import check, run_cli


def _matmul(tmp_path, w: np.ndarray):
    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [vi("x", onnx.TensorProto.FLOAT, [1, 4])], [vi("y", onnx.TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    model = tmp_path / "model.onnx"
    onnx.save(m, model)
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(0).random((4, 1, 4)).astype(np.float32))
    return model, calib


def _quantize(tmp_path, model, calib, *extra, inputs=()):
    out = tmp_path / "q.onnx"
    r = check(run_cli(["quantize", model, "--calib", calib, "-o", out, "--allow-low-sqnr", *extra],
                      inputs=[model, calib, *inputs], cwd=tmp_path), allowed=(0,))
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    return r


def test_zero_size_weight_stays_float(tmp_path):
    model, calib = _matmul(tmp_path, np.ones((4, 0), np.float32))
    r = _quantize(tmp_path, model, calib)
    assert "holds no values" in r.stdout + r.stderr


@pytest.mark.parametrize("block", [2 ** 30, 2 ** 62])
def test_block_longer_than_axis_allocates_nothing_extra(tmp_path, block):
    model, calib = _matmul(tmp_path, np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32))
    _quantize(tmp_path, model, calib, "--weight-bits", "4", "--block-size", str(block))
    q = onnx.load(tmp_path / "q.onnx")
    dq = [n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.input[0].startswith("w")]
    assert dq and any(a.name == "block_size" and a.i == block for a in dq[0].attribute)


def test_config_per_block_longer_than_axis(tmp_path):
    model, calib = _matmul(tmp_path, np.random.default_rng(2).standard_normal((4, 4)).astype(np.float32))
    cfg = tmp_path / "c.yaml"
    cfg.write_text("weights: {bits: 4, per_block: 1073741824}\n")
    _quantize(tmp_path, model, calib, "--config", cfg, inputs=[cfg])


@pytest.mark.parametrize("value", [np.inf, 3e38])
def test_overflowing_weights_print_no_numpy_warnings(tmp_path, value):
    w = np.array([[value, -value, 1, 0]] * 4, np.float32)
    model, calib = _matmul(tmp_path, w)
    r = _quantize(tmp_path, model, calib)
    assert "Warning" not in r.stderr and "np." not in r.stderr, r.stderr
