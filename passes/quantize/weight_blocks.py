"""Blockwise weight grids for the weight-only algorithms (GPTQ, AWQ): the layout they share and the default grid.

Layout: a weight W [N, K] (N output channels, K the reduction axis) is quantized in blocks of `block_size`
consecutive elements along K (the last block may be shorter); codes q uint8 [N, K] in [0, 2**bits - 1], scales
float32 [N, nb] and zero points uint8 [N, nb], nb = ceil(K / block_size); W ~ (q - zp) * scale. A symmetric
grid has zp = 2**(bits - 1) and scale = max|w| / (2**(bits - 1) - 1) (the restricted range that
qcompiler.quant.core.encoding.compute_encoding uses); an asymmetric one covers [min(w, 0), max(w, 0)] in
2**bits - 1 steps with an integer zero point. Rounding is half-to-even in float32, as onnxruntime's
QuantizeLinear does.

A grid function `grid_fn(w_block [N, b]) -> (scale [N], zero_point [N])` chooses the grid of one block for every
row, each row on its own (so `rtn_quantize` hands it all the whole blocks of a weight at once, one block a row);
`minmax_grid` is the default (round to nearest on the min/max range), a better search can be passed in.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

GridFn = Callable[[np.ndarray], tuple]
TINY = float(np.finfo(np.float32).tiny) * 1e3


def n_blocks(k: int, block_size: Optional[int]) -> tuple:
    """(block length, number of blocks) along K; no block size (or one >= K) is one block per row."""
    b = int(block_size) if block_size and 0 < int(block_size) < k else k
    return b, -(-k // b)


def minmax_grid(w: np.ndarray, bits: int, symmetric: bool) -> tuple:
    """Min/max grid over the last axis of `w` (any leading dims): (scale float32, zero point uint8)."""
    w = np.asarray(w, np.float32)
    lo = np.minimum(w.min(axis=-1), 0.0)
    hi = np.maximum(w.max(axis=-1), 0.0)
    if symmetric:
        scale = np.maximum(np.maximum(-lo, hi) / (2 ** (bits - 1) - 1), TINY).astype(np.float32)
        return scale, np.full(scale.shape, 2 ** (bits - 1), np.uint8)
    levels = 2 ** bits - 1
    scale = np.maximum((hi - lo) / levels, TINY).astype(np.float32)
    zp = np.clip(np.rint(-lo / scale), 0, levels).astype(np.uint8)
    return scale, zp


def rtn_grid(bits: int, symmetric: bool) -> GridFn:
    """The default `grid_fn`: `minmax_grid` of one block [N, b]."""
    def grid(w_block):
        return minmax_grid(w_block, bits, symmetric)
    return grid


def quantize_codes(w: np.ndarray, scale, zp, bits: int) -> np.ndarray:
    """Codes of `w` on the grid (scale, zp broadcastable to w), as w's float dtype: clip(rint(w / s) + zp)."""
    q = np.rint(w / scale)
    q += zp
    return np.clip(q, 0, 2 ** bits - 1, out=q)


def expand_blocks(a: np.ndarray, k: int, block_size: int) -> np.ndarray:
    """Per-block values [N, nb] repeated along K to [N, k] (the last block cut)."""
    return np.repeat(a, block_size, axis=1)[:, :k]


def dequantize(q: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, block_size: Optional[int]) -> np.ndarray:
    """(q - zp) * scale in float32 for codes [N, K] and per-block grids [N, nb]."""
    k = q.shape[1]
    b, _ = n_blocks(k, block_size)
    s = expand_blocks(np.asarray(scales, np.float32), k, b)
    z = expand_blocks(np.asarray(zero_points, np.float32), k, b)
    return (q.astype(np.float32) - z) * s


def rtn_quantize(w: np.ndarray, bits: int, block_size: Optional[int], symmetric: bool = True,
                 grid_fn: Optional[GridFn] = None) -> tuple:
    """Round-to-nearest per block, the baseline: (q uint8 [N, K], scales [N, nb], zero points [N, nb])."""
    w = np.asarray(w, np.float32)
    n, k = w.shape
    b, nb = n_blocks(k, block_size)
    if grid_fn is None and k % b == 0:
        scales, zps = minmax_grid(w.reshape(n, nb, b), bits, symmetric)
    else:
        grid_fn = grid_fn or rtn_grid(bits, symmetric)
        scales = np.empty((n, nb), np.float32)
        zps = np.empty((n, nb), np.uint8)
        full = k // b
        if full:            # every whole block in one call, one block a row (a grid function takes rows alone)
            sc, zp = grid_fn(w[:, :full * b].reshape(n * full, b))
            scales[:, :full], zps[:, :full] = np.reshape(sc, (n, full)), np.reshape(zp, (n, full))
        if full < nb:
            scales[:, full], zps[:, full] = grid_fn(w[:, full * b:])
    q = quantize_codes(w, expand_blocks(scales, k, b), expand_blocks(zps.astype(np.float32), k, b), bits)
    return q.astype(np.uint8), scales, zps


def fake_quantize(w: np.ndarray, bits: int, block_size: Optional[int], symmetric: bool = True,
                  grid_fn: Optional[GridFn] = None) -> np.ndarray:
    """dequantize(rtn_quantize(w)) in float32; whole blocks with the default grid broadcast, never repeated."""
    w = np.asarray(w, np.float32)
    n, k = w.shape
    b, nb = n_blocks(k, block_size)
    if grid_fn is not None or k % b:
        return dequantize(*rtn_quantize(w, bits, block_size, symmetric, grid_fn), block_size)
    wb = w.reshape(n, nb, b)
    scale, zp = minmax_grid(wb, bits, symmetric)
    scale, zp = scale[..., None], zp[..., None].astype(np.float32)
    q = quantize_codes(wb, scale, zp, bits)
    q -= zp
    q *= scale
    return q.reshape(n, k)
