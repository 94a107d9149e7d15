"""Entropy (KL) calibration: the vectorised search against the textbook loop, and thresholds on known data."""
import time

import numpy as np
import pytest

from qcompiler.quant.calibration.observers import _kl_divergences, make_observer, weight_range


def _textbook_kl(n, i, levels):
    """TensorRT's loop for one candidate: P = n[:i] with the outliers in its last bin, Q = n[:i] merged into
    `levels` chunks and spread over each chunk's non-empty bins (and over a last bin holding only outliers)."""
    p = n[:i].astype(np.float64).copy()
    p[-1] += n[i:].sum()
    clipped = n[:i].astype(np.float64)
    starts = (np.arange(levels + 1) * i) // levels
    nonzero = clipped > 0
    nonzero[-1] |= p[-1] > 0
    q = np.zeros(i)
    for j in range(levels):
        seg = clipped[starts[j]:starts[j + 1]]
        nz = nonzero[starts[j]:starts[j + 1]]
        if nz.any():
            q[starts[j]:starts[j + 1]][nz] = seg.sum() / nz.sum()
    p, q = p / p.sum(), q / q.sum()
    m = p > 0
    q = np.where(q > 0, q, 1e-4)  # an outliers-only last bin: onnxruntime's smoothing epsilon
    return float(np.sum(p[m] * np.log(p[m] / q[m])))


def _fill(scheme, data, bits=8, symmetric=False, batches=4):
    obs = make_observer(scheme, bits, symmetric)
    for part in np.array_split(data, batches):
        obs.update(part)
    return obs


def test_vectorised_kl_matches_textbook_loop():
    rng = np.random.default_rng(0)
    for levels in (16, 31):
        n = rng.integers(1, 100, size=300).astype(np.float64)
        n[rng.integers(0, 300, 40)] = 0  # empty bins, also as the last kept one
        n[250:280] = 0
        cands = np.arange(levels, 301)
        got = _kl_divergences(n, cands, levels)
        want = np.array([_textbook_kl(n, int(i), levels) for i in cands])
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
        assert int(cands[np.argmin(got)]) == int(cands[np.argmin(want)])


def test_gaussian_with_far_outliers_clips_the_outliers_near_the_textbook_threshold():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(600_000).astype(np.float32)
    x[[10, 20_000, 300_000]] = [60.0, -55.0, 58.0]  # 3 far outliers (5e-6 of the values)
    obs = _fill("entropy", x, symmetric=True)
    lo, hi = obs.range()
    assert lo == -hi
    # brute force over every candidate with the textbook loop on the same folded histogram
    h = obs.histogram
    w = h.width
    nf = int(np.ceil(60.0 / w - 1e-9))
    folded = np.bincount(np.minimum((np.abs(h.centers) / w).astype(np.intp), nf - 1), h.counts, minlength=nf)
    # the search starts at the 99.999th percentile of |x| (~4.4 sigma: the 3 outliers are below 0.001%); the
    # textbook loop over the same candidates must pick the same bin, far below the outliers
    q = float(np.quantile(np.abs(x), 0.99999))
    cands = list(range(int(np.ceil(q / w)) - 2, nf + 1))
    kls = [_textbook_kl(folded, i, 128) for i in cands]
    t_ref = cands[int(np.argmin(kls))] * w
    assert 4.0 < t_ref < 9.0
    assert hi == pytest.approx(t_ref, abs=3 * w)
    assert 4.0 < hi < 9.0  # min_max would span the outliers at ~60


def test_relu_output_is_not_clipped_into_its_bulk():
    rng = np.random.default_rng(2)
    x = np.abs(rng.standard_normal(400_000)).astype(np.float32)
    x[rng.random(x.size) < 0.5] = 0.0  # half exact zeros: the ReLU spike
    x[:40] = rng.uniform(5.0, 7.0, 40)   # a thin tail (1e-4 of the values)
    lo, hi = _fill("entropy", x).range()
    assert lo == 0.0
    assert hi >= np.quantile(x, 0.99999) - 0.05  # clips at most ~0.001% of the values
    assert np.mean(x > hi) <= 2e-5
    assert hi >= 0.5 * x.max()  # not a small fraction of the range (was ~22% before the fix)


def test_jagged_spiky_relu_keeps_its_range():
    """A ReLU over zero padding: huge spikes at a few values make the KL curve jagged; the range must not drop."""
    rng = np.random.default_rng(3)
    bulk = rng.exponential(0.8, 300_000)
    spikes = np.repeat([0.0, 0.0052, 0.047], [80_000, 70_000, 68_000])
    x = np.concatenate([bulk, spikes]).astype(np.float32)
    rng.shuffle(x)
    lo, hi = _fill("entropy", x).range()
    assert np.mean(x > hi) <= 2e-5


def test_sixteen_bits_keep_the_full_range_and_range_takes_a_width():
    rng = np.random.default_rng(4)
    x = rng.standard_normal(100_000).astype(np.float32)
    x[0] = 40.0
    obs16 = _fill("entropy", x, bits=16, symmetric=True)
    assert obs16.range() == (-40.0, 40.0) or obs16.range()[1] == pytest.approx(40.0)
    obs8 = _fill("entropy", x, bits=8, symmetric=True)
    assert obs8.range()[1] < 10.0
    assert obs8.range(16)[1] == pytest.approx(40.0)  # a value widened after calibration re-searches
    assert obs8.range()[1] < 10.0  # and the observer's own width is left alone


def test_entropy_weights_keep_min_max_and_search_is_fast():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((64, 3, 3, 3))
    w[3, 0, 0, 0] = 30.0
    lo, hi = weight_range(w, 0, "entropy", 8, True)
    lo_mm, hi_mm = weight_range(w, 0, "min_max", 8, True)
    np.testing.assert_array_equal(lo, lo_mm)
    np.testing.assert_array_equal(hi, hi_mm)
    x = rng.standard_normal(200_000).astype(np.float32)
    obs = _fill("entropy", x, symmetric=False)
    t0 = time.perf_counter()
    for _ in range(10):
        obs.range()
    assert (time.perf_counter() - t0) / 10 < 0.25  # all candidates at once (the old loop: ~20 ms x 256)
