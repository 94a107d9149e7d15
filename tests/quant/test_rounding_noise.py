"""MatMulNBits' accuracy_level 4 decided from what calibration gathered (the per-channel rounding noise of each
layer input, rounding_noise.py) instead of a second session that captures the layer inputs again, and
calibration's kept float outputs: copies (not views into onnxruntime's arena), in a temporary file for large
models."""
from __future__ import annotations

import numpy as np
import pytest

import qcompiler.passes.quantize.check_accuracy_level as level_check
from qcompiler.onnx_io import model_from_proto, model_to_proto
from qcompiler.quant import quantize
from qcompiler.quant.calibration.calibrate import calibrate
from qcompiler.quant.calibration.rounding_noise import RoundingNoise
from qcompiler.quant.calibration.spill import SpilledOutputs
from qcompiler.quant.runtime import memory
from tests.quant.decoder_models import decoder
from tests.quant.test_weight_only import logits_sqnr, run


def _outlier_rows(rng, shape, cols=()):
    x = rng.standard_normal(shape).astype(np.float32)
    for c in cols:
        x[:, c] *= 30.0        # outlier input channels, as trained decoders have
    return x


@pytest.mark.parametrize("block", [32, 128])
def test_rounding_noise_gives_the_measured_level4_sqnr(block):
    rng = np.random.default_rng(0)
    x = _outlier_rows(rng, (2048, 256), cols=(3, 77, 200))
    w = rng.standard_normal((96, 256)).astype(np.float32) * 0.05
    w[:, 77] *= 6.0
    acc = RoundingNoise(block)
    for i in range(0, len(x), 128):          # one calibration sample at a time, [1, 128, K]
        acc.update(x[None, i:i + 128])
    y = x @ w.T
    measured = level_check.level4_db(x, w, block)
    assert abs(acc.output_db(w, float((y.astype(np.float64) ** 2).mean())) - measured) < 0.5
    assert abs(acc.output_db(w) - measured) < 1.0      # independent channels: no output statistics needed
    more = RoundingNoise(block, max_rows=512)
    for i in range(0, len(x), 128):
        more.update(x[None, i:i + 128])
    assert more.rows == 512


def _levels(model, feeds, from_calibration: bool, monkeypatch):
    got = {}
    decide = level_check._decide

    def record(job, db, lowered):
        got[job.weight] = db
        decide(job, db, lowered)
    monkeypatch.setattr(level_check, "_decide", record)
    if from_calibration:
        def no_capture(*a, **k):
            raise AssertionError("a capture session was built although calibration gathered the noise")
        monkeypatch.setattr(level_check, "rows_session", no_capture)
    else:
        monkeypatch.setattr(level_check, "_from_calibration", lambda ctx, groups, lowered: groups)
    res = quantize(model, feeds, progress=False)
    monkeypatch.undo()
    return res, got


def test_narrow_weights_take_their_level_from_calibration(monkeypatch):
    model, feeds = decoder(head="tied_transpose", seed=3, hidden=128, inter=256, samples=16, seq=16)
    res, stats = _levels(model, feeds, True, monkeypatch)
    _, captured = _levels(model, feeds, False, monkeypatch)
    assert set(stats) == set(captured) == {"layers.0.down_proj.weight", "layers.1.down_proj.weight"}
    for name, db in captured.items():
        assert abs(stats[name] - db) < 0.5, (name, stats[name], db)
    layers = res.report["narrow_float_weights"]["layers"]
    assert all(layers[n]["accuracy_level"] == (4 if stats[n] >= level_check.LEVEL4_MIN_DB else 0) for n in stats)
    assert logits_sqnr(run(model, feeds), run(model_to_proto(res.model), feeds)) > 20


def test_kept_outputs_are_copies_and_spill_to_a_file_alike():
    model, feeds = decoder(head="untied", seed=5, hidden=64, inter=128, samples=6, seq=16)
    ir = model_from_proto(model)
    held = calibrate(ir, feeds, progress=False)
    spilled = calibrate(ir, feeds, progress=False, spill=True)
    assert len(held.kept) == len(spilled.kept) == 4
    for (f1, o1), (f2, o2) in zip(held.kept, spilled.kept):
        assert all(a.base is None for a in o1.values())    # not views into onnxruntime's arena
        assert isinstance(o2, SpilledOutputs) and set(o1) == set(o2) == {"logits"}
        np.testing.assert_array_equal(o1["logits"], o2["logits"])
        np.testing.assert_array_equal(dict(o2)["logits"], o1["logits"])


def test_large_model_report_reads_spilled_outputs(monkeypatch):
    model, feeds = decoder(head="untied", seed=6, hidden=64, inter=128, samples=8, seq=16)
    small = quantize(model, feeds, progress=False)
    monkeypatch.setattr(memory, "PREPACK_MAX_BYTES", 0)   # every model counts as large: outputs spilled
    large = quantize(model, feeds, progress=False)
    assert large.report["output_sqnr_db"] == small.report["output_sqnr_db"]
    assert large.report["sqnr_samples"] == small.report["sqnr_samples"] > 0
