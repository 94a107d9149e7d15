"""SmoothQuant's numbers (Xiao et al. 2023): the smoothing scale and the per-layer alpha search, in numpy.

For a linear layer Y = X W (X [n, K], W [K, N]) and a per-channel s > 0, (X / s)(s W) = Y. With
s_k = max|X_k|^alpha / max|W_k,:|^(1 - alpha) the outlier channels of X shrink and W's rows grow: alpha moves
the quantization difficulty from the activation (alpha -> 1) to the weight (alpha -> 0).

`search_alpha` picks alpha per layer on calibration rows: every alpha of the grid at once (one batched matmul,
no loop over alphas), each scored by the MSE of the layer output with X/s fake-quantized per tensor at the
activation bits and s W fake-quantized per output channel (or per block along K) at the weight bits, as the
plan will quantize them. The grid always holds 0.5 (the paper's default), so the pick is never worse than 0.5 on
that MSE; `NO_SMOOTHING` scores s = 1 too, so a layer that smoothing would not help can be left alone.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

DEFAULT_ALPHA = 0.5
ALPHA_GRID = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
NO_SMOOTHING = None            # the grid entry meaning s = 1 (no scale)
S_MIN, S_MAX = 1e-5, 1e5
MAX_ROWS = 512                 # calibration rows of X kept per layer for the search (uniform reservoir)


def smoothing_scale(xmax: np.ndarray, wmax: np.ndarray, alpha=DEFAULT_ALPHA) -> np.ndarray:
    """s_k = max|X_k|^alpha / max|W_k|^(1 - alpha), clipped to [S_MIN, S_MAX]; 1 where either is 0 or not finite.

    `alpha` may be an array: the result then has shape alpha.shape + xmax.shape (one row per alpha)."""
    a = np.asarray(alpha, np.float64)
    xm, wm = np.asarray(xmax, np.float64), np.asarray(wmax, np.float64)
    ab = a.reshape(a.shape + (1,) * xm.ndim)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = np.power(xm, ab) / np.power(wm, 1.0 - ab)
    s = np.where(np.isfinite(s) & (xm > 0) & (wm > 0), s, 1.0)
    return np.clip(s, S_MIN, S_MAX)


def fake_quant_activation(x: np.ndarray, bits: int, symmetric: bool = False) -> np.ndarray:
    """x [A, n, K]: each x[a] rounded to its own per-tensor min/max grid (the range always holds 0)."""
    red = tuple(range(1, x.ndim))
    if symmetric:
        m = np.abs(x).max(axis=red, keepdims=True)
        scale = np.where(m > 0, m / (2 ** (bits - 1) - 1), 1.0)
        lim = 2 ** (bits - 1) - 1
        return np.clip(np.round(x / scale), -lim - 1, lim) * scale
    lo = np.minimum(x.min(axis=red, keepdims=True), 0.0)
    hi = np.maximum(x.max(axis=red, keepdims=True), 0.0)
    scale = np.where(hi > lo, (hi - lo) / (2 ** bits - 1), 1.0)
    zp = np.round(-lo / scale)
    return (np.clip(np.round(x / scale) + zp, 0, 2 ** bits - 1) - zp) * scale


def fake_quant_weight(w: np.ndarray, bits: int, range_bits: Optional[int] = None,
                      block: Optional[int] = None) -> np.ndarray:
    """w [A, K, N]: symmetric per output channel N (per block of `block` rows of K when it divides K)."""
    rb = range_bits or bits
    lim = 2 ** (rb - 1) - 1
    a, k, n = w.shape
    if block and 0 < block < k and k % block == 0:
        wb = w.reshape(a, k // block, block, n)
        m = np.abs(wb).max(axis=2, keepdims=True)
        scale = np.where(m > 0, m / lim, 1.0)
        return (np.clip(np.round(wb / scale), -lim, lim) * scale).reshape(w.shape)
    m = np.abs(w).max(axis=1, keepdims=True)
    scale = np.where(m > 0, m / lim, 1.0)
    return np.clip(np.round(w / scale), -lim, lim) * scale


def layer_mse(x: np.ndarray, w: np.ndarray, scales: np.ndarray, act_bits: int = 8, act_symmetric: bool = False,
              weight_bits: int = 8, weight_range_bits: Optional[int] = None,
              block: Optional[int] = None) -> np.ndarray:
    """MSE of Q(X / s) Q(s W) against X W for each row of `scales` [A, K]; x [n, K], w [K, N]. Returns [A]."""
    x = np.asarray(x, np.float32)
    w = np.asarray(w, np.float32)
    s = np.asarray(scales, np.float32)
    ref = x @ w
    xq = fake_quant_activation(x[None] / s[:, None, :], act_bits, act_symmetric)
    wq = fake_quant_weight(w[None] * s[:, :, None], weight_bits, weight_range_bits, block)
    err = np.matmul(xq.astype(np.float32), wq.astype(np.float32)) - ref[None]
    return np.mean(np.square(err, dtype=np.float64), axis=(1, 2))


def search_alpha(x: np.ndarray, w: np.ndarray, xmax: np.ndarray, wmax: np.ndarray,
                 grid: Sequence = ALPHA_GRID, **quant) -> tuple:
    """(best alpha, {alpha: layer MSE}) over `grid`; alpha None in the grid scores s = 1 (no smoothing).

    Ties go to the earlier grid entry. `quant`: act_bits, act_symmetric, weight_bits, weight_range_bits, block."""
    grid = list(grid)
    rows = [np.ones(np.size(xmax)) if a is NO_SMOOTHING else smoothing_scale(xmax, wmax, a) for a in grid]
    mse = layer_mse(x, w, np.stack(rows), **quant)
    best = int(np.argmin(np.where(np.isfinite(mse), mse, np.inf)))
    return grid[best], dict(zip(grid, (float(m) for m in mse)))


class RowReservoir:
    """A uniform sample of at most `size` rows (last axis = channels) out of every row seen, plus max|x| per channel."""

    def __init__(self, size: int = MAX_ROWS, seed: int = 0):
        self.size, self.rng = size, np.random.default_rng(seed)
        self.rows: Optional[np.ndarray] = None
        self.keys: Optional[np.ndarray] = None
        self.absmax: Optional[np.ndarray] = None

    def add(self, a: np.ndarray) -> None:
        if a.ndim == 0 or a.size == 0:
            return
        r = np.asarray(a, np.float32).reshape(-1, a.shape[-1])
        if self.absmax is not None and self.absmax.size != r.shape[1]:
            return
        m = np.abs(r).max(axis=0).astype(np.float64)
        self.absmax = m if self.absmax is None else np.maximum(self.absmax, m)
        keys = self.rng.random(r.shape[0])
        if self.rows is not None:
            r, keys = np.concatenate([self.rows, r]), np.concatenate([self.keys, keys])
        if r.shape[0] > self.size:
            keep = np.argpartition(keys, self.size)[:self.size]
            r, keys = r[keep], keys[keep]
        self.rows, self.keys = r, keys
