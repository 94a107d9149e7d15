"""The best per-block integer grid for a weight, rounded to nearest: what MatMulNBits and GatherBlockQuantized store.

A weight w [N, K] (one row per output channel) is cut into blocks of `block_size` consecutive elements along K
(the last block may be partial); each block gets a scale and a zero point, each element an unsigned code in
[0, 2**bits - 1], and dequantizes to (code - zero_point) * scale.

search="minmax" is onnxruntime's MatMulNBitsQuantizer default (MLAS BlockwiseQuantizer, q4_dq.cpp), bit for bit:
symmetric takes the block's signed value of largest magnitude m and scale = m / -2**(bits-1), so m lands on the
code 0 (signed -8 at 4 bits) and the whole [-8, 7] range is used; asymmetric widens [min, max] to hold 0,
scale = (max - min) / (2**bits - 1), zero point = round(-min / scale) clipped; codes = roundf(w * (1/scale) + zp).

search="mse" (the default) picks, per block, the grid with the least squared rounding error on the full code
range: a vectorised grid search over candidate ranges evaluated on every block at once (shrink factors of the
block's range; both sign conventions of a symmetric grid: m on -2**(bits-1) or on 2**(bits-1) - 1), then
least-squares refits of the scale (and offset) given the codes. The minmax grid is a candidate and the final grid
is compared with it block by block, so search="mse" is never worse than onnxruntime on any block.
float_zero_points=True (asymmetric only) lets the zero point be any float (MatMulNBits takes zero_points of the
scales' type): the range no longer has to hold 0 and scale and offset are fitted jointly, as HQQ and k-quants do.

Dequantised SQNR in dB, onnxruntime 1.32's RTN (its quantize_matmul_Nbits) -> ours, on [1024, 1024] weights
(tests/quant/test_block_grid.py measures them): Gaussian | Student-t (3 dof) with 8 outlier columns at 12x
  4 bits, block 32,  symmetric:            21.31 -> 21.83 | 17.77 -> 17.96
  4 bits, block 128, symmetric:            19.72 -> 20.30 | 13.12 -> 13.47
  8 bits, block 32,  symmetric:            45.49 -> 46.33 | 39.57 -> 39.82
  8 bits, block 128, symmetric:            43.83 -> 44.19 | 34.39 -> 34.46
  4 bits, block 32,  asymmetric:           21.86 -> 22.25 | 20.08 -> 20.32
  4 bits, block 32,  float zero points:    21.86 -> 23.10 | 20.08 -> 21.03
The symmetric search is within 0.02 dB of an exhaustive one over 6000 scales per block at 4 bits (up to 0.3 dB
short of it at 8 bits, where the error is jagged in the scale).
Speed, [4096, 4096] at block 32, two threads over row chunks of ~256K elements (a few chunk-sized buffers each):
symmetric 4 bits 1.3 s of CPU (about 1 s wall on an idle two-core machine, 1.9 s under a load of 4.6),
asymmetric 2.4 s of CPU, float zero points 1.9 s of CPU; search="minmax" 0.25 s.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

BITS = (2, 3, 4, 8)
SEARCHES = ("mse", "fast", "minmax")
_CHUNK = 1 << 18            # elements per row chunk: a few MB of temporaries per thread

# Candidate ranges of the coarse search, as fractions of the block's range (symmetric: of its largest magnitude).
_SHRINK = np.array([1.0, 0.94, 0.88, 0.82, 0.76, 0.70, 0.62, 0.54])
_SHRINK_OTHER = np.array([1.0, 0.92, 0.84])                            # the other symmetric sign convention
_FINE = np.array([0.97, 1.03, 0.985, 1.015, 0.993, 1.007])            # around each block's coarse best
_ASYM_BOTH = np.array([1.0, 0.95, 0.90, 0.85, 0.80, 0.75, 0.70, 0.65, 0.60])
_ASYM_ONE = np.array([0.90, 0.80, 0.70])
_FLOAT_TRIM = np.array([0.0, 0.03, 0.07, 0.12, 0.18])
_REFITS = 2
# search="fast": two coarse candidates, no fine stage, one least-squares refit (about a sixth of "mse"'s time,
# 0.41 s of CPU for [2048, 4096] asymmetric; Gaussian at 4 bits, block 32: symmetric 21.83 -> 21.65 dB,
# asymmetric 22.25 -> 22.08 dB, where minmax gives 21.32 and 21.85). Weight-only picks it for large models
# (passes/quantize/weight_grid.py).
_FAST = {"shrink": np.array([1.0, 0.9]), "shrink_other": np.array([]), "fine": np.array([]),
         "asym_both": np.array([1.0, 0.9]), "asym_one": np.array([]), "refits": 1}
_FULL = {"shrink": _SHRINK, "shrink_other": _SHRINK_OTHER, "fine": _FINE, "asym_both": _ASYM_BOTH,
         "asym_one": _ASYM_ONE, "refits": _REFITS}


@dataclass
class BlockGrid:
    """Codes, scales and zero points of a weight [N, K] blocked along K."""
    q: np.ndarray            # uint8 [N, K]: codes in [0, 2**bits - 1]
    scales: np.ndarray       # float32 [N, nb], nb = ceil(K / block_size)
    zero_points: np.ndarray  # uint8 [N, nb] (symmetric: all 2**(bits-1)), or float32 [N, nb]
    bits: int
    block_size: int
    symmetric: bool

    @property
    def shape(self) -> tuple:
        return self.q.shape

    @property
    def n_blocks(self) -> int:
        return self.scales.shape[1]

    @property
    def float_zero_points(self) -> bool:
        return self.zero_points.dtype.kind == "f"

    def dequantize(self, rows: slice = slice(None)) -> np.ndarray:
        """float32 [N, K] = (q - zp) * scale, block by block (only `rows`, when given: a weight's rows a chunk at
        a time, for callers that must not hold a second float copy of a large weight)."""
        codes = self.q[rows]
        n, k = codes.shape
        nb, bs = self.n_blocks, self.block_size
        q = np.zeros((n, nb * bs), np.float32)
        q[:, :k] = codes
        q = q.reshape(n, nb, bs)
        q -= self.zero_points[rows].astype(np.float32)[..., None]
        q *= self.scales[rows][..., None]
        return q.reshape(n, nb * bs)[:, :k]


def block_grid(w, bits: int, block_size: int, symmetric: bool = True, search: str = "mse",
               float_zero_points: bool = False) -> BlockGrid:
    """The per-block grid of `w` [N, K] blocked along K (see the module docstring)."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2 or 0 in w.shape:
        raise ValueError(f"block_grid: weight must be a non-empty 2-D [N, K] array, got shape {w.shape}")
    if bits not in BITS:
        raise ValueError(f"block_grid: bits must be one of {BITS}, got {bits}")
    if not isinstance(block_size, (int, np.integer)) or block_size < 2:
        raise ValueError(f"block_grid: block_size must be an integer >= 2, got {block_size}")
    if search not in SEARCHES:
        raise ValueError(f"block_grid: search must be one of {SEARCHES}, got {search!r}")
    if float_zero_points and symmetric:
        raise ValueError("block_grid: float zero points need an asymmetric grid (symmetric=False)")
    if not np.isfinite(w).all():
        raise ValueError("block_grid: weight has non-finite values")
    n, k = w.shape
    bs = int(block_size)
    nb, full = -(-k // bs), k // bs
    q = np.empty((n, k), np.uint8)
    scales = np.empty((n, nb), np.float32)
    zps = np.empty((n, nb), np.float32 if float_zero_points else np.uint8)
    fit = _FITS[(symmetric, float_zero_points)]

    def run(rows, b0, b1):               # the blocks [b0, b1) of some rows, all at once
        width = min(k, b1 * bs) - b0 * bs
        c, s, z = fit(w[rows, b0 * bs:b0 * bs + width].reshape(-1, b1 - b0, width // (b1 - b0)), bits, search)
        q[rows, b0 * bs:b0 * bs + width] = c.reshape(-1, width)
        scales[rows, b0:b1], zps[rows, b0:b1] = s, z
    step = max(1, _CHUNK // k)
    jobs = [(slice(r, min(n, r + step)), 0, full) for r in range(0, n, step)] if full else []
    if full < nb:                        # the partial last block, every row at once
        jobs.append((slice(0, n), full, nb))
    workers = min(_threads(), len(jobs))
    if workers > 1:                      # numpy lets go of the GIL inside each operation
        with ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(lambda j: run(*j), jobs))
    else:
        for j in jobs:
            run(*j)
    return BlockGrid(q, scales, zps, bits, bs, bool(symmetric))


def _threads() -> int:
    """At most two threads: the row chunks are independent, and more would compete with onnxruntime's."""
    try:
        return max(1, min(2, len(os.sched_getaffinity(0))))
    except AttributeError:
        return max(1, min(2, os.cpu_count() or 1))


def _codes(wb, scale, zp, qmax):
    """onnxruntime's rounding: roundf(w * (1/scale) + zp) clipped to [0, qmax] (half away from zero, on values
    that are >= 0 wherever it matters after the clip); float32 codes."""
    inv = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale != 0)
    x = wb * inv[..., None]
    x += np.asarray(zp, np.float32)[..., None]
    return np.clip(_round_half_up(x), 0, qmax, out=x)


def _round_half_up(x):
    """roundf for x >= 0 without the float error of floor(x + 0.5) (0.49999997 + 0.5 rounds to 1.0)."""
    c = np.floor(x)
    c += (x - c) >= 0.5
    return c


def _block_err(wb, c, scale, zp):
    """Σ((c - zp) * scale - w)² per block."""
    d = c - np.asarray(zp, np.float32)[..., None]
    d *= scale[..., None]
    d -= wb
    return np.einsum("ijk,ijk->ij", d, d)


def _sq_err(u, lo, hi):
    """Σ(clip(rint(u), lo, hi) - u)² per block: the rounding error in code units."""
    r = np.rint(u)
    np.clip(r, lo, hi, out=r)
    r -= u
    return np.einsum("ijk,ijk->ij", r, r)


def _pick(wb, ours, ref):
    """Per block, our grid or the reference (minmax) one, whichever has the smaller error; codes as uint8."""
    (c, s, z), (c0, s0, z0) = ours, ref
    worse = _block_err(wb, c, s, z) > _block_err(wb, c0, s0, z0)
    if worse.any():
        c[worse], s[worse] = c0[worse], s0[worse]
        z = np.where(worse, z0, z).astype(np.asarray(z).dtype)
    return c.astype(np.uint8), s, z


def _fit_symmetric(wb, bits, search):
    """Symmetric grid: zero point 2**(bits-1); scale = m * t for the block's signed extreme m."""
    half, qmax = 1 << (bits - 1), (1 << bits) - 1
    mx, mn = wb.max(-1), wb.min(-1)
    m = np.where(np.abs(mx) > np.abs(mn), mx, mn)
    s0 = (m / np.float32(-half)).astype(np.float32)
    ref = (_codes(wb, s0, half, qmax), s0, np.full(m.shape, half, np.uint8))
    if search == "minmax":
        return ref[0].astype(np.uint8), s0, ref[2]
    v = wb / np.where(m == 0, 1, m)[..., None]             # in [-1, 1]; the extreme at exactly 1
    lo, hi = -half, half - 1
    best_t = np.full(m.shape, -1.0 / half, np.float32)
    best_e = _sq_err(v * np.float32(-half), lo, hi) / np.float32(half * half)
    c_ = _FAST if search == "fast" else _FULL
    cands = np.concatenate([-c_["shrink"][1:] / half, c_["shrink_other"] / (half - 1)]).astype(np.float32)

    def consider(t):                                        # t: scalar or per block; keeps the better
        nonlocal best_t, best_e
        tt = np.asarray(t, np.float32)
        u = v * (1 / tt)[..., None] if tt.ndim else v * (1 / tt)
        e = _sq_err(u, lo, hi) * tt * tt
        better = e < best_e
        best_e = np.where(better, e, best_e)
        best_t = np.where(better, tt, best_t)
    for t in cands:
        consider(t)
    t_coarse = best_t
    for g in c_["fine"]:
        consider(t_coarse * np.float32(g))
    for _ in range(c_["refits"]):                                # least squares scale given the codes
        c = np.clip(np.rint(v / best_t[..., None]), lo, hi)
        qq = np.einsum("ijk,ijk->ij", c, c)
        t_ls = np.einsum("ijk,ijk->ij", v, c) / np.where(qq == 0, 1, qq)
        consider(np.where(t_ls == 0, best_t, t_ls))
    s = (m * best_t).astype(np.float32)
    z = np.full(m.shape, half, np.uint8)
    if search == "fast":    # the minmax range was a candidate: no block-by-block comparison (a fifth of the time)
        return _codes(wb, s, half, qmax).astype(np.uint8), s, z
    return _pick(wb, (_codes(wb, s, half, qmax), s, z), ref)


def _ort_asymmetric(wb, qmax):
    """onnxruntime's asymmetric grid (range2scalezp): [min, max] widened to hold 0."""
    mn = np.minimum(wb.min(-1), 0)
    mx = np.maximum(wb.max(-1), 0)
    s = ((mx - mn) / np.float32(qmax)).astype(np.float32)
    zf = np.divide(-mn, s, out=np.zeros_like(s), where=s != 0)
    z = np.clip(_round_half_up(zf), 0, qmax).astype(np.uint8)
    return (_codes(wb, s, z, qmax), s, z), mn, mx


def _fit_asymmetric(wb, bits, search):
    """Asymmetric grid with integer zero points in [0, 2**bits - 1] (the range always holds 0)."""
    qmax = (1 << bits) - 1
    ref, mn, mx = _ort_asymmetric(wb, qmax)
    if search == "minmax":
        return ref[0].astype(np.uint8), ref[1], ref[2]
    d = mx - mn
    d1 = np.where(d == 0, 1, d)
    v = wb / d1[..., None]                                 # range width 1; 0 stays 0
    lo0, hi0 = mn / d1, mx / d1                            # the range in those units (lo0 <= 0 <= hi0)
    best_k = np.full(d.shape, qmax, np.float32)            # codes per unit: 1 / scale
    best_z = np.clip(np.rint(-lo0 * qmax), 0, qmax).astype(np.float32)
    best_e = np.full(d.shape, np.inf, np.float32)

    def consider(k, z):                                     # per-block k and (integer) z; keeps the better
        nonlocal best_k, best_z, best_e
        k1 = np.where(k > 0, k, 1).astype(np.float32)
        u = v * k1[..., None]
        u += z[..., None]
        e = _sq_err(u, 0, qmax) / (k1 * k1)
        better = (e < best_e) & (k > 0)
        best_e = np.where(better, e, best_e)
        best_k = np.where(better, k1, best_k)
        best_z = np.where(better, z, best_z)

    def rng_cand(a, b):                                     # the range [a * lo0, b * hi0]
        w_ = b * hi0 - a * lo0
        k = qmax / np.where(w_ > 0, w_, 1)
        return k, np.clip(np.rint(-a * lo0 * k), 0, qmax).astype(np.float32)
    c_ = _FAST if search == "fast" else _FULL
    for f in c_["asym_both"]:
        consider(*rng_cand(f, f))
    for f in c_["asym_one"]:
        consider(*rng_cand(1.0, f))
        consider(*rng_cand(f, 1.0))
    k_coarse, z_coarse = best_k, best_z
    for g in c_["fine"]:                                         # scale around the coarse best, the offset kept
        consider(k_coarse * np.float32(g), np.clip(np.rint(z_coarse * np.float32(g)), 0, qmax))
    n = np.float32(v.shape[-1])
    sw = v.sum(-1)
    for _ in range(c_["refits"]):                                # least squares (scale, offset) given the codes
        c = np.rint(v * best_k[..., None] + best_z[..., None])
        np.clip(c, 0, qmax, out=c)
        sq, sqq, swq = c.sum(-1), np.einsum("ijk,ijk->ij", c, c), np.einsum("ijk,ijk->ij", v, c)
        den = n * sqq - sq * sq
        s = np.divide(n * swq - sq * sw, den, out=np.zeros_like(den), where=den > 0)
        off = (sw - s * sq) / n
        z = np.clip(np.rint(np.divide(-off, s, out=best_z.copy(), where=s > 0)), 0, qmax)
        den = sqq - 2 * z * sq + n * z * z                   # scale again with the zero point rounded
        s = np.divide(swq - z * sw, den, out=np.zeros_like(den), where=den > 0)
        consider(np.divide(1, s, out=np.zeros_like(s), where=s > 0), z.astype(np.float32))
    s = (d1 / best_k).astype(np.float32)
    s = np.where(d == 0, ref[1], s).astype(np.float32)
    z = np.where(d == 0, ref[2], best_z).astype(np.uint8)
    if search == "fast":    # the minmax range was a candidate: no block-by-block comparison (a fifth of the time)
        return _codes(wb, s, z, qmax).astype(np.uint8), s, z
    return _pick(wb, (_codes(wb, s, z, qmax), s, z), ref)


def _fit_float_zero_points(wb, bits, search):
    """Asymmetric grid with a float zero point: codes over [lo, hi] inside [min, max], fitted jointly."""
    qmax = (1 << bits) - 1
    ref, _, _ = _ort_asymmetric(wb, qmax)
    ref = (ref[0], ref[1], ref[2].astype(np.float32))
    if search == "minmax":
        return ref[0].astype(np.uint8), ref[1], ref[2]
    mn, mx = wb.min(-1), wb.max(-1)
    d = mx - mn
    d1 = np.where(d == 0, 1, d)
    v = (wb - mn[..., None]) / d1[..., None]               # in [0, 1]
    best_k = np.full(d.shape, qmax, np.float32)            # codes per unit
    best_o = np.zeros(d.shape, np.float32)                 # the unit value of code 0
    best_e = np.full(d.shape, np.inf, np.float32)

    def consider(k, o):                                     # scalars or per block; keeps the better
        nonlocal best_k, best_o, best_e
        k = np.asarray(k, np.float32)
        o = np.asarray(o, np.float32)
        if k.ndim:
            ok = k > 0
            k = np.where(ok, k, 1).astype(np.float32)
            u = (v - o[..., None]) * k[..., None]
        else:
            ok = True
            u = (v - o) * k
        e = _sq_err(u, 0, qmax) / (k * k)
        better = (e < best_e) & ok
        best_e = np.where(better, e, best_e)
        best_k = np.where(better, k, best_k)
        best_o = np.where(better, o, best_o)
    for a in _FLOAT_TRIM:
        for b in _FLOAT_TRIM:
            consider(qmax / (1 - a - b), a)
    n = np.float32(v.shape[-1])
    sw = v.sum(-1)
    for _ in range(_REFITS + 1):                            # least squares (scale, offset) given the codes
        c = (v - best_o[..., None]) * best_k[..., None]
        np.rint(c, out=c)
        np.clip(c, 0, qmax, out=c)
        sq, sqq, swq = c.sum(-1), np.einsum("ijk,ijk->ij", c, c), np.einsum("ijk,ijk->ij", v, c)
        den = n * sqq - sq * sq
        s = np.divide(n * swq - sq * sw, den, out=np.zeros_like(den), where=den > 0)
        consider(np.divide(1, s, out=np.zeros_like(s), where=s > 0), (sw - s * sq) / n)
    s = (d1 / best_k).astype(np.float32)
    z = np.divide(-(mn + best_o * d1), s, out=np.zeros_like(s), where=s != 0).astype(np.float32)
    s = np.where(d == 0, ref[1], s).astype(np.float32)
    z = np.where(d == 0, ref[2], z).astype(np.float32)
    return _pick(wb, (_codes(wb, s, z, qmax), s, z), ref)


_FITS = {(True, False): _fit_symmetric, (False, False): _fit_asymmetric, (False, True): _fit_float_zero_points}

__all__ = ["BlockGrid", "block_grid", "BITS", "SEARCHES"]
