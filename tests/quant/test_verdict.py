"""The summary's one-line verdict (quant/interop/verdict.py): the share of multiply-accumulates on integer kernels
as onnxruntime really runs them, the file against float, and for a run that quantized nothing, why and what to ask
for instead."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qcompiler.quant.api import quantize
from qcompiler.quant.interop.report import format_summary
from tests.helpers import make_model, tinfo
from tests.quant.test_optimize_size import _conv_hardswish, _lstm


def _conv_relu_chain(c=32, hw=16, seed=0):
    """Two Conv+Relu units big enough for QLinearConv on ort_cpu."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32),
                                     f"w{i}") for i in range(2)]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["y"], name="relu1")]
    m = make_model(nodes, [tinfo("x", [1, c, hw, hw])], [tinfo("y", [1, c, hw, hw])], inits, opset=13)
    return m, [{"x": rng.standard_normal((1, c, hw, hw)).astype(np.float32)} for _ in range(8)]


def test_integer_share_is_read_from_what_onnxruntime_runs():
    m, cal = _conv_relu_chain()
    share = quantize(m, cal).report["kernel_share"]
    assert share["nodes"] == 2 and share["integer_nodes"] == 2 and share["share"] == 1.0, share
    assert share["macs"] == 2 * 32 * 32 * 9 * 16 * 16
    m, cal = _conv_hardswish()      # Conv+HardSwish units too small to split: every Conv runs float
    res = quantize(m, cal)
    assert res.report["kernel_share"]["share"] == 0.0
    text = format_summary(res.report)
    line = [x for x in text.splitlines() if "verdict:" in x]
    assert len(line) == 1 and "0% of multiply-accumulates" in line[0], text
    assert "nothing runs quantized" in line[0] and "--optimize size" in line[0] and "--optimize accuracy" in line[0]
    # an LSTM's products count too (onnxruntime runs it float): 6 steps x 64 hidden x 4 gates x (32 + 64)
    lm, lcal = _lstm()
    share = quantize(lm, lcal).report["kernel_share"]
    assert share["nodes"] == 1 and share["share"] == 0.0 and share["macs"] == 6 * 64 * 4 * (32 + 64), share
    # asked for size: the line does not offer size again
    line = [x for x in format_summary(quantize(m, cal, optimize="size").report).splitlines() if "verdict:" in x][0]
    assert "--optimize size" not in line and "--optimize accuracy" in line


def test_json_summary_carries_the_verdict_and_the_share(tmp_path):
    m, cal = _conv_relu_chain()
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    np.savez(tmp_path / "cal.npz", x=np.stack([c["x"] for c in cal]))
    r = subprocess.run([sys.executable, "-m", "qcompiler", "quantize", str(p), "--calib", str(tmp_path / "cal.npz"),
                        "-o", str(tmp_path / "q.onnx"), "--json", "--optimize", "size"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["kernel_share"]["share"] == 1.0 and out["size"]["ratio"] < 0.35, out
    assert out["verdict"].startswith("verdict: 100% of multiply-accumulates")
    assert f"({out['size']['ratio']:.2f}x)" in out["verdict"]
    assert out["verdict"] in r.stderr
