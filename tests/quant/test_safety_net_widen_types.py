"""The safety net widening a quantizer whose value carries a declared type (the tiny CNN's output, typed through
value_info): the widened Q's output type must follow its new zero point, or onnxruntime refuses the model
(uint8 declared, uint16 produced) and a good model came out as an error."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
from click.testing import CliRunner

from qcompiler.cli import main


def test_widened_output_quantizer_runs_in_onnxruntime(tiny, tmp_path):
    model, calib, out = tiny / "tiny_cnn.onnx", tiny / "tiny_cnn_calib.npz", tmp_path / "q.onnx"
    # a floor no 8-bit model reaches: the net widens what helps, then the gate says exit 3
    r = CliRunner().invoke(main, ["quantize", str(model), "--calib", str(calib), "-o", str(out), "--min-sqnr", "60"])
    assert r.exit_code == 3, r.output
    assert "widened" in r.stdout and "below the floor" in r.stderr
    data = np.load(calib)
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    y = sess.run(None, {name: data[name][0]})[0]
    ref = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {name: data[name][0]})[0]
    err = float(np.sum((y - ref) ** 2))
    assert 10 * np.log10(float(np.sum(ref ** 2)) / max(err, 1e-30)) > 30
