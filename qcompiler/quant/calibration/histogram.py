"""Streaming histograms for calibration: a linear one that widens as data arrives, and a log-magnitude one.

Both are reduced batch by batch (memory is O(bins), never O(activations)) and filled with `np.bincount` on
computed bin indices, which is ~3x faster than `np.histogram` on a 3M-element float32 batch.

- `LinearHistogram`: `bins` equal-width bins over [lo, hi]. When a batch falls outside, the range widens to the
  union and the old counts are re-binned by overlap: each old bin (never wider than a new one) splits its count
  between the at most two new bins it overlaps, in proportion to the overlap. That keeps every count within one
  new bin width of where it belongs, so repeated widening blurs the shape by a few bins at most.
- `MagnitudeHistogram`: fixed bins on float32 bit patterns. Shifting the raw bits right by 20 keeps sign,
  exponent and the top 3 mantissa bits, i.e. 8 bins per octave over the whole float32 range, separately for
  positive and negative values. No rebinning, exact counts, and it resolves 10 and 3.4e38 in the same tensor
  (field notes §6), which no linear histogram can.
"""
from __future__ import annotations

import numpy as np

_MAG_SHIFT = 20                      # bits dropped: 23 mantissa bits - 3 kept
_MAG_HALF = 1 << (31 - _MAG_SHIFT)   # 2048 magnitude bins per sign


class LinearHistogram:
    """Equal-width histogram over a range that grows to cover every batch (counts are float64)."""

    def __init__(self, bins: int = 2048):
        self.bins = int(bins)
        self.counts = np.zeros(self.bins, np.float64)
        self.lo: float | None = None
        self.hi: float | None = None

    @property
    def width(self) -> float:
        return (self.hi - self.lo) / self.bins

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(self.lo, self.hi, self.bins + 1)

    @property
    def centers(self) -> np.ndarray:
        return self.lo + (np.arange(self.bins) + 0.5) * self.width

    @property
    def total(self) -> float:
        return float(self.counts.sum())

    def update(self, x: np.ndarray, xmin: float, xmax: float) -> None:
        """Add the finite 1-D float array `x`, whose min and max the caller already knows."""
        if x.size == 0:
            return
        if self.lo is None:
            self.lo, self.hi = _nonempty_range(xmin, xmax)
        elif xmin < self.lo or xmax > self.hi:
            self._widen(*_nonempty_range(min(xmin, self.lo), max(xmax, self.hi)))
        # NOTE: float32 arithmetic for speed; x - lo may round a hair below 0 or up to `bins`, hence the clip.
        # Ranges near float32's limit (the -3.4e38 mask) would overflow x - lo, so they go through float64.
        wide = self.hi - self.lo > 1e37
        dtype = np.float32 if x.dtype == np.float32 and not wide else np.float64
        pos = x.astype(dtype, copy=False) - dtype(self.lo)
        pos *= dtype(self.bins / (self.hi - self.lo))
        idx = pos.astype(np.intp)
        np.minimum(idx, self.bins - 1, out=idx)  # negatives cannot occur: astype truncates -0.x to 0
        self.counts += np.bincount(idx, minlength=self.bins)

    def _widen(self, lo: float, hi: float) -> None:
        """Re-bin the counts onto [lo, hi] (a superset of the current range), splitting by overlap."""
        old_edges = self.edges
        new_w = (hi - lo) / self.bins
        left, right = old_edges[:-1], old_edges[1:]
        j = np.clip(np.floor((left - lo) / new_w), 0, self.bins - 1).astype(np.intp)
        split = lo + (j + 1) * new_w             # right edge of the new bin holding each old bin's left edge
        old_w = np.maximum(right - left, np.finfo(np.float64).tiny)
        frac_left = np.clip((split - left) / old_w, 0.0, 1.0)
        j2 = np.minimum(j + 1, self.bins - 1)
        counts = np.bincount(j, self.counts * frac_left, minlength=self.bins)
        counts += np.bincount(j2, self.counts * (1.0 - frac_left), minlength=self.bins)
        self.counts, self.lo, self.hi = counts, lo, hi

    def quantile(self, q: float) -> float:
        """Value below which a fraction `q` of the mass lies (linear interpolation inside the bin)."""
        cdf = np.cumsum(self.counts)
        total = cdf[-1]
        if total <= 0:
            return float(self.lo or 0.0)
        target = np.clip(q, 0.0, 1.0) * total
        i = int(np.searchsorted(cdf, target, side="left"))
        i = min(i, self.bins - 1)
        below = cdf[i - 1] if i > 0 else 0.0
        inside = (target - below) / self.counts[i] if self.counts[i] > 0 else 0.0
        return float(self.lo + (i + np.clip(inside, 0.0, 1.0)) * self.width)


class MagnitudeHistogram:
    """Exact signed log2 histogram of float32 values: 8 bins per octave, 2048 bins per sign."""

    def __init__(self):
        self.counts = np.zeros(2 * _MAG_HALF, np.int64)  # [0, 2048): x >= +0, [2048, 4096): x <= -0

    def update(self, x: np.ndarray, weight: int = 1) -> None:
        """Add the finite array `x` (cast to float32: the bins are float32 bit patterns), each value counted `weight`
        times (a caller that bins every k-th value of a batch passes k)."""
        if x.size == 0:
            return
        bits = np.ascontiguousarray(x, np.float32).reshape(-1).view(np.uint32)
        counts = np.bincount(bits >> _MAG_SHIFT, minlength=2 * _MAG_HALF)
        self.counts += counts * weight if weight != 1 else counts

    @property
    def abs_counts(self) -> np.ndarray:
        """Counts of |x| per magnitude bin (bin k covers [edge(k), edge(k+1)))."""
        return self.counts[:_MAG_HALF] + self.counts[_MAG_HALF:]

    @staticmethod
    def edges() -> np.ndarray:
        """The 2049 magnitude bin edges (float64; the inf/NaN patterns at the top read as float32 max)."""
        return _MAG_EDGES

    def abs_quantile(self, q: float, skip_zeros: bool = False) -> float:
        """|x| value below which a fraction `q` of the values lie (linear inside the bin, < 9% off).

        `skip_zeros` leaves out zeros and float32 denormals (|x| < 2^-126), e.g. for the bulk of a ReLU output.
        """
        counts = self.abs_counts
        if skip_zeros:
            counts = counts.copy()
            counts[:8] = 0
        cdf = np.cumsum(counts)
        total = cdf[-1]
        if total == 0:
            return 0.0
        target = np.clip(q, 0.0, 1.0) * total
        i = min(int(np.searchsorted(cdf, target, side="left")), _MAG_HALF - 1)
        below = cdf[i - 1] if i > 0 else 0
        frac = (target - below) / counts[i] if counts[i] > 0 else 0.0
        e = self.edges()
        return float(e[i] + np.clip(frac, 0.0, 1.0) * (e[i + 1] - e[i]))

    def quantile(self, q: float) -> float:
        """Signed value below which a fraction `q` of the values lie (same resolution as `abs_quantile`)."""
        neg, pos = self.counts[_MAG_HALF:], self.counts[:_MAG_HALF]
        total = neg.sum() + pos.sum()
        if total == 0:
            return 0.0
        target = float(np.clip(q, 0.0, 1.0) * total)
        e = self.edges()
        n_neg = neg.sum()
        if target <= n_neg:  # walk the negatives from the most negative (largest magnitude) upwards
            cdf = np.cumsum(neg[::-1])
            i = min(int(np.searchsorted(cdf, target, side="left")), _MAG_HALF - 1)
            below = cdf[i - 1] if i > 0 else 0
            frac = (target - below) / neg[::-1][i] if neg[::-1][i] > 0 else 0.0
            k = _MAG_HALF - 1 - i  # magnitude bin [e[k], e[k+1]) -> values (-e[k+1], -e[k]]
            return float(-e[k + 1] + np.clip(frac, 0.0, 1.0) * (e[k + 1] - e[k]))
        cdf = np.cumsum(pos)
        target -= n_neg
        i = min(int(np.searchsorted(cdf, target, side="left")), _MAG_HALF - 1)
        below = cdf[i - 1] if i > 0 else 0
        frac = (target - below) / pos[i] if pos[i] > 0 else 0.0
        return float(e[i] + np.clip(frac, 0.0, 1.0) * (e[i + 1] - e[i]))

    def largest_gap(self, floor: float = 0.0) -> float:
        """Largest ratio between consecutive occupied |x| bins at or above `floor` (lower edge of the upper bin
        over the upper edge of the lower one; zeros and denormals are skipped); 1.0 if fewer than 2 bins.

        Pass a floor such as the 1% quantile of |x|: the sparse low tail of any continuous distribution has
        gaps in log space that mean nothing.
        """
        e = _MAG_EDGES
        occupied = np.flatnonzero(self.abs_counts[8:]) + 8
        occupied = occupied[e[occupied + 1] > floor]
        if len(occupied) < 2:
            return 1.0
        return float(np.max(e[occupied[1:]] / e[occupied[:-1] + 1]))

    def fraction_abs_below(self, threshold: float) -> float:
        """Fraction of values with |x| < threshold (bin containing the threshold interpolated linearly)."""
        counts = self.abs_counts
        total = counts.sum()
        if total == 0:
            return 0.0
        e = self.edges()
        i = int(np.searchsorted(e, threshold, side="right")) - 1
        if i < 0:
            return 0.0
        if i >= _MAG_HALF:
            return 1.0
        inside = (threshold - e[i]) / (e[i + 1] - e[i]) if e[i + 1] > e[i] else 1.0
        return float((counts[:i].sum() + np.clip(inside, 0.0, 1.0) * counts[i]) / total)


def _magnitude_edges() -> np.ndarray:
    pattern = (np.arange(_MAG_HALF + 1, dtype=np.uint64) << _MAG_SHIFT).astype(np.uint32)
    with np.errstate(invalid="ignore"):
        e = pattern.view(np.float32).astype(np.float64)
    e = np.where(np.isfinite(e), e, np.finfo(np.float32).max)
    e.setflags(write=False)
    return e


_MAG_EDGES = _magnitude_edges()


def _nonempty_range(lo: float, hi: float) -> tuple[float, float]:
    """[lo, hi] widened to a non-zero width so a constant tensor still gets a valid histogram."""
    lo, hi = float(lo), float(hi)
    if hi > lo:
        return lo, hi
    pad = max(abs(lo) * 2.0 ** -20, 1e-30)
    return lo - pad, hi + pad
