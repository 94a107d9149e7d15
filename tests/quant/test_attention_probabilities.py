"""Softmax outputs on their fixed [0, 1] grid are checked like any observed activation: attention over many keys
puts most probabilities near 1/L, one or two steps of an 8-bit grid, and a decoder's every layer adds that
error to the logits. Such outputs leave the 8-bit grid (widened, then float where no integer kernel reads them);
over a few keys the probabilities span the grid and stay 8-bit."""
from __future__ import annotations

import numpy as np

from qcompiler.onnx_io import model_to_proto
from qcompiler.quant import quantize
from qcompiler.quant.placement import widening
from qcompiler.sqnr import sqnr_db
from tests.quant.decoder_models import decoder
from tests.quant.test_weight_only import logits_sqnr, run


def _probs(report) -> dict:
    return {k: v for k, v in report["left_float"].items() if k.endswith("_probs")}


def test_long_attention_probabilities_leave_the_8bit_grid(monkeypatch):
    model, feeds = decoder(head="untied", seed=4, hidden=64, inter=128, layers=2, samples=8, seq=128)
    ref = run(model, feeds)
    res = quantize(model, feeds, progress=False)
    probs = _probs(res.report)
    assert set(probs) == {"layers.0_probs", "layers.1_probs"}
    assert all("Softmax output" in why and "fixed range" in why for why in probs.values()), probs
    with_rule = logits_sqnr(ref, run(model_to_proto(res.model), feeds))
    assert abs(with_rule - res.report["output_sqnr_db"]["logits"]) < 0.1   # the report measures what ORT runs

    monkeypatch.setattr(widening, "_widen_fixed", lambda *a, **k: None)   # the 8-bit [0, 1] grid as before
    res8 = quantize(model, feeds, progress=False)
    assert not _probs(res8.report)
    on_grid = logits_sqnr(ref, run(model_to_proto(res8.model), feeds))
    assert with_rule > on_grid + 1.0, (with_rule, on_grid)


def test_short_attention_keeps_the_8bit_softmax_output():
    model, feeds = decoder(head="untied", seed=4, hidden=64, inter=128, layers=2, samples=8, seq=12)
    res = quantize(model, feeds, progress=False)
    assert not _probs(res.report)
    assert {"layers.0_probs", "layers.1_probs"} <= set(res.report["quantized_activations"])
    assert logits_sqnr(run(model, feeds), run(model_to_proto(res.model), feeds)) > 20


def test_fixed_grid_estimate_tracks_the_rounding_it_predicts():
    rng = np.random.default_rng(0)
    for keys, spread in ((128, 1.0), (128, 4.0), (16, 1.0)):
        s = rng.standard_normal((64, keys)) * spread
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p = (p / p.sum(axis=1, keepdims=True)).astype(np.float32)
        q = np.clip(np.rint(p * 255), 0, 255) / 255          # the uint8 grid over [0, 1]
        st = {"count": p.size, "mean_sq": float((p.astype(np.float64) ** 2).mean()), "min": float(p.min()),
              "max": float(p.max())}
        est, got = widening.fixed_grid_sqnr_db(st, 0.0, 1.0), sqnr_db(p, q)
        # uniform rounding noise: close for spread-out probabilities; for peaked ones (most under half a step,
        # rounded to 0 with less than s²/12 of error) it errs low, towards leaving the grid
        assert est <= got + 0.5, (keys, spread, est, got)
        if spread == 1.0:
            assert got - est < 1.5, (keys, spread, est, got)
        # the same estimate from a histogram observer's 8-bit figure (no mean_sq)
        st2 = dict(st, sqnr8_db=10 * np.log10(st["mean_sq"] * 12 / widening.min_max_step(st, 8) ** 2))
        del st2["mean_sq"]
        assert abs(widening.fixed_grid_sqnr_db(st2, 0.0, 1.0) - est) < 1e-6
