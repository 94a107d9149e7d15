"""Range observers: streaming calibration statistics that choose a clipping range [min, max] per tensor.

Every observer reduces each batch as it arrives (min, max, counts, a magnitude histogram and, for the searching
schemes, a 2048-bin linear histogram), so memory is O(bins) however much data flows through. Schemes:

- `min_max`: the observed min and max (names and aliases: schemes.py).
- `tf_enhanced` (AIMET's): the [a, b] minimising AIMET's cost, saturation weighted 3x (its GAMMA) against rounding:
  3 * (sum_{x<a} (x-a)^2 + sum_{x>b} (x-b)^2) + sum_{a<=x<=b} (x - qdq(x))^2, both integrated exactly per histogram
  bin on the candidate's grid (the `mse` search with the saturation part weighed 3x).
- `percentile` (onnxruntime's): the equal-tailed interval holding `percentile`% of the values (default 99.999,
  onnxruntime's default): (100 - p)/2 % cut from each end; symmetric: the p-th percentile of |x|. A tail of less
  than one value, or a cut shorter than half a grid step, is not made (`resolved_clip`).
- `entropy`: TensorRT's KL-divergence threshold on the |x| histogram (exact zeros left out, every candidate scored
  at once), applied to both sides; it clips at most 0.001% of the values unless they form a far outlier cluster.
  Weights keep min/max, as in TensorRT and onnxruntime.
- `mse`: the candidate range minimising the mean squared error between x and its fake-quantized value, using the
  same grid math as `compute_encoding` / `quantize_dequantize`, integrated exactly per histogram bin; candidates
  coarse (5% of the range apart) then refined around the best (`_coarse_to_fine`).

`stats()` carries field notes §6 diagnostics (see `RangeObserver.stats`). Non-finite inputs are dropped and
counted; empty batches are ignored; a constant tensor gives min == max (compute_encoding widens it to hold 0).
`weight_range` does the per-channel version for weights.
"""
from __future__ import annotations

import warnings

import numpy as np

from qcompiler.errors import ConfigError
from qcompiler.quant.calibration.histogram import LinearHistogram, MagnitudeHistogram
from qcompiler.quant.core.encoding import compute_encoding
from qcompiler.quant.core.schemes import canonical_scheme

TF_ENHANCED_GAMMA = 3.0   # AIMET's GAMMA: tf_enhanced weighs saturation error 3x rounding error
# Shrink factors for the mse / tf_enhanced searches (then refined around the best): linear near 1 plus geometric
# down to 1e-3, so a Gaussian bulk with outliers 100x out still has candidates near its 4-sigma point.
_MSE_FACTORS = np.unique(np.concatenate([np.linspace(0.05, 1.0, 20), np.geomspace(1e-3, 1.0, 20)]))

# searching schemes bin about this many values per batch into the magnitude histogram (RangeObserver.update)
MAGNITUDE_SAMPLE = 1 << 13
# batches smaller than this are kept and binned together (RangeObserver.update)
SMALL_BATCH = 1 << 12

DEFAULT_PERCENTILE = 99.999   # onnxruntime's default for CalibrationMethod.Percentile

# The report warns when a scheme's grid leaves out more than this share of a value's observed range
# (calibrate.clipped_fractions / clip_warnings).
CLIP_WARN_FRACTION = 0.5


def finite_flat(x, int_dtype=np.float64):
    """(finite values as a flat float array, their min, their max, how many non-finite were dropped).

    min/max come from one pass; NaN propagates through them, so the finite filter runs only when needed.
    Integers are cast to `int_dtype`. Empty input gives (empty, 0.0, 0.0, 0).
    """
    x = np.asarray(x).reshape(-1)
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(int_dtype)
    if x.size == 0:
        return x, 0.0, 0.0, 0
    lo, hi = x.min(), x.max()
    bad = 0
    if not (np.isfinite(lo) and np.isfinite(hi)):
        finite = np.isfinite(x)
        bad = int(x.size - np.count_nonzero(finite))
        x = x[finite]
        if x.size == 0:
            return x, 0.0, 0.0, bad
        lo, hi = x.min(), x.max()
    return x, float(lo), float(hi), bad


class RangeObserver:
    """min_max observer and base class: running min/max/count/|x| sum plus a float32 magnitude histogram."""

    scheme = "min_max"
    uses_histogram = False

    def __init__(self, bits: int = 8, symmetric: bool = False, bins: int = 2048):
        self.bits = int(bits)
        self.symmetric = bool(symmetric)
        self.min = np.inf
        self.max = -np.inf
        self.count = 0
        self.nonfinite = 0
        self.abs_sum = 0.0
        self.magnitudes = MagnitudeHistogram()
        self.histogram = LinearHistogram(bins) if self.uses_histogram else None
        self.keep_extremes = False   # set by calibrate for graph outputs and what feeds them (output_adjacent)
        self._small: list = []       # small batches not yet binned (see update)
        self._small_size = 0

    def update(self, x) -> None:
        """Reduce one batch (any shape) into the statistics; NaN/inf are dropped and counted in `nonfinite`."""
        x, lo, hi, bad = finite_flat(x, np.float64)
        self.nonfinite += bad
        if x.size == 0:
            return
        self.min, self.max = min(self.min, lo), max(self.max, hi)
        self.count += int(x.size)
        self.abs_sum += float(np.abs(x).sum(dtype=np.float64))  # float64: a -3.4e38 mask overflows float32
        if x.size < SMALL_BATCH:
            # NOTE: binning costs ~30 us per call whatever the size (two bincounts of 2048/4096 bins): the 1x1
            # squeeze-excite tensors of ppocr_cls made half of its 7000 calls. Small batches are binned together.
            self._small.append(x)
            self._small_size += x.size
            if self._small_size >= SMALL_BATCH:
                self._flush()
            return
        self._bin(x, lo, hi)

    def _flush(self) -> None:
        """Bin the small batches kept by `update` (called before anything reads the histograms)."""
        if not self._small:
            return
        x = np.concatenate(self._small) if len(self._small) > 1 else self._small[0]
        self._small, self._small_size = [], 0
        self._bin(x, float(x.min()), float(x.max()))

    def _bin(self, x, lo: float, hi: float) -> None:
        if self.histogram is not None and x.size > 2 * MAGNITUDE_SAMPLE:
            # NOTE: the magnitude histogram only feeds stats() (field notes §6 diagnostics, widening); a searching
            # scheme already bins every value into its linear histogram, and binning each value twice cost
            # ppocr_cls 3.5x min_max's calibration time. Every k-th value, counted k times, keeps the quantiles.
            k = x.size // MAGNITUDE_SAMPLE
            self.magnitudes.update(x[::k], weight=k)
        else:
            self.magnitudes.update(x)
        if self.histogram is not None:
            self.histogram.update(x, lo, hi)

    def range(self, bits: int | None = None) -> tuple[float, float]:
        """The chosen clipping range (min, max); (0.0, 0.0) before any finite value was seen.

        `bits` overrides the observer's width for this one search (a value widened to 16 bits after calibration
        must not keep the clipping chosen for an 8-bit grid).
        """
        if self.count == 0:
            return 0.0, 0.0
        self._flush()
        if self.max <= self.min or self.keep_extremes:
            return float(self.min), float(self.max)
        saved, self.bits = self.bits, int(bits or self.bits)
        try:
            lo, hi = self._choose_range()
        finally:
            self.bits = saved
        return float(max(lo, self.min)), float(min(hi, self.max))

    def _choose_range(self) -> tuple[float, float]:
        return self.min, self.max

    def stats(self) -> dict:
        """Observed statistics and field notes §6 diagnostics (no range search: cheap to call).

        - `min`, `max`, `count` (finite values), `nonfinite` (NaN/inf dropped), `mean_abs`.
        - `abs_p999`: 99.9th percentile of |x|; `abs_median_nonzero`: median of |x| over values with
          |x| >= 2^-126 (both from the magnitude histogram: 8 bins per octave, within ~9%).
        - `outlier_ratio` = max(|min|, |max|) / abs_p999: how far the extreme sits beyond the top 0.1% of the
          bulk (1.0 if everything is 0, inf if only a rare value is non-zero). Catches rare outliers.
        - `bulk_ratio` = max(|min|, |max|) / abs_median_nonzero: catches outliers that are too common for
          abs_p999 (an attention mask of -3.4e38 on 1-50% of the positions over scores ~10 gives ~1e37).
          Under the min_max 8-bit grid the typical non-zero value spans about 127 / bulk_ratio steps.
        - `magnitude_gap`: the largest ratio between consecutive occupied |x| bins above the 1% quantile of the
          non-zero |x|; far above ~2 means separate clusters (mask and scores; pixel coordinates and scores)
          or isolated outliers, whatever their mass.
        - `range_ratio` = (max - min) / (q99.9 - q0.1): the full range over the central 99.8% of the values.
        - `zero_bin_fraction`: fraction of values with |x| <= s/2 for s = compute_encoding(min, max, bits,
          symmetric).scale, i.e. those that quantize onto the same integer as 0 under the min_max encoding
          (interpolated inside one magnitude bin). `zero_bin_fraction_nonzero` is the same over the non-zero
          values only (the information that 8 bits destroy; exact zeros survive quantization).
        - `p999_steps` = abs_p999 / s: how many grid steps the bulk spans under the min_max encoding.
        Suggested §6 rule: keep the tensor float/16-bit when zero_bin_fraction_nonzero > ~0.1 or bulk_ratio
        > ~1e3 (the median value gets < 1/8 of a step).
        """
        self._flush()
        out = {"min": float(self.min) if self.count else 0.0, "max": float(self.max) if self.count else 0.0,
               "count": self.count, "nonfinite": self.nonfinite,
               "mean_abs": self.abs_sum / self.count if self.count else 0.0, "bits": self.bits,
               "symmetric": self.symmetric, "scheme": self.scheme}
        mags = self.magnitudes
        absmax = max(abs(out["min"]), abs(out["max"]))
        out["abs_p999"] = p999 = mags.abs_quantile(0.999)
        out["abs_median_nonzero"] = median = mags.abs_quantile(0.5, skip_zeros=True)
        out["outlier_ratio"] = _ratio(absmax, p999)
        out["bulk_ratio"] = _ratio(absmax, median)
        out["magnitude_gap"] = mags.largest_gap(floor=mags.abs_quantile(0.01, skip_zeros=True))
        out["range_ratio"] = _ratio(out["max"] - out["min"], mags.quantile(0.999) - mags.quantile(0.001))
        scale = float(compute_encoding(out["min"], out["max"], self.bits, self.symmetric).scale)
        threshold = float(np.nextafter(scale / 2, np.inf))
        zero_frac = mags.fraction_abs_below(threshold)
        out["zero_bin_fraction"] = zero_frac
        total = mags.abs_counts.sum()
        zeros = mags.abs_counts[:8].sum() / total if total else 0.0
        out["zero_bin_fraction_nonzero"] = max(zero_frac - zeros, 0.0) / (1 - zeros) if zeros < 1 else 0.0
        out["p999_steps"] = p999 / scale
        return out


class TfEnhancedObserver(RangeObserver):
    """AIMET tf_enhanced: candidate range minimising clipping + rounding noise over the histogram."""

    scheme = "tf_enhanced"
    uses_histogram = True

    def _choose_range(self):
        return search_noise_range(self.histogram, self.min, self.max, self.bits, self.symmetric)


class PercentileObserver(RangeObserver):
    """onnxruntime's Percentile: the range holding `percentile`% of the values (default 99.999, ORT's default).

    Asymmetric: the equal-tailed central interval, as onnxruntime's `compute_percentile` defines it: each end is
    cut at its own (100 - p)/2 % tail, whatever the other end looks like (`percentile_cuts`). Symmetric: [-t, t]
    with t the p-th percentile of |x| (onnxruntime's symmetric histogram of |x|). Exact zeros count as values, as
    in onnxruntime. Two rules keep it from clipping what it cannot resolve (`resolved_clip`): a tail that holds
    less than one whole value is not cut, and a cut shorter than half a step of the grid it makes is not made.

    NOTE: the old rule moved a bounded end's share to the other end, so a ReLU output's top was cut twice as deep as
    onnxruntime cuts it (AIMET cuts (100 - p)% at each end, deeper still). The percentile is taken over the whole
    histogram, as both do: on ppocr_cls the values beyond each cut come from 6 to 17 of the 64 images, so no single
    image sets it, and per-batch percentiles would only add the batching as a parameter.
    """

    scheme = "percentile"
    uses_histogram = True

    def __init__(self, bits: int = 8, symmetric: bool = False, bins: int = 2048,
                 percentile: float = DEFAULT_PERCENTILE):
        super().__init__(bits, symmetric, bins)
        if not 50.0 < percentile <= 100.0:
            raise ConfigError(f"percentile must be in (50, 100], got {percentile}")
        self.percentile = float(percentile)

    def _choose_range(self):
        tail = 1.0 - self.percentile / 100.0
        if self.symmetric:
            absmax = max(-self.min, self.max)
            if tail * self.count < 1.0:
                return -absmax, absmax
            t = _abs_quantile(self.histogram, 1.0 - tail, interpolate=True)
            t = float(resolved_clip(-absmax, absmax, -t, t, self.bits, True)[1])
            return -t, t
        cut = tail / 2.0
        if cut * self.count < 1.0:
            return self.min, self.max
        hi = self.histogram.quantile(1.0 - cut) if self.max > 0 else self.max
        lo = self.histogram.quantile(cut) if self.min < 0 else self.min
        lo, hi = resolved_clip(self.min, self.max, lo, hi, self.bits, False)
        return float(lo), float(hi)


def resolved_clip(vmin, vmax, lo, hi, bits: int, symmetric: bool):
    """(lo, hi) with each end put back at the extreme (vmin / vmax) when the cut there is shorter than half a step
    of the grid [lo, hi] would get (element-wise on arrays).

    NOTE: a value within half a step beyond the grid's last level rounds onto that level anyway, so such a cut
    saves no saturation error; all it does is shrink the step by less than 1/(2 * levels), which re-rounds a random
    few percent of the values. That is a new draw of the rounding noise, not a better grid: np.percentile's
    interpolation between a weight channel's two largest values changed ppocr_cls's weight scales by ~1e-4 and moved
    its agreement by 1 point (4 of 400 images) with no clipping at all.
    """
    lo, hi = np.asarray(lo, np.float64), np.asarray(hi, np.float64)
    vmin, vmax = np.asarray(vmin, np.float64), np.asarray(vmax, np.float64)
    if symmetric:
        step = np.maximum(-lo, hi) / (2 ** (bits - 1) - 1)
    else:
        step = (np.maximum(hi, 0.0) - np.minimum(lo, 0.0)) / (2 ** bits - 1)
    hi = np.where(vmax - hi < step / 2, vmax, hi)
    lo = np.where(lo - vmin < step / 2, vmin, lo)
    return lo, hi


def percentile_cuts(mat: np.ndarray, percentile: float):
    """Per row of `mat` (NaN = missing), the nearest-rank equal-tailed interval: (lo, hi) with k = floor(n * (100 -
    percentile) / 200) of a row's n values below lo and k above hi (k = 0 keeps the row's min and max).

    NOTE: np.percentile interpolates between order statistics, so a 27-value weight channel at 99.999 "cut" its
    max by 0.03% of the gap to the second largest value: a fraction of a value that no data defines.
    """
    rows = np.sort(mat, axis=1)                         # NaN last
    n = np.count_nonzero(~np.isnan(mat), axis=1)
    k = np.floor(n * (100.0 - percentile) / 200.0 + 1e-9).astype(np.intp)
    r = np.arange(rows.shape[0])
    lo = rows[r, np.minimum(k, np.maximum(n - 1, 0))]
    hi = rows[r, np.maximum(n - 1 - k, 0)]
    return np.nan_to_num(lo, nan=0.0), np.nan_to_num(hi, nan=0.0)


class EntropyObserver(RangeObserver):
    """TensorRT-style KL-divergence threshold over the |x| histogram."""

    scheme = "entropy"
    uses_histogram = True

    def _choose_range(self):
        mags = self.magnitudes.counts
        zeros = float(mags[0] + mags[len(mags) // 2])  # +0 and -0 (and float32 values below ~1e-39)
        t = entropy_threshold(self.histogram, self.min, self.max, self.bits, self.symmetric, zeros)
        return -t, t


class MseObserver(RangeObserver):
    """Candidate range minimising the fake-quantization MSE estimated on the histogram."""

    scheme = "mse"
    uses_histogram = True

    def _choose_range(self):
        return search_mse_range(self.histogram, self.min, self.max, self.bits, self.symmetric)


_OBSERVERS = {"min_max": RangeObserver, "tf_enhanced": TfEnhancedObserver, "percentile": PercentileObserver,
              "entropy": EntropyObserver, "mse": MseObserver}


def make_observer(scheme: str = "min_max", bits: int = 8, symmetric: bool = False, **opts) -> RangeObserver:
    """A fresh observer for `scheme`; opts: `bins` (histogram schemes), `percentile` (percentile scheme)."""
    cls = _OBSERVERS[canonical_scheme(scheme)]
    if "percentile" in opts and cls is not PercentileObserver:
        opts.pop("percentile")
    if not cls.uses_histogram:
        opts.pop("bins", None)
    return cls(bits=bits, symmetric=symmetric, **opts)


# ---------------------------------------------------------------- searches over a histogram

def search_noise_range(hist: LinearHistogram, vmin: float, vmax: float, bits: int, symmetric: bool,
                       gamma: float = TF_ENHANCED_GAMMA):
    """tf_enhanced: argmin over candidates of gamma * saturation error + rounding error (AIMET's
    TfEnhancedEncodingAnalyzer::_quantAndSatCost): both are the exact expected squared errors on the histogram
    (`_mse_errors`), the rounding error of each in-range value on the candidate's grid, as AIMET computes it per bin.

    NOTE: the rounding term used to be N_in * scale^2 / 12. That charges a full s^2/12 to every in-range value,
    also to the exact zeros and near-zero values of a ReLU/HardSwish output that sit on the grid's 0 (AIMET's per-bin
    cost charges them ~nothing), so it over-priced rounding 2-3x on such tensors and clipped them to 65-75% of their
    range: ppocr_cls lost 1.5 points of agreement. `gamma` = 3: AIMET's GAMMA (saturation weighed 3x).
    """
    return search_mse_range(hist, vmin, vmax, bits, symmetric, gamma=gamma)


def search_mse_range(hist: LinearHistogram, vmin: float, vmax: float, bits: int, symmetric: bool,
                     gamma: float = 1.0):
    """mse: argmin over candidates of the expected squared fake-quantization error, the histogram read as a
    piecewise-uniform density (`_mse_errors`: exact per bin, on compute_encoding's grid); `gamma` weighs the
    saturation (beyond-the-grid) part of the error (tf_enhanced: 3).

    Symmetric: every shrunk t at once. Asymmetric: coordinate search over the shrunk max with the min fixed, then
    the shrunk min, then the max again (~120 candidates instead of all 1600 pairs: ppocr_cls spent 7.8 s here).
    """
    keep = hist.counts > 0
    edges = hist.edges
    u, v, n = edges[:-1][keep], edges[1:][keep], hist.counts[keep]
    tiny = np.finfo(np.float32).tiny * 1e3
    if symmetric:
        top = max(-min(vmin, 0.0), max(vmax, 0.0))
        qmax = 2 ** (bits - 1) - 1

        def errors(t):
            return _mse_errors(u, v, n, -t, np.maximum(t / qmax, tiny), bits, symmetric, gamma)
        t = _coarse_to_fine(top * _MSE_FACTORS, errors)
        return -t, t
    lo, hi = min(vmin, 0.0), max(vmax, 0.0)
    a_best, b_best = lo, hi
    steps = 2 ** bits - 1
    for axis in ("b", "a", "b"):
        if axis == "b":
            a_fix = a_best
            b_best = _coarse_to_fine(hi * _MSE_FACTORS, lambda b: _mse_errors(
                u, v, n, np.full_like(b, a_fix), np.maximum((b - a_fix) / steps, tiny), bits, symmetric, gamma))
        else:
            b_fix = b_best
            a_best = _coarse_to_fine(lo * _MSE_FACTORS, lambda a: _mse_errors(
                u, v, n, a, np.maximum((b_fix - a) / steps, tiny), bits, symmetric, gamma))
    return a_best, b_best


def _coarse_to_fine(cands: np.ndarray, errors, fine: int = 9) -> float:
    """argmin of errors(candidates) over `cands`, then over `fine` points between the best one's neighbours (the
    coarse factors are ~5% of the range apart; the refinement puts the answer within ~1% of the optimum)."""
    c = np.unique(cands)
    k = int(np.argmin(errors(c)))
    if len(c) < 2:
        return float(c[k])
    f = np.append(np.linspace(c[max(k - 1, 0)], c[min(k + 1, len(c) - 1)], fine), c[k])
    e = errors(f)
    return float(f[int(np.argmin(e))])


def _mse_errors(u, v, n, a, scale, bits, symmetric, gamma=1.0):
    """sum over bins of n * E[(qdq(x) - x)^2] with x uniform on the bin [u, v], for each candidate (a, scale);
    the part beyond the grid (saturation) weighed `gamma`.

    The grid is compute_encoding's: points k*s (0 exact) from (qmin - zp)*s to (qmax - zp)*s. Inside it the error
    is the periodic (x - s*round(x/s))^2, whose antiderivative is s^2/12 * x + r^3/3 - s^2 * r/12 (r = x - s*round(x/s));
    beyond it (x - edge)^2. Integrating exactly matters when a step is near a bin's width: 4 sample points per bin
    alias with the grid there (a uniform [-1, 1] with 3 outliers at 20 chose 4.7 instead of 1).
    """
    if symmetric:
        qmin, qmax, zp = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1, np.zeros_like(scale)
    else:
        qmin, qmax = 0, 2 ** bits - 1
        zp = np.clip(np.round(-a / scale), qmin, qmax)
    s = scale[:, None]
    lo_g, hi_g = (qmin - zp)[:, None] * s, (qmax - zp)[:, None] * s

    err = np.empty(len(scale))
    inv_w = n / np.maximum(v - u, np.finfo(np.float64).tiny)     # counts per unit length
    step = max(1, 2 ** 19 // max(len(u), 1))
    for i in range(0, len(scale), step):   # chunks of candidates keep the work matrices ~0.5M elements
        sl = slice(i, i + step)
        ss, lg, hg = s[sl], lo_g[sl], hi_g[sl]
        total = _cube(np.maximum(v, hg) - hg) - _cube(np.maximum(u, hg) - hg)       # 3x beyond the grid
        total -= _cube(np.minimum(u, lg) - lg) - _cube(np.minimum(v, lg) - lg)
        if gamma != 1.0:
            total *= gamma
        cu, cv = np.clip(u, lg, hg), np.clip(v, lg, hg)
        r_u, r_v = cu - ss * np.rint(cu / ss), cv - ss * np.rint(cv / ss)
        total += ss * ss / 4.0 * ((cv - cu) - (r_v - r_u)) + (_cube(r_v) - _cube(r_u))   # 3x inside
        err[sl] = total @ inv_w / 3.0
    return err


def _cube(x):
    return x * x * x


def entropy_threshold(hist: LinearHistogram, vmin: float, vmax: float, bits: int, symmetric: bool,
                      zeros: float = 0.0) -> float:
    """TensorRT's calibration: the |x| threshold whose clipped, requantized histogram has the least KL divergence.

    The signed histogram is folded onto bins of |x| of the same width (so no folded bin is left empty by a
    coarser source bin). `zeros` exact zeros (e.g. the ReLU spike) are taken out of the first bin first: every grid
    holds 0 exactly, and a spike merged with its neighbours by the requantization would push the threshold down to
    where one level is one bin (ReLU outputs clipped to a fifth of their range). Candidates: keep bins [0, i) for
    i from the number of target levels up to all bins (at most 512 of them), the outliers folded into the last kept
    bin of the reference P; all candidates are scored at once by `_kl_divergences`. Target levels: 2^(bits-1) for
    signed or two-sided data, 2^bits - 1 for non-negative data on an unsigned grid. When there are at least as
    many levels as bins (16-bit), no clipping gain can be resolved and the full |x| range is returned.
    """
    absmax = max(abs(vmin), abs(vmax))
    if hist.lo is None or absmax <= 0 or hist.total <= 0:
        return absmax
    w = hist.width
    nf = int(max(1, min(np.ceil(absmax / w - 1e-9), 2 * hist.bins)))
    idx = np.minimum((np.abs(hist.centers) / w).astype(np.intp), nf - 1)
    folded = np.bincount(idx, hist.counts, minlength=nf)
    folded[0] = max(folded[0] - float(zeros), 0.0)
    if symmetric:
        levels = 2 ** (bits - 1)
    else:  # an unsigned grid over [vmin, t]: the levels that land on [0, t] (all of them for ReLU outputs)
        levels = int((2 ** bits - 1) * max(vmax, 0.0) / (max(vmax, 0.0) - min(vmin, 0.0)))
        levels = max(levels, 2 ** (bits - 1))
    if levels >= nf and bits > 8 or folded.sum() <= 0:
        return absmax
    # NOTE: KL is blind to how far clipped values travel, and spiky histograms (the constant output of a conv over
    # zero padding) make its curve jagged: on ppocr_cls the argmin over all candidates clipped 4% of a ReLU output
    # to 15% of its range. Candidates therefore start at the CLIP_QUANTILE of |x| (at most 0.001% of the values
    # clip; 0.01% already cost ppocr_cls 1 point), unless that quantile lies beyond OUTLIER_FACTOR x the 99.99th
    # percentile: then more than 0.001% of the values form a far outlier cluster (a Gaussian with 20 values at 25
    # sigma in 1M), and the search starts at the 99.99th percentile so the cluster can be clipped.
    q5, q4 = _abs_quantile(hist, CLIP_QUANTILE), _abs_quantile(hist, 0.9999)
    floor = q5 if q5 <= OUTLIER_FACTOR * q4 else q4
    # below `levels` bins every level holds at most one bin: only the clipping counts (the bulk of a tensor with
    # far outliers can span fewer than 128 of the 2048 bins)
    first = max(1, int(np.ceil(floor / w - 1e-9)))
    if first >= nf:
        return absmax
    cands = np.unique(np.round(np.linspace(first, nf, min(nf - first + 1, 512))).astype(np.intp))
    kl = _kl_divergences(folded, cands, levels)
    best = int(cands[int(np.argmin(kl))])
    return absmax if best >= nf else float(min(best * w, absmax))


CLIP_QUANTILE = 0.99999  # entropy clips at most 1 - this fraction of the values (see entropy_threshold) ...
OUTLIER_FACTOR = 3.0     # ... unless that quantile is beyond 3x the 99.99th percentile (a far outlier cluster)


def _abs_quantile(hist: LinearHistogram, q: float, interpolate: bool = False) -> float:
    """The q-quantile of |x| from the signed histogram (bins split at 0 are folded by their centre): the upper edge
    of the bin holding it, or with `interpolate` the point inside that bin where the cumulative count reaches q."""
    order = np.argsort(np.abs(hist.centers), kind="stable")
    mags = np.abs(hist.centers)[order] + hist.width / 2
    counts = hist.counts[order]
    cdf = np.cumsum(counts)
    if cdf[-1] <= 0:
        return 0.0
    k = min(int(np.searchsorted(cdf, q * cdf[-1], side="left")), len(cdf) - 1)
    if not interpolate or counts[k] <= 0:
        return float(mags[k])
    below = cdf[k - 1] if k > 0 else 0.0
    frac = float(np.clip((q * cdf[-1] - below) / counts[k], 0.0, 1.0))
    return float(max(mags[k] - hist.width * (1.0 - frac), 0.0))


_EPS = 1e-4


def _xlogx(x):
    x = np.asarray(x, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 0, x * np.log(np.where(x > 0, x, 1.0)), 0.0)


def _kl_divergences(n: np.ndarray, cands: np.ndarray, levels: int) -> np.ndarray:
    """KL(P_i || Q_i) for every candidate i at once (the textbook loop, in closed form over prefix sums).

    P_i: the counts n[:i] with the outliers n[i:] added to bin i-1. Q_i: n[:i] merged into `levels` chunks
    (chunk j = bins [floor(j*i/L), floor((j+1)*i/L))) and each chunk's sum spread evenly over its non-empty bins,
    normalised by its own total. Within a chunk q is constant on the bins where p > 0, so
    sum p log q = sum_j (P_j / N) log(avg_j / Q) and sum p log p comes from a prefix sum of n log n. The last bin
    counts as non-empty when it holds only outliers; a candidate whose last chunk is empty while outliers exist has
    q = 0 where p > 0; it gets q = 1e-4 (onnxruntime's smoothing epsilon) there instead of an infinite score, so
    far outliers past empty bins can still be clipped.
    """
    n = np.asarray(n, np.float64)
    total = n.sum()
    cs = np.concatenate([[0.0], np.cumsum(n)])
    nz = np.concatenate([[0.0], np.cumsum(n > 0)])
    nlogn = np.concatenate([[0.0], np.cumsum(_xlogx(n))])
    i = cands[:, None]
    starts = (np.arange(levels + 1)[None, :] * i) // levels          # C x (L+1); starts[:, -1] == i
    chunk_sum = cs[starts[:, 1:]] - cs[starts[:, :-1]]
    chunk_nz = nz[starts[:, 1:]] - nz[starts[:, :-1]]
    inside = cs[cands]
    outliers = np.maximum(total - inside, 0.0)
    last = n[cands - 1]
    chunk_nz[:, -1] += (last <= 0) & (outliers > 0)
    p_mass = chunk_sum.copy()
    p_mass[:, -1] += outliers
    with np.errstate(divide="ignore", invalid="ignore"):
        avg = np.where(chunk_nz > 0, chunk_sum / np.maximum(chunk_nz, 1), 0.0)
        # an empty chunk that holds only outliers (p > 0, q = 0) gets q = 1e-4, onnxruntime's smoothing epsilon
        log_q = np.where(avg > 0, np.log(np.where(avg > 0, avg, 1.0)) - np.log(inside)[:, None], np.log(_EPS))
        plogq = np.where(p_mass > 0, p_mass * log_q, 0.0).sum(axis=1) / total
    plogp = (nlogn[cands - 1] + _xlogx(last + outliers)) / total - np.log(total)
    kl = plogp - plogq
    return np.where(np.isfinite(kl), kl, np.inf)


def _ratio(num: float, den: float) -> float:
    if den > 0:
        return float(num / den)
    return 1.0 if num <= 0 else float("inf")


# ---------------------------------------------------------------- per-channel weights

_WEIGHT_FACTORS = np.linspace(0.3, 1.0, 22)


def weight_range(w, axis: int = 0, scheme: str = "min_max", bits: int = 8, symmetric: bool = True,
                 percentile: float = DEFAULT_PERCENTILE) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (min, max) arrays along `axis` of a weight tensor.

    min_max: plain per-channel min/max. mse / tf_enhanced: each channel's range is shrunk by the factor in
    0.3..1.0 (22 steps) minimising, per channel, the exact fake-quant MSE (mse) or clip error + rounding
    noise min(s^2/12, x^2) per in-range value (tf_enhanced); vectorised across channels. percentile: the
    activations' rule per channel (`percentile_cuts`, `resolved_clip`). entropy: min_max (KL calibration is for
    activations). Non-finite weights are ignored.
    """
    name = canonical_scheme(scheme)
    w = np.asarray(w, np.float64)
    if w.ndim == 0:
        w = w.reshape(1)
    # NOTE: not reshape(K, -1): a weight with a zero dim (shape (4, 0)) cannot infer the -1
    mat = np.moveaxis(w, axis, 0).reshape(w.shape[axis], w.size // w.shape[axis] if w.shape[axis] else 0)
    finite = np.isfinite(mat)
    if not finite.all():
        mat = np.where(finite, mat, np.nan)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # "All-NaN slice": an all-Inf channel (kept at 0)
        cmin = np.nan_to_num(np.nanmin(mat, axis=1), nan=0.0) if mat.shape[1] else np.zeros(mat.shape[0])
        cmax = np.nan_to_num(np.nanmax(mat, axis=1), nan=0.0) if mat.shape[1] else np.zeros(mat.shape[0])
    if name == "min_max" or mat.shape[1] == 0:
        return cmin, cmax
    if name == "percentile":
        # the activations' rule per channel: equal-tailed nearest-rank cuts, never shorter than half a step
        if symmetric:
            a = np.abs(mat)
            t = percentile_cuts(a, 100.0 - 2.0 * (100.0 - percentile))[1]   # the p-th percentile of |w|
            absmax = np.maximum(-cmin, cmax)
            t = resolved_clip(-absmax, absmax, -t, t, bits, True)[1]
            return -t, t
        qlo, qhi = percentile_cuts(mat, percentile)
        lo = np.where(cmin < 0, qlo, cmin)
        hi = np.where(cmax > 0, qhi, cmax)
        return resolved_clip(cmin, cmax, lo, hi, bits, False)
    if name == "entropy":
        # NOTE: as in TensorRT and onnxruntime, entropy calibrates activations only; a weight channel (9 values
        # for a depthwise 3x3) is no distribution to fit a KL threshold to, and clipping it cost digits_cnn 19
        # points of top-1. Weights keep their per-channel min/max.
        return cmin, cmax
    return _shrink_search(mat, cmin, cmax, bits, symmetric, exact_mse=(name == "mse"))


def _shrink_search(mat, cmin, cmax, bits, symmetric, exact_mse):
    """Per-channel best shrink factor of [min(cmin,0), max(cmax,0)]; NaN entries (non-finite) are skipped."""
    lo, hi = np.minimum(cmin, 0.0)[:, None], np.maximum(cmax, 0.0)[:, None]
    valid = ~np.isnan(mat)
    x = np.where(valid, mat, 0.0)
    tiny = np.finfo(np.float32).tiny * 1e3
    errs = []
    for f in _WEIGHT_FACTORS:
        if symmetric:
            t = np.maximum(-lo, hi) * f
            a, b = -t, t
            s = np.maximum(t / (2 ** (bits - 1) - 1), tiny)
            z, qmin, qmax = 0.0, -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        else:
            a, b = lo * f, hi * f
            s = np.maximum((b - a) / (2 ** bits - 1), tiny)
            qmin, qmax = 0, 2 ** bits - 1
            z = np.clip(np.round(-a / s), qmin, qmax)
        if exact_mse:
            q = np.clip(np.round(x / s) + z, qmin, qmax)
            e = ((q - z) * s - x) ** 2
        else:
            clipped = np.clip(x, a, b)
            # NOTE: rounding noise is s^2/12 only when s is small against x; a value under s/2 rounds to 0
            # and costs x^2, so take the smaller (AIMET's plain s^2/12 over-penalises wide outlier channels).
            e = (x - clipped) ** 2 + np.where(x == clipped, np.minimum(s * s / 12.0, x * x), 0.0)
        errs.append(np.where(valid, e, 0.0).sum(axis=1))
    best = np.asarray(_WEIGHT_FACTORS)[np.argmin(np.stack(errs), axis=0)]
    if symmetric:
        t = np.maximum(-lo[:, 0], hi[:, 0]) * best
        return -t, t
    return lo[:, 0] * best, hi[:, 0] * best
