"""GPTQ weight-only quantization (Frantar et al. 2023, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers"), the numerics in numpy.

For a linear layer y = W x (W [N, K]) and its calibration inputs X [n, K], GPTQ minimises the layer output error
||X W^T - X Q^T||^2 = tr(E H E^T) / 2 (E = W - Q, H = 2 X^T X / n) one input column at a time: column j is
rounded on its block's grid and its error, scaled by the inverse Hessian, is moved onto the columns not yet
quantized (Optimal Brain Quantization with a fixed order). What makes it fast: the rows of the upper Cholesky
factor U of H^-1 (H^-1 = U^T U) are exactly the update directions, so the column loop needs no re-inversion, and
the updates are applied lazily: within a batch of `lazy_batch` columns immediately (in sub-batches of SUB_BATCH
columns, rank-1 inside them), to the columns after the batch as one matrix product at its end.

Details, as in the reference implementation (github.com/IST-DASLab/gptq) unless said otherwise:
- H: `accumulate_hessian` keeps the running mean of 2 x^T x over streamed rows (float64).
- Dampening: lambda = damp * mean(diag H) is added to the diagonal; if H + lambda I is still not positive definite
  (a Cholesky fails or is not finite), lambda grows 10x, up to DAMP_TRIES times (stats `damp`, `damp_retries`).
- Dead inputs (diag H == 0, never non-zero in calibration): their row and column of H are zeroed and the diagonal
  set to 1, so their error moves nowhere. Their weights are kept and rounded on their block's grid (the reference
  zeroes them; a channel dead in the calibration set need not be dead in deployment).
- U is computed without an explicit inverse of H: the Cholesky factor of the order-reversed H gives H = T T^T
  with T upper, so H^-1 = (T^-1)^T T^-1 and U = T^-1 (a triangular inverse by blocks: matrix products).
- Groups (blocks): the grid of a block is chosen by `grid_fn` when the first of its columns is about to be
  quantized, from the block's CURRENT weights (those columns with every error update made so far, the lazy ones
  included; the reference reads the weights as they were at the start of the lazy batch).
- act_order (`act_order=True`): columns are processed by descending diag H (the inputs with the most energy
  first, while the most columns are left to absorb their error), and the result is permuted back. Groups stay
  on the ORIGINAL block boundaries along K, the shared layout (no g_idx: the per-block grids of the runtime
  cannot follow a permutation). Two ways, `static_groups`:
    False (default): a block's grid is chosen when the first of its columns comes up in the permuted order,
      from the block's current (error-updated) weights; its later columns are rounded on that grid.
    True: every block's grid is chosen up front from the original weights (AutoGPTQ's `static_groups`), then
      the permuted loop runs with those grids fixed.
  The reference's act_order with groups forms groups of consecutive PERMUTED columns and stores g_idx, which
  this layout cannot express. Of the two, the default sees the updates of the earlier columns (GPTQ's grids
  adapt to the weights the error feedback produced): on the synthetic outlier layers of tests/quant/
  test_gptq_awq.py, 4 bits, it measured -0.1..+1.0 dB of output SQNR against static groups (block 32 gains
  most: more blocks are entered after many updates). Without act_order, static groups only lose the updates.
- Loss (stats `loss`): tr(E H E^T) with the H given (the undamped output error times 2 / n), computed for free from
  the per-column errors: with Err the errors divided by diag U, E = Err U, so tr(E H_d E^T) = ||Err||^2 for the
  damped H_d, and tr(E H E^T) = ||Err||^2 - lambda ||E||^2 - (dead columns' ||E_j||^2).

Arithmetic: float32 for the weights and U (float64 when W is float64, e.g. for tests), float64 for H and its
factorisation. Memory: W, U and H once each plus a batch. Speed (`python benchmarks/bench_gptq_awq.py`, a
4096 x 4096 layer, block 128, 1 BLAS thread, load ~4 on 2 cores): 5-6 CPU-s (3 of them the float64 factor of
H), 6-8 s wall; with BLAS's 2 threads on the loaded machine, 9-15 CPU-s: callers should hold BLAS to 1 thread
(as seq_mse.blas_threads does).
"""
from __future__ import annotations

import time
from typing import Optional

import numpy as np

from qcompiler.passes.quantize.weight_blocks import TINY, GridFn, n_blocks, quantize_codes, rtn_grid

from threadpoolctl import threadpool_limits

from qcompiler.passes.quantize.plan_weights import stored_nk, weight_value
from qcompiler.passes.quantize.weight_grid import block_grid_fn, weight_sqnr_db
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.progress import bar
from qcompiler.quant.calibration.weight_inputs import DEFAULT_SAMPLES, chunks, input_groups, require_samples, stream_rows
from qcompiler.quant.core.block_grid import BlockGrid
from qcompiler.quant.core.context import QuantPass

DAMP_TRIES = 6          # lambda = damp * mean(diag H) * 10**t, t = 0..DAMP_TRIES-1
SUB_BATCH = 16          # columns per rank-1 sub-batch inside a lazy batch
INV_BASE = 256          # triangular inverse: blocks up to this size go to np.linalg.inv
HESSIAN_ROWS = 4096     # rows per X^T X product (float32 rows: a float32 product per chunk, summed in float64)


def accumulate_hessian(h: Optional[np.ndarray], x_rows: np.ndarray, count: int) -> tuple:
    """Fold rows x [m, K] (any leading dims, flattened) into the running H = 2 X^T X / n: returns (H, count + m).
    `h` None starts a float64 zero matrix; otherwise it is updated in place. Float32 rows are multiplied in float32
    (HESSIAN_ROWS at a time) and summed in float64, other dtypes in float64."""
    x = np.asarray(x_rows)
    x = x.reshape(-1, x.shape[-1])
    if x.dtype != np.float32:
        x = x.astype(np.float64, copy=False)
    m, k = x.shape
    if h is None:
        h = np.zeros((k, k), np.float64)
    if m == 0:
        return h, count
    total = count + m
    h *= count / total
    for r in range(0, m, HESSIAN_ROWS):
        xr = x[r:r + HESSIAN_ROWS]
        h += (2.0 / total) * (xr.T @ xr)
    return h, total


def _inv_upper(t: np.ndarray) -> np.ndarray:
    """Inverse of an upper triangular matrix, by 2x2 blocks (matrix products; no LU of the whole)."""
    n = t.shape[0]
    if n <= INV_BASE:
        return np.triu(np.linalg.inv(t))
    m = n // 2
    a, d = _inv_upper(t[:m, :m]), _inv_upper(t[m:, m:])
    out = np.zeros_like(t)
    out[:m, :m], out[m:, m:] = a, d
    out[:m, m:] = -(a @ t[:m, m:]) @ d
    return out


def inverse_cholesky(h: np.ndarray, damp: float) -> tuple:
    """(U, lambda, retries): U upper with U^T U = (H + lambda I)^-1, lambda = damp * mean(diag H) grown 10x until
    the factorisation succeeds."""
    k = h.shape[0]
    base = float(np.mean(np.diag(h)))
    base = base if np.isfinite(base) and base > 0 else 1.0
    idx = np.arange(k)
    for t in range(DAMP_TRIES):
        lam = (damp * 10.0 ** t if damp > 0 else (0.0 if t == 0 else 1e-6 * 10.0 ** t)) * base
        hd = h[::-1, ::-1].copy()
        hd[idx, idx] += lam
        try:
            lr = np.linalg.cholesky(hd)
        except np.linalg.LinAlgError:
            continue
        u = _inv_upper(np.ascontiguousarray(lr[::-1, ::-1]))
        if np.all(np.isfinite(u)) and np.all(np.diag(u) > 0):
            return u, lam, t
    raise np.linalg.LinAlgError(f"GPTQ: H + lambda I is not positive definite even with lambda = {lam:.3g}")


def gptq_quantize(w: np.ndarray, hessian: np.ndarray, bits: int, block_size: Optional[int], symmetric: bool = True,
                  grid_fn: Optional[GridFn] = None, act_order: bool = True, damp: float = 0.01,
                  lazy_batch: int = 128, static_groups: bool = False) -> tuple:
    """GPTQ of W [N, K] with H [K, K] (`accumulate_hessian`): (q uint8 [N, K], scales float32 [N, nb],
    zero points uint8 [N, nb], stats dict). See the module docstring for groups under act_order."""
    t0 = time.perf_counter()
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"GPTQ: the weight must be [N, K], got shape {w.shape}")
    n, k = w.shape
    h = np.array(hessian, np.float64)
    if h.shape != (k, k):
        raise ValueError(f"GPTQ: H must be [{k}, {k}] for a weight [{n}, {k}], got {h.shape}")
    if not (np.all(np.isfinite(w)) and np.all(np.isfinite(h))):
        raise ValueError("GPTQ: the weight or H has non-finite values")
    if not 1 <= int(bits) <= 8:
        raise ValueError(f"GPTQ: bits must be 1..8 (uint8 codes), got {bits}")
    dtype = np.float64 if w.dtype == np.float64 else np.float32
    grid_fn = grid_fn or rtn_grid(bits, symmetric)
    b, nb = n_blocks(k, block_size)
    lazy_batch = max(1, int(lazy_batch))

    dead = np.diag(h) <= 0
    h[dead, :] = 0.0
    h[:, dead] = 0.0
    h[dead, dead] = 1.0
    perm = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(k)
    inv_perm = np.argsort(perm)
    h = h[perm][:, perm]
    u, lam, retries = inverse_cholesky(h, damp)
    del h
    u = u.astype(dtype, copy=False)
    udiag = np.diag(u).copy()

    wt = np.ascontiguousarray(w.T[perm], dtype=dtype)       # [K, N]: column j of the permuted W is row j
    scales = np.empty((n, nb), np.float32)
    zps = np.empty((n, nb), np.uint8)
    have = np.zeros(nb, bool)
    if static_groups:
        w32 = np.asarray(w, dtype)
        for g in range(nb):
            scales[:, g], zps[:, g] = _grid(grid_fn, w32[:, g * b:(g + 1) * b])
        have[:] = True
    block_of = perm // b
    codes_t = np.empty((k, n), np.uint8)
    err = np.empty((min(lazy_batch, k), n), dtype)        # the lazy batch's errors, already divided by diag U
    loss_damped = 0.0

    for i1 in range(0, k, lazy_batch):
        i2 = min(i1 + lazy_batch, k)
        for s1 in range(i1, i2, SUB_BATCH):
            s2 = min(s1 + SUB_BATCH, i2)
            for j in range(s1, s2):
                g = block_of[j]
                if not have[g]:
                    scales[:, g], zps[:, g] = _grid(grid_fn, _current_block(wt, u, err, inv_perm[g * b:(g + 1) * b],
                                                                            j, s1, s2, i1, i2).T)
                    have[g] = True
                s = scales[:, g].astype(dtype)
                z = zps[:, g].astype(dtype)
                col = wt[j]
                q = quantize_codes(col, s, z, bits)
                codes_t[j] = q
                e = (col - (q - z) * s) / udiag[j]
                err[j - i1] = e
                if j + 1 < s2:
                    wt[j + 1:s2] -= np.outer(u[j, j + 1:s2], e)
            if s2 < i2:
                wt[s2:i2] -= u[s1:s2, s2:i2].T @ err[s1 - i1:s2 - i1]
        e_b = err[:i2 - i1]
        loss_damped += float(np.einsum("ij,ij->", e_b, e_b, dtype=np.float64))
        if i2 < k:
            wt[i2:] -= u[i1:i2, i2:].T @ e_b

    q = np.ascontiguousarray(codes_t[inv_perm].T)
    e_sq = _column_error_powers(w, q, scales, zps, b)
    loss = loss_damped - lam * float(e_sq.sum()) - float(e_sq[dead].sum())
    stats = {"loss": max(loss, 0.0), "loss_damped": loss_damped, "damp": lam, "damp_retries": retries,
             "dead_inputs": int(dead.sum()), "act_order": bool(act_order), "static_groups": bool(static_groups),
             "seconds": time.perf_counter() - t0}
    return q, scales, zps, stats


def _grid(grid_fn: GridFn, w_block: np.ndarray) -> tuple:
    """grid_fn on one block, its scales kept finite and non-zero (a zero scale would divide by zero).

    NOTE: a symmetric block grid's scale may be negative (block_grid puts the block's largest magnitude on code
    -2**(bits-1) whatever its sign); replacing those by TINY cost the symmetric grids (trt's form) all their
    accuracy: 21 -> 4 dB logits SQNR on the test decoder."""
    scale, zp = grid_fn(w_block)
    scale = np.asarray(scale, np.float32)
    return np.where(np.isfinite(scale) & (scale != 0), scale, np.float32(TINY)), zp


def _column_error_powers(w, q, scales, zps, b, rows: int = 1024) -> np.ndarray:
    """sum_n (W - dequant(q))[n, j]^2 per column j, float64, in chunks of rows."""
    k = w.shape[1]
    from_blocks = np.repeat(np.arange(scales.shape[1]), b)[:k]
    out = np.zeros(k, np.float64)
    for r in range(0, w.shape[0], rows):
        sl = slice(r, r + rows)
        wq = (q[sl].astype(np.float64) - zps[sl][:, from_blocks]) * scales[sl][:, from_blocks]
        e = np.asarray(w[sl], np.float64) - wq
        out += np.einsum("ij,ij->j", e, e)
    return out


def _current_block(wt, u, err, pos, j, s1, s2, i1, i2) -> np.ndarray:
    """Rows `pos` (permuted positions, all >= j) of W^T with every update of the columns before j applied: those
    in [j, s2) are current, those in [s2, i2) miss the sub-batch's updates since s1, later ones the lazy batch's
    since i1."""
    cur = wt[pos].copy()
    mid = (pos >= s2) & (pos < i2)
    late = pos >= i2
    if j > s1 and mid.any():
        cur[mid] -= u[s1:j, pos[mid]].T @ err[s1 - i1:j - i1]
    if j > i1 and late.any():
        cur[late] -= u[i1:j, pos[late]].T @ err[:j - i1]
    return cur


# ---- pass class (added at integration) -------------------------------------------------------------------------


HESSIAN_BUDGET = 512 << 20     # bytes of Hessians held at once (float64 K x K per input group)


@register_pass
class GPTQ(QuantPass):
    """`gptq` (optional, `--recipe gptq`, weight-only): GPTQ codes instead of round-to-nearest for every
    MatMul/Gemm/head weight of the weight-only plan, from Hessians of the layers' float inputs on the
    calibration samples, a chunk of input groups at a time (qcompiler/quant/calibration/weight_inputs.py). Each
    block's grid is the same search as round-to-nearest's (block_grid), chosen when GPTQ first reaches it."""

    name = "gptq"
    description = "weight-only: GPTQ (blockwise, damped Hessian, act-order, lazy batches) instead of round-to-nearest"
    preserves_semantics = False
    requires = ("quant-context", "weight-grids")
    after = "weight-grid"

    def run(self, ctx) -> PassResult:
        require_samples(ctx, "gptq")
        g = ctx.model.graph
        groups = input_groups(ctx)
        done, loss = 0, 0.0
        todo = len({id(j) for jobs in groups.values() for j in jobs})
        with bar("gptq", todo, ctx.settings.progress) as progress:
            for names in chunks(groups, lambda n, jobs: 8 * jobs[0].k ** 2, HESSIAN_BUDGET):
                hess = dict.fromkeys(names)
                counts = dict.fromkeys(names, 0)

                def add(name, rows):
                    hess[name], counts[name] = accumulate_hessian(hess[name], rows, counts[name])
                stream_rows(ctx, names, add, max_samples=ctx.settings.limit or DEFAULT_SAMPLES)
                for name in names:
                    for job in groups[name]:
                        if job.algorithm.startswith("gptq") or hess[name] is None:
                            continue          # a weight two inputs read (none here): the first one's Hessian
                        w = stored_nk(job, weight_value(g, job.weight))
                        with threadpool_limits(1, "blas"):   # its many small products: one BLAS thread
                            q, scales, zps, stats = gptq_quantize(w, hess[name], job.bits, job.block_size,
                                                                  symmetric=job.symmetric,
                                                                  grid_fn=block_grid_fn(job.bits, job.symmetric))
                        job.grid = BlockGrid(q, scales, zps, job.bits, job.block_size, job.symmetric)
                        job.sqnr_db = weight_sqnr_db(w, job.grid)
                        job.algorithm = "gptq" if not job.algorithm.startswith("awq") else "awq+gptq"
                        loss += float(stats.get("loss", 0.0))
                        done += 1
                        progress.update(1)
                hess.clear()
        return PassResult(False, {"layers": done, "loss": round(loss, 6)})
