"""Each calibration scheme's range on known distributions against the textbook answer.

Analytic optima are computed here for the grid the observers use (symmetric, 2^(bits-1) - 1 steps per side):
expected squared error(a) = gamma * E[(|x| - a)^2; |x| > a] + P(|x| <= a) * s^2 / 12 with s = a / (2^(bits-1) - 1).
gamma = 1 is the MSE optimum of Banner, Nahshan & Soudry, "Post training 4-bit quantization of convolutional
networks for rapid-deployment" (NeurIPS 2019, ACIQ), who give 9.89 b for Laplace(b) and 3.92 sigma for a Gaussian
at 8 bits (their 2^M-level grid; ours with 2^M - 1 levels gives 9.88 b and 3.92 sigma, checked below).
gamma = 3 is AIMET's tf_enhanced cost (GAMMA = 3 in TfEnhancedEncodingAnalyzer.h). The percentile is
onnxruntime's: the p-th percentile of |x| when symmetric, (100 - p)/2 % cut from each end otherwise.
`exact_optimal_clip` integrates the true rounding error (x - s*round(x/s))^2 on the signed grid [-(q+1)s, q*s]
the observers use, instead of s^2/12: at 4 bits on a Laplace the two differ by 5%, and on a ReLU output the exact
zeros, which sit on the grid, cost nothing.
"""
import math

import numpy as np
import pytest

from qcompiler.quant.calibration.observers import make_observer

N = 2_000_000


def _fill(scheme, x, bits=8, symmetric=True, **opts):
    obs = make_observer(scheme, bits=bits, symmetric=symmetric, **opts)
    for part in np.array_split(x, 4):   # streaming: the histogram widens between batches
        obs.update(part)
    return obs.range()


def _gauss_tail(a):
    q = np.array([0.5 * math.erfc(t / math.sqrt(2)) for t in a])   # P(x > a)
    phi = np.exp(-a * a / 2) / math.sqrt(2 * math.pi)
    return 2 * ((1 + a * a) * q - a * phi), 2 * q                   # E[(|x|-a)^2; |x|>a], P(|x| > a)


def _laplace_tail(a):
    return 2 * np.exp(-a), np.exp(-a)


def optimal_clip(tail, bits, gamma=1.0, levels=None):
    """argmin over a of gamma * clip error + P(in range) * s^2/12 for a unit distribution with `tail`."""
    a = np.linspace(0.5, 16, 31_001)
    clip, p_out = tail(a)
    s = a / (2 ** (bits - 1) - 1) if levels is None else 2 * a / levels
    return float(a[np.argmin(gamma * clip + (1 - p_out) * s * s / 12)])


def exact_optimal_clip(pdf, bits, gamma=1.0, zeros=0.0, tmax=16.0):
    """argmin over t of gamma * saturation error + exact rounding error on the grid [-(q+1)s, q*s], s = t/q, for a
    density `pdf` (plus a point mass `zeros` at 0, which rounds exactly)."""
    x = np.linspace(-1.5 * tmax, 1.5 * tmax, 24_001)
    w = pdf(x) * (x[1] - x[0]) * (1.0 - zeros)
    q = 2 ** (bits - 1) - 1

    def best(t):
        s = t[:, None] / q
        c = np.clip(x[None, :], -(q + 1) * s, q * s)
        err = np.where(c != x, gamma * (x - c) ** 2, (x - s * np.round(x / s)) ** 2) @ w
        return float(t[int(np.argmin(err))])
    t = best(np.linspace(0.3, tmax, 158))                 # 0.1 apart, then 0.002 apart around the best
    return best(np.linspace(t - 0.1, t + 0.1, 101))


def _laplace_pdf(x):
    return 0.5 * np.exp(-np.abs(x))


def _gauss_pdf(x):
    return np.exp(-x * x / 2) / math.sqrt(2 * math.pi)


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    return {"gauss": rng.standard_normal(N).astype(np.float32),
            "laplace": rng.laplace(0.0, 1.0, N).astype(np.float32)}


def test_analytic_optima_match_banner_et_al():
    # their 2^M-level grid reproduces the published figures; ours (2^M - 1 levels) is within 0.2%
    assert optimal_clip(_laplace_tail, 8, levels=256) == pytest.approx(9.89, abs=0.01)
    assert optimal_clip(_gauss_tail, 8, levels=256) == pytest.approx(3.92, abs=0.01)
    assert optimal_clip(_laplace_tail, 4, levels=16) == pytest.approx(5.03, abs=0.01)
    assert optimal_clip(_gauss_tail, 4, levels=16) == pytest.approx(2.55, abs=0.02)
    assert optimal_clip(_laplace_tail, 8) == pytest.approx(9.89, rel=2e-3)
    assert optimal_clip(_gauss_tail, 8) == pytest.approx(3.92, rel=2e-3)


def test_min_max_is_the_extremes(data):
    for x in data.values():
        assert _fill("min_max", x, symmetric=False) == (float(x.min()), float(x.max()))


@pytest.mark.parametrize("dist", ["gauss", "laplace"])
@pytest.mark.parametrize("bits", [8, 4])
def test_mse_is_the_mse_optimal_clip(data, dist, bits):
    tail = _gauss_tail if dist == "gauss" else _laplace_tail
    lo, hi = _fill("mse", data[dist], bits=bits)
    assert lo == -hi
    # the search grid and 2M samples leave a few percent (the MSE curve is flat near its minimum)
    assert hi == pytest.approx(optimal_clip(tail, bits), rel=0.06), (dist, bits, hi)


@pytest.mark.parametrize("dist", ["gauss", "laplace"])
@pytest.mark.parametrize("bits", [8, 4])
def test_tf_enhanced_is_aimets_optimum(data, dist, bits):
    tail = _gauss_tail if dist == "gauss" else _laplace_tail
    pdf = _gauss_pdf if dist == "gauss" else _laplace_pdf
    lo, hi = _fill("tf_enhanced", data[dist], bits=bits)
    assert lo == -hi
    assert hi == pytest.approx(exact_optimal_clip(pdf, bits, gamma=3.0), rel=0.02), (dist, bits, hi)
    assert hi == pytest.approx(optimal_clip(tail, bits, gamma=3.0), rel=0.05), (dist, bits, hi)
    # saturation weighted 3x: tf_enhanced keeps more of the tail than mse
    assert hi > optimal_clip(tail, bits)
    assert hi > _fill("mse", data[dist], bits=bits)[1]


@pytest.mark.parametrize("dist", ["gauss", "laplace"])
@pytest.mark.parametrize("bits", [8, 4])
def test_mse_is_the_exact_mse_optimum(data, dist, bits):
    pdf = _gauss_pdf if dist == "gauss" else _laplace_pdf
    hi = _fill("mse", data[dist], bits=bits)[1]
    assert hi == pytest.approx(exact_optimal_clip(pdf, bits), rel=0.02), (dist, bits, hi)


@pytest.mark.parametrize("scheme, gamma", [("mse", 1.0), ("tf_enhanced", 3.0)])
def test_exact_zeros_cost_no_rounding_noise(scheme, gamma):
    # a ReLU output: 70% exact zeros, the rest half-Laplace. The zeros sit on the grid and cost nothing, so the
    # optimum is the one of the non-zero part alone; charging them s^2/12 each (the old tf_enhanced) made the
    # rounding term 3x too large and clipped the tail to ~80% of this
    rng = np.random.default_rng(2)
    x = np.where(rng.random(N) < 0.7, 0.0, np.abs(rng.laplace(0.0, 1.0, N))).astype(np.float32)
    lo, hi = _fill(scheme, x, symmetric=False)
    # unsigned grid over [0, t]: 255 steps; its optimum is the signed 9-bit grid's for |x| (q = 255)
    want = exact_optimal_clip(_laplace_pdf, 9, gamma=gamma)
    assert lo == 0.0 and hi == pytest.approx(want, rel=0.03), (scheme, hi, want)


@pytest.mark.parametrize("dist", ["gauss", "laplace"])
def test_percentile_is_the_quantile(data, dist):
    x = data[dist]
    analytic = {"gauss": math.sqrt(2) * _erfcinv(1e-5), "laplace": math.log(1e5)}[dist]   # P(|x| > t) = 1e-5
    lo, hi = _fill("percentile", x)                      # default 99.999, symmetric: percentile of |x|
    assert lo == -hi
    assert hi == pytest.approx(np.quantile(np.abs(x), 0.99999), rel=0.01)
    assert hi == pytest.approx(analytic, rel=0.03)       # 20 samples beyond: the sample quantile wanders ~1.5%
    lo, hi = _fill("percentile", x, symmetric=False, percentile=99.9)    # 0.05% cut from each end
    assert hi == pytest.approx(np.quantile(x, 0.9995), rel=0.01)
    assert lo == pytest.approx(np.quantile(x, 0.0005), rel=0.01)
    assert hi == pytest.approx({"gauss": 3.2905, "laplace": math.log(1000)}[dist], rel=0.02)


def test_entropy_keeps_at_least_the_99_999th_percentile(data):
    # KL has no closed form; entropy_threshold searches from the 99.999th percentile of |x| up, and at 8 bits KL
    # keeps more of a smooth tail than the MSE optimum
    for dist, x in data.items():
        lo, hi = _fill("entropy", x)
        assert lo == -hi
        assert np.quantile(np.abs(x), 0.99999) * 0.99 <= hi <= np.abs(x).max()
        assert hi > _fill("mse", x)[1]


def test_uniform_with_outliers():
    rng = np.random.default_rng(1)
    x = rng.uniform(-1.0, 1.0, N).astype(np.float32)
    outliers = np.array([20.0, -20.0, 19.0])
    x[[5, 50_000, 900_000]] = outliers                 # 1.5e-6 of the values, 20x out
    assert _fill("min_max", x, symmetric=False) == (-20.0, 20.0)
    # the quantiles and KL cut the outliers and keep the uniform bulk whole
    for scheme in ("percentile", "entropy"):
        lo, hi = _fill(scheme, x)
        assert 0.98 <= hi <= 1.08 and lo == -hi, (scheme, hi)   # within a few 0.02-wide bins
    # mse / tf_enhanced: the exact optimum of gamma * sum (|o| - t)^2 over the outliers + the bulk's rounding
    # noise (and its own clipping below t = 1); with 2M values the bulk's noise keeps t well above 1
    t = np.linspace(0.5, 20, 39_001)
    clip_out = (np.maximum(np.abs(outliers)[None, :] - t[:, None], 0) ** 2).sum(1)
    bulk = N * np.where(t < 1, (1 - t) ** 3 / 3, 0.0)                 # E[(|x| - t)^2; |x| > t] for U(-1, 1)
    noise = N * np.minimum(t, 1.0) * (t / 127) ** 2 / 12
    for scheme, gamma in (("mse", 1.0), ("tf_enhanced", 3.0)):
        want = float(t[np.argmin(gamma * (clip_out + bulk) + noise)])
        lo, hi = _fill(scheme, x)
        assert hi == pytest.approx(want, rel=0.08) and lo == -hi, (scheme, hi, want)


def _erfcinv(y):
    lo, hi = 0.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.erfc(mid) > y else (lo, mid)
    return (lo + hi) / 2
