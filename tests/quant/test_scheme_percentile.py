"""The percentile scheme against its definition: onnxruntime's equal-tailed interval, cut at whole
values only, and never by less than half a grid step.

Each family here is one the old rule clipped where it should not:
- a ReLU output (exact zeros plus an exponential tail): the old rule moved the bounded low end's (100 - p)/2 % to
  the top and so cut the top twice as deep as onnxruntime does (e.g. ppocr_cls's ReLU and HardSwish outputs);
- a weight channel or a small tensor whose (100 - p)% tail holds less than one value: the old rule interpolated a
  fraction of the way from the max to the next value (np.percentile / inside the top histogram bin), changing the
  scale by ~1e-4, which clips nothing and only re-draws the rounding noise (ppocr_cls: 4 of 400 images flipped);
- a HardSwish output's bounded low end (a pile-up at -0.375): the old rule cut it by far less than a grid step.
"""
import contextlib
import io

import numpy as np
import pytest

from qcompiler.quant.calibration.observers import make_observer, weight_range


def _fill(x, percentile, symmetric=False, bits=8):
    obs = make_observer("percentile", bits=bits, symmetric=symmetric, percentile=percentile)
    for part in np.array_split(x, 4):   # streaming: the histogram widens between batches
        obs.update(part)
    return obs.range()


def _relu_like(zeros, n=400_000, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.exponential(1.0, n)
    x[rng.random(n) < zeros] = 0.0
    return x.astype(np.float32)


def _ort_percentile(x, percentile, symmetric):
    """onnxruntime's own HistogramCollector on the same batches (its threshold is a bin edge of 2048 bins)."""
    from onnxruntime.quantization.calibrate import HistogramCollector
    col = HistogramCollector("percentile", symmetric, 2048, 128, percentile, "same")
    with contextlib.redirect_stdout(io.StringIO()):
        col.collect({"t": [x]})
        lo, hi = col.compute_collection_result()["t"][:2]
    return float(lo), float(hi)


@pytest.mark.parametrize("zeros", [0.0, 0.3, 0.7])
def test_relu_output_top_is_cut_at_onnxruntimes_equal_tail(zeros):
    x = _relu_like(zeros)
    p = 99.9
    lo, hi = _fill(x, p)
    assert lo == float(x.min())                                 # 0, or the least value when there are no zeros
    want = float(np.quantile(x, 1 - (100 - p) / 200))          # the top 0.05%, zeros counted as values
    assert hi == pytest.approx(want, rel=0.01)
    ort_lo, ort_hi = _ort_percentile(x, p, symmetric=False)
    width = 2 * float(x.max()) / 2048                           # onnxruntime's bins over [-max, max]
    assert abs(hi - ort_hi) <= 2 * width, (hi, ort_hi)
    # the old rule cut the top 0.1% (the low end's share moved up): ln 2 lower on an exponential tail
    assert hi > float(np.quantile(x, 1 - (100 - p) / 100)) + 0.5


@pytest.mark.parametrize("n", [9, 27, 72, 1000, 20_000])
def test_a_tail_of_less_than_one_value_is_not_cut(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    x[0] = 8.0                                                  # an outlier too: 1 value > n * 0.0005%
    assert _fill(x, 99.999) == (float(x.min()), float(x.max()))
    assert _fill(x, 99.999, symmetric=True) == (float(x.min()), 8.0)
    # per-channel weights: the same rule, channel by channel
    w = np.stack([x, -x, 0.5 * x])
    for symmetric in (False, True):
        lo, hi = weight_range(w, 0, "percentile", 8, symmetric)
        absmax = np.abs(w).max(axis=1)
        if symmetric:
            np.testing.assert_array_equal(hi, absmax)
        else:
            np.testing.assert_array_equal(hi, w.max(axis=1))
            np.testing.assert_array_equal(lo, w.min(axis=1))


def test_weight_cut_is_nearest_rank():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 1000)) * 0.05
    w[:, :5] = 2.0 + np.arange(5)                               # 5 far outliers per channel
    lo, hi = weight_range(w, 0, "percentile", 8, False, percentile=99.0)   # k = 1000 * 0.5% = 5 values per end
    s = np.sort(w, axis=1)
    np.testing.assert_array_equal(hi, s[:, -6])                 # the 6th largest: exactly a value, no interpolation
    np.testing.assert_array_equal(lo, s[:, 5])


def test_bounded_low_end_of_a_hardswish_is_not_cut():
    rng = np.random.default_rng(2)
    v = rng.standard_normal(1_000_000) * 3
    x = (v * np.clip(v + 3, 0, 6) / 6).astype(np.float32)      # HardSwish: a pile-up at its minimum -0.375
    lo, hi = _fill(x, 99.99)
    assert lo == float(x.min())                                 # the cut there is far below half a grid step
    assert hi == pytest.approx(float(np.quantile(x, 1 - 0.00005)), rel=0.01)


def test_a_cut_shorter_than_half_a_step_is_not_made():
    # 100k values, the top 5 of them just above the bulk: at 99.99 five values are cut, by less than half a step
    rng = np.random.default_rng(3)
    x = rng.uniform(0, 1, 100_000)
    x[:5] = 1.0 + np.linspace(0.0005, 0.001, 5)
    lo, hi = _fill(x.astype(np.float32), 99.99)
    assert hi == float(np.float32(x.max()))
    x[:5] = 2.0                                                 # now the cut is worth it
    lo, hi = _fill(x.astype(np.float32), 99.99)
    assert hi == pytest.approx(1.0, abs=0.002)
