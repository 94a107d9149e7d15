"""Range observers: known answers on synthetic data, streaming, per-channel weights, §6 diagnostics, timing."""

import numpy as np
import pytest

from qcompiler.errors import ConfigError
from qcompiler.quant.core.encoding import compute_encoding, quantize_dequantize
from qcompiler.quant.calibration.observers import make_observer, weight_range

SCHEMES = ["min_max", "tf_enhanced", "percentile", "entropy", "mse"]


def sqnr_db(x, y):
    x, y = x.astype(np.float64), y.astype(np.float64)
    return 10 * np.log10((x ** 2).sum() / ((x - y) ** 2).sum())


def qdq(x, rng, symmetric):
    return quantize_dequantize(x, compute_encoding(*rng, bits=8, symmetric=symmetric))


@pytest.fixture(scope="module")
def gauss_outliers():
    x = np.random.default_rng(0).standard_normal(1_000_000).astype(np.float32)
    x[:10], x[10:20] = 100.0, -100.0
    return x


@pytest.mark.parametrize("symmetric", [False, True])
def test_searches_clip_outliers_and_beat_min_max(gauss_outliers, symmetric):
    x, bulk = gauss_outliers, slice(20, None)
    ranges = {}
    for scheme in SCHEMES:
        # the 20 outliers are 0.002% of the values: beyond the default 99.999th percentile's 0.001% tail
        obs = make_observer(scheme, bits=8, symmetric=symmetric, percentile=99.99)
        obs.update(x)
        ranges[scheme] = obs.range()
    assert ranges["min_max"] == (-100.0, 100.0)
    base = qdq(x, ranges["min_max"], symmetric)
    for scheme in ("tf_enhanced", "mse"):  # their objective is the whole tensor's MSE
        lo, hi = ranges[scheme]
        assert hi < 100.0 and lo > -100.0
        y = qdq(x, ranges[scheme], symmetric)
        assert sqnr_db(x, y) > sqnr_db(x, base) + 0.5, scheme
    for scheme in ("percentile", "entropy"):  # clip to the bulk: far better on the Gaussian part
        lo, hi = ranges[scheme]
        assert 2.5 < hi < 8 and -8 < lo < -2.5, (scheme, lo, hi)
        y = qdq(x, ranges[scheme], symmetric)
        assert sqnr_db(x[bulk], y[bulk]) > sqnr_db(x[bulk], base[bulk]) + 20, scheme


def test_tf_enhanced_and_mse_clip_a_gaussian_tail():
    x = np.random.default_rng(1).standard_normal(400_000).astype(np.float32)
    for scheme in ("tf_enhanced", "mse"):
        obs = make_observer(scheme, bits=4, symmetric=True)
        obs.update(x)
        lo, hi = obs.range()
        assert 1.5 < hi < 3.5 and lo == -hi  # 4-bit optimum for N(0,1) is ~2.5 sigma
        y = quantize_dequantize(x, compute_encoding(lo, hi, 4, True))
        y_mm = quantize_dequantize(x, compute_encoding(x.min(), x.max(), 4, True))
        assert sqnr_db(x, y) > sqnr_db(x, y_mm) + 1.0


@pytest.mark.parametrize("scheme", SCHEMES)
def test_streaming_matches_one_batch(scheme):
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(500_000) * 2 + 0.5).astype(np.float32)
    x[rng.integers(0, x.size, 30)] *= 8
    whole, chunked = make_observer(scheme), make_observer(scheme)
    whole.update(x)
    for chunk in np.array_split(x, 10):  # chunks widen the histogram several times
        chunked.update(chunk)
    a, b = np.array(whole.range()), np.array(chunked.range())
    span = x.max() - x.min()
    assert np.all(np.abs(a - b) < 0.02 * span), (scheme, a, b)
    assert chunked.stats()["count"] == x.size


def test_percentile_one_sided_and_configurable():
    x = np.random.default_rng(3).uniform(0, 10, 1_000_000).astype(np.float32)
    obs = make_observer("percentile", percentile=99.0)
    obs.update(x)
    lo, hi = obs.range()
    # equal-tailed, as onnxruntime: the top 0.5% is cut (the bounded side's 0.5% is not moved to the top)
    assert lo == pytest.approx(x.min()) and hi == pytest.approx(9.95, abs=0.02)


def test_entropy_nonnegative_data_uses_unsigned_levels():
    x = np.abs(np.random.default_rng(4).standard_normal(300_000)).astype(np.float32)
    obs = make_observer("entropy")
    obs.update(x)
    lo, hi = obs.range()
    assert lo == pytest.approx(x.min()) and 2.5 < hi <= x.max()


def test_weight_range_per_channel():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32) * np.linspace(0.1, 2, 16)[:, None, None, None]
    w[3, 0, 0, 0] = 40.0  # one outlier channel
    lo, hi = weight_range(w, 0, "min_max", 8, True)
    np.testing.assert_allclose(hi, w.reshape(16, -1).max(1))
    np.testing.assert_allclose(lo, w.reshape(16, -1).min(1))
    wt = np.moveaxis(w, 0, 1)  # same channels on axis 1
    lo1, hi1 = weight_range(wt, 1, "min_max", 8, False)
    np.testing.assert_allclose(hi1, hi)
    for scheme in ("mse", "tf_enhanced"):
        for symmetric in (True, False):
            bits = 4
            lo_s, hi_s = weight_range(w, 0, scheme, bits, symmetric)
            assert lo_s.shape == hi_s.shape == (16,)
            absmax = np.maximum(np.abs(lo), np.abs(hi))
            if symmetric:
                assert np.all(hi_s <= absmax + 1e-6) and np.all(lo_s == -hi_s)
            else:
                assert np.all(hi_s <= hi + 1e-6) and np.all(lo_s >= lo - 1e-6)
            enc = compute_encoding(lo_s, hi_s, bits, symmetric, axis=0)
            enc_mm = compute_encoding(lo, hi, bits, symmetric, axis=0)
            err = ((quantize_dequantize(w, enc) - w) ** 2).reshape(16, -1).sum(1)
            err_mm = ((quantize_dequantize(w, enc_mm) - w) ** 2).reshape(16, -1).sum(1)
            if scheme == "mse":  # mse picks the per-channel argmin, and factor 1.0 is a candidate
                assert np.all(err <= err_mm * 1.0001)
            assert err.sum() < err_mm.sum()
    lo_p, hi_p = weight_range(w, 0, "percentile", 8, True)
    # 72 values per channel: the 0.001% tail holds no whole value, so the outlier is kept (nearest rank)
    assert hi_p[3] == 40.0 and lo_p.shape == (16,)
    lo_e, hi_e = weight_range(w[:4], 0, "entropy", 8, True)
    assert lo_e.shape == (4,)


def test_mask_case_is_flagged():
    rng = np.random.default_rng(6)
    scores = (rng.standard_normal((2, 4, 64, 64)) * 4).astype(np.float32)
    masked = scores.copy()
    masked[..., 56:] = np.finfo(np.float32).min  # 12.5% of the keys are padding
    obs = make_observer("min_max")
    obs.update(masked)
    st = obs.stats()
    assert st["bulk_ratio"] > 1e30 and st["magnitude_gap"] > 1e30
    assert st["zero_bin_fraction_nonzero"] > 0.85  # the scores all collapse onto 0
    assert np.isfinite(st["mean_abs"])
    rare = scores.reshape(-1).copy()
    rare[:5] = np.finfo(np.float32).min  # a rare outlier: the p99.9 ratio catches it
    obs = make_observer("tf_enhanced")
    obs.update(rare)
    st = obs.stats()
    assert st["outlier_ratio"] > 1e30
    plain = make_observer("min_max")
    plain.update(scores)
    st = plain.stats()
    assert st["outlier_ratio"] < 3 and st["bulk_ratio"] < 30 and st["magnitude_gap"] < 2
    assert st["zero_bin_fraction"] < 0.05 and st["p999_steps"] > 50


@pytest.mark.parametrize("scheme", SCHEMES)
def test_degenerate_inputs(scheme):
    obs = make_observer(scheme)
    obs.update(np.zeros((0, 3), np.float32))
    assert obs.range() == (0.0, 0.0) and obs.stats()["count"] == 0
    obs.update(np.full((100,), 3.0, np.float32))
    assert obs.range() == (3.0, 3.0)
    obs.update(np.array([np.nan, np.inf, -np.inf, 1.0], np.float32))
    lo, hi = obs.range()
    assert (lo, hi) == (1.0, 3.0) or (1.0 <= lo <= hi <= 3.0)
    st = obs.stats()
    assert st["nonfinite"] == 3 and st["count"] == 101
    assert all(np.isfinite(v) for k, v in st.items() if isinstance(v, float) and k != "outlier_ratio")
    zeros = make_observer(scheme, symmetric=True)
    zeros.update(np.zeros((4, 4), np.float32))
    assert zeros.range() == (0.0, 0.0)
    compute_encoding(*zeros.range(), symmetric=True)  # still a valid grid
    allnan = make_observer(scheme)
    allnan.update(np.full(5, np.nan))
    assert allnan.range() == (0.0, 0.0) and allnan.stats()["nonfinite"] == 5
    ints = make_observer(scheme)
    ints.update(np.arange(10))
    assert ints.range()[1] <= 9


def test_unknown_scheme_and_alias():
    assert make_observer("post_training_tf").scheme == "min_max"
    with pytest.raises(ConfigError, match="unknown scheme 'bogus'"):
        make_observer("bogus")

