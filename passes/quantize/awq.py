"""AWQ weight-only quantization (Lin et al. 2024, "AWQ: Activation-aware Weight Quantization for LLM Compression and
Acceleration"), the numerics in numpy.

A few input channels of an LLM layer carry most of the activation energy; their weights matter most for the
output. For a linear layer y = W x (W [N, K]) and a per-input-channel s > 0, X W^T = (X / s) (W * s)^T exactly,
and quantizing W * s instead of W shrinks the relative rounding error of the salient columns (the block's grid
is set by the other weights, so a scaled-up column is rounded relatively finer). Two searches, both on sample
rows of the layer input X:

- `awq_search` / `awq_search_shared`: s = m^alpha, m_k = mean|X_k| over the rows, normalised by sqrt(max * min)
  (the reference's normalisation, so that s is centred around 1 on a log scale), alpha in i / n_grid,
  i = 0..n_grid-1 (as the reference: alpha = 0 is s = 1, plain rounding, so the search never loses against it
  on the sample). Each alpha is scored by the output error || X W^T - (X / s) Q(W * s)^T ||^2; per chunk of
  output channels all the candidates are gridded in one call (one block a row), then scored one by one. Layers reading one input (q/k/v, gate/up) share one
  s: their errors are summed. The error is measured through F with F^T F = X^T X on at most `max_rows`
  random rows of X: F = X when rows <= K, else the Cholesky factor of X^T X (K x K).
- `awq_clip_search`: per (output channel, block) the clipping ratio r in 1 - i / n_grid, i < max_shrink *
  n_grid (1.0 down to 0.55 by default), of the block's range: the weights are clamped to +-r max|w| (AWQ's
  auto_clip) and the grid is the min/max grid of the clamped block. Each (row, block) takes the ratio with the
  least error of its own contribution to the output, e^T G_g e with G_g = X_g^T X_g over X's columns of that
  block (the reference's measure: per output channel and group). r = 1 is a candidate, so the block-local error
  never rises. X here is the input the scaled weight reads (X / s). The reference skips clipping for the
  query/key projections (attention scores are sensitive to it); that is the caller's choice.

Shared layout and default grid: qcompiler/passes/quantize/weight_blocks.py. Arithmetic in float32 (sums of squares
in float64); memory: at most `max_rows` rows of X and chunks of output channels of about CHUNK_ELEMS elements.
Speed, the trained 3.5 M decoder of benchmarks/llm (12 groups, K 256-768, 4096 rows, block 32, the "mse" grid;
load ~4 on 2 cores): the pass 14 CPU-s, ~9 of them the grid search of the 20 alphas (block_grid), 0.5 the clip
search. All on one BLAS thread: two OpenBLAS threads spin on a shared machine (the 768 x 768 Cholesky factor took
20x the CPU) and make the factor's last bits depend on the core count.
"""
from __future__ import annotations

import copy
from typing import Optional, Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from qcompiler.passes.quantize.weight_blocks import (
    TINY,
    GridFn,
    expand_blocks,
    fake_quantize,
    n_blocks,
    quantize_codes,
    rtn_quantize,
)

from qcompiler.passes.quantize.plan_weights import stored_nk
from qcompiler.passes.quantize.weight_mixed_precision import Evaluator, dequantized, first_samples, measurable
from qcompiler.passes.quantize.weight_grid import block_grid_fn, grid_search, weight_sqnr_db
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.calibration.weight_inputs import chunks, input_groups, require_samples, first_rows
from qcompiler.quant.core.block_grid import BlockGrid, block_grid
from qcompiler.quant.core.context import QuantPass

CHUNK_ELEMS = 1 << 22    # float32 elements per chunk of output channels (x a few temporaries)
SCALE_FLOOR = 1e-4       # the reference clamps m^alpha at 1e-4 before normalising


def sample_rows(x: np.ndarray, max_rows: Optional[int], seed: int = 0) -> np.ndarray:
    """X flattened to [n, K] float32, at most `max_rows` rows drawn uniformly without replacement (fixed seed)."""
    x = np.asarray(x)
    x = x.reshape(-1, x.shape[-1])
    if max_rows and x.shape[0] > max_rows:
        rows = np.sort(np.random.default_rng(seed).choice(x.shape[0], int(max_rows), replace=False))
        x = x[rows]
    return np.ascontiguousarray(x, np.float32)


def awq_scale(mean_abs: np.ndarray, alpha: float) -> np.ndarray:
    """s = max(m^alpha, 1e-4) / sqrt(max * min), float32 [K]."""
    s = np.maximum(np.asarray(mean_abs, np.float64) ** alpha, SCALE_FLOOR)
    return (s / np.sqrt(s.max() * s.min())).astype(np.float32)


def gram_factor(x: np.ndarray) -> np.ndarray:
    """F float32 with F^T F = X^T X: X itself when it has no more rows than columns, else chol(X^T X)^T."""
    n, k = x.shape
    if n <= k:
        return x
    g = x.T.astype(np.float64) @ x.astype(np.float64)
    g[np.diag_indices(k)] += 1e-12 * max(float(np.trace(g)) / k, TINY)
    return np.linalg.cholesky(g).T.astype(np.float32)


def _chunk_rows(n: int, k: int) -> int:
    return max(1, min(n, CHUNK_ELEMS // max(k, 1)))


def scaled_error(f: np.ndarray, w: np.ndarray, s: np.ndarray, bits: int, block_size: Optional[int],
                 symmetric: bool, grid_fn: Optional[GridFn] = None) -> float:
    """|| F (W - Q(W * s) / s)^T ||^2 (float64): the output error of W with s folded, by chunks of rows of W."""
    return scaled_errors(f, w, [s], bits, block_size, symmetric, grid_fn)[0]


def scaled_errors(f: np.ndarray, w: np.ndarray, ss: Sequence[np.ndarray], bits: int, block_size: Optional[int],
                  symmetric: bool, grid_fn: Optional[GridFn] = None) -> list:
    """`scaled_error` of every scale in `ss`: per chunk of rows of W, as many candidates as fit in CHUNK_ELEMS
    are quantized in one call (the grid search costs per call, not per row), each scored on its own."""
    n, k = w.shape
    ss = np.asarray(ss).reshape(-1, k)
    totals = [0.0] * len(ss)
    step = _chunk_rows(n, max(k, f.shape[0]))
    for r in range(0, n, step):
        wc = np.asarray(w[r:r + step], np.float32)
        per = max(1, CHUNK_ELEMS // wc.size)
        for c0 in range(0, len(ss), per):
            sc = ss[c0:c0 + per, None, :]
            ws = wc * sc                                                      # [candidates, rows, K]
            e = fake_quantize(ws.reshape(-1, k), bits, block_size, symmetric, grid_fn).reshape(ws.shape)
            e /= sc
            np.subtract(wc, e, out=e)
            for i in range(len(e)):
                out = f @ e[i].T
                totals[c0 + i] += float(np.einsum("ij,ij->", out, out, dtype=np.float64))
    return totals


def awq_search_shared(ws: Sequence[np.ndarray], x_sample: np.ndarray, bits: int, block_size: Optional[int],
                      symmetric: bool, grid_fn: Optional[GridFn] = None, n_grid: int = 20,
                      max_rows: Optional[int] = 1024, seed: int = 0, f: Optional[np.ndarray] = None) -> tuple:
    """One AWQ scale s [K] for the weights `ws` (each [N_i, K]) reading the same input: (s float32, info).
    `f`: the caller's gram_factor of the same sampled rows, when it has it."""
    x = np.asarray(x_sample)
    x = x.reshape(-1, x.shape[-1])
    k = x.shape[1]
    for w in ws:
        if np.ndim(w) != 2 or np.shape(w)[1] != k:
            raise ValueError(f"AWQ: every weight must be [N, {k}] for an input [n, {k}], got {np.shape(w)}")
    mean_abs = np.abs(x).mean(axis=0, dtype=np.float64)
    if f is None:
        f = gram_factor(sample_rows(x, max_rows, seed))
    alphas = [i / n_grid for i in range(max(1, int(n_grid)))]
    cands = [awq_scale(mean_abs, a) for a in alphas]
    per_w = [scaled_errors(f, w, cands, bits, block_size, symmetric, grid_fn) for w in ws]
    losses = []
    best = (np.inf, 0.0, np.ones(k, np.float32))
    for i, (a, s) in enumerate(zip(alphas, cands)):
        loss = sum(errs[i] for errs in per_w)
        losses.append(loss)
        if loss < best[0]:
            best = (loss, a, s)
    info = {"alpha": best[1], "loss": best[0], "loss_rtn": losses[0], "alphas": alphas, "losses": losses,
            "rows": int(min(x.shape[0], max_rows or x.shape[0]))}
    return best[2], info


def awq_search(w: np.ndarray, x_sample: np.ndarray, bits: int, block_size: Optional[int], symmetric: bool,
               grid_fn: Optional[GridFn] = None, n_grid: int = 20, max_rows: Optional[int] = 1024,
               seed: int = 0) -> tuple:
    """AWQ scale s [K] of one weight W [N, K] read by X: (s float32, info)."""
    return awq_search_shared([w], x_sample, bits, block_size, symmetric, grid_fn, n_grid, max_rows, seed)


def block_grams(x: np.ndarray, b: int, nb: int) -> np.ndarray:
    """G_g = X_g^T X_g [nb, b, b] float32 for the blocks of X's columns (the last one zero-padded)."""
    n, k = x.shape
    xp = np.zeros((n, nb * b), np.float32)
    xp[:, :k] = x
    xb = xp.reshape(n, nb, b).transpose(1, 0, 2)
    return np.matmul(xb.transpose(0, 2, 1), xb)


def clip_grid(lo: np.ndarray, hi: np.ndarray, bits: int, symmetric: bool) -> tuple:
    """Min/max grid of the range [lo, hi] (widened to include 0): (scale float32, zero point float32)."""
    lo = np.minimum(lo, 0.0)
    hi = np.maximum(hi, 0.0)
    if symmetric:
        scale = np.maximum(np.maximum(-lo, hi) / (2 ** (bits - 1) - 1), TINY).astype(np.float32)
        return scale, np.full(scale.shape, 2 ** (bits - 1), np.float32)
    levels = 2 ** bits - 1
    scale = np.maximum((hi - lo) / levels, TINY).astype(np.float32)
    return scale, np.clip(np.rint(-lo / scale), 0, levels).astype(np.float32)


def awq_clip_search(w_scaled: np.ndarray, x_sample: np.ndarray, bits: int, block_size: Optional[int],
                    symmetric: bool, n_grid: int = 20, max_shrink: float = 0.5,
                    max_rows: Optional[int] = 4096, seed: int = 0, base: Optional[tuple] = None) -> tuple:
    """AWQ's clipping search on the scaled weight [N, K] read by the scaled input X / s: (q uint8 [N, K],
    scales float32 [N, nb], zero points uint8 [N, nb], info). `base` (scales, zero points [N, nb]): a grid
    to keep per block unless a clipped one has less error there (the round-to-nearest grid, so that a block
    never ends on a grid worse than the one the caller would write without AWQ)."""
    w = np.asarray(w_scaled, np.float32)
    n, k = w.shape
    b, nb = n_blocks(k, block_size)
    x = sample_rows(x_sample, max_rows, seed)
    grams = block_grams(x, b, nb)
    ratios = [1.0 - i / n_grid for i in range(max(1, int(max_shrink * n_grid)))]
    scales = np.empty((n, nb), np.float32)
    zps = np.empty((n, nb), np.float32)
    best_ratio = np.empty((n, nb), np.float32)
    err_first = err_best = 0.0
    step = _chunk_rows(n, nb * b * 4)
    for r in range(0, n, step):
        m = min(step, n - r)
        wb = np.zeros((m, nb * b), np.float32)
        wb[:, :k] = w[r:r + m]
        wb = wb.reshape(m, nb, b)
        amax = np.abs(wb).max(axis=-1)
        wmin, wmax = wb.min(axis=-1), wb.max(axis=-1)
        best = np.full((m, nb), np.inf)
        for ratio in ([None] if base is not None else []) + ratios:
            if ratio is None:
                sc = np.asarray(base[0][r:r + m], np.float32)
                zp = np.asarray(base[1][r:r + m], np.float32)
                ratio = np.float32(np.nan)
            else:
                lim = amax * np.float32(ratio)
                sc, zp = clip_grid(np.maximum(wmin, -lim), np.minimum(wmax, lim), bits, symmetric)
            q = quantize_codes(wb, sc[..., None], zp[..., None], bits)
            e = (wb - (q - zp[..., None]) * sc[..., None]).transpose(1, 0, 2)      # [nb, m, b]
            err = np.einsum("gmi,gmi->mg", np.matmul(e, grams), e, dtype=np.float64)
            take = err < best
            best = np.where(take, err, best)
            scales[r:r + m] = np.where(take, sc, scales[r:r + m])
            zps[r:r + m] = np.where(take, zp, zps[r:r + m])
            best_ratio[r:r + m] = np.where(take, ratio, best_ratio[r:r + m])
            if np.isnan(ratio) or (base is None and ratio == ratios[0]):
                err_first += float(err.sum())
        err_best += float(best.sum())
    zps = zps.astype(np.uint8)
    q = quantize_codes(w, expand_blocks(scales, k, b), expand_blocks(zps.astype(np.float32), k, b), bits)
    info = {"mean_ratio": float(np.nanmean(best_ratio)) if not np.isnan(best_ratio).all() else 1.0,
            "clipped": float((best_ratio < 1.0).mean()), "kept_base": float(np.isnan(best_ratio).mean()),
            "block_loss_noclip": err_first, "block_loss": err_best}
    return q.astype(np.uint8), scales, zps, info


def awq_quantize_shared(ws: Sequence[np.ndarray], x_sample: np.ndarray, bits: int, block_size: Optional[int],
                        symmetric: bool, grid_fn: Optional[GridFn] = None, n_grid: int = 20, clip: bool = True,
                        max_rows: Optional[int] = 1024, seed: int = 0) -> tuple:
    """The whole of AWQ for weights sharing one input: (s [K], [(q, scales, zero points) per weight], info).
    The codes are of W * s; the model must divide its input by s (fold 1/s into the producer)."""
    s, info = awq_search_shared(ws, x_sample, bits, block_size, symmetric, grid_fn, n_grid, max_rows, seed)
    out = []
    clips = []
    xs = np.asarray(x_sample, np.float32).reshape(-1, s.shape[0]) / s if clip else None
    for w in ws:
        w_scaled = np.asarray(w, np.float32) * s
        if clip:
            q, sc, zp, ci = awq_clip_search(w_scaled, xs, bits, block_size, symmetric, n_grid, seed=seed)
            clips.append(ci)
        else:
            q, sc, zp = rtn_quantize(w_scaled, bits, block_size, symmetric, grid_fn)
        out.append((q, sc, zp))
    info["clip"] = clips
    return s, out, info


# ---- pass class (added at integration) -------------------------------------------------------------------------


AWQ_ROWS = 4096          # input rows sampled per group for the searches
AWQ_SAMPLES = 64
AWQ_ROW_BUDGET = 512 << 20


def fold_target(x, k: int):
    """Where a per-channel 1/s on activation `x` can be folded so the graph computes the same thing: (node,
    input slot, axis) of a constant whose entries along `axis` scale x's last axis — a norm's gamma (`Mul` by a
    constant vector), the output columns of the MatMul that produced x (through an element-wise Mul with another
    activation: SiLU(gate) * up, and attention's `probs @ v`, which scale v's columns). None: nothing to fold into
    (AWQ then leaves the group on round-to-nearest). The constant must be read by that node only."""
    seen = 0
    while x is not None and x.producer is not None and seen < 4:
        p, seen = x.producer, seen + 1
        if p.op_type == "Mul" and len(p.inputs) == 2:
            consts = [i for i, v in enumerate(p.inputs) if v is not None and v.tensor is not None]
            if len(consts) == 1:
                c = p.inputs[consts[0]]
                shape = c.shape or ()
                if len(shape) >= 1 and shape[-1] == k and all(d == 1 for d in shape[:-1]) and len(c.uses()) == 1:
                    return p, consts[0], len(shape) - 1
                return None
            if not consts:     # activation * activation: scale one side (the one a MatMul made)
                for v in p.inputs:
                    q = v.producer if v is not None else None
                    if q is not None and q.op_type == "MatMul" and len(v.uses()) == 1:
                        x = v
                        break
                else:
                    return None
                continue
            return None
        if p.op_type == "MatMul" and len(p.inputs) == 2:
            w = p.inputs[1]
            if w is not None and w.tensor is not None and w.shape is not None and len(w.shape) == 2 \
                    and len(w.uses()) == 1:
                return p, 1, 1
            if w is not None and w.tensor is None and len(w.uses()) == 1:   # probs @ v: scale v
                x = w
                continue
            return None
        return None
    return None


@register_pass
class AWQ(QuantPass):
    """`awq` (optional, `--recipe awq`, weight-only): activation-aware scales and clipped grids. For each group
    of layers reading one activation, a per-input-channel scale s (searched from the activations' magnitudes on
    the calibration data) multiplies the weights' input channels and divides the activation, folded into the op
    that made it (a norm's gamma, the previous projection's columns); then each block's clipping ratio is
    searched on the layer output error. A group with nothing to fold into keeps round-to-nearest (the report
    names it)."""

    name = "awq"
    description = "weight-only: AWQ per-channel scales folded into the previous op, then clipped grids"
    preserves_semantics = True
    requires = ("quant-context", "weight-plan")
    after = "plan-weights"

    def run(self, ctx) -> PassResult:
        require_samples(ctx, "awq")
        g = ctx.model.graph
        groups = input_groups(ctx)
        search = grid_search(ctx.weight_plan)
        guard = ModelGuard(ctx, search) if measurable(ctx) else None
        undo = []
        scaled, skipped, kept_rtn = 0, [], []
        loss_rtn = loss_awq = 0.0
        # downstream groups first: a group's scale may be folded into an upstream layer's weight (v_proj's
        # columns for o_proj), which that layer's own search must then see
        for names in reversed(chunks(groups, lambda n, jobs: 4 * AWQ_ROWS * jobs[0].k, AWQ_ROW_BUDGET)):
            rows = first_rows(ctx, names, AWQ_ROWS, AWQ_SAMPLES)
            for name in reversed(names):
                jobs = [j for j in groups[name] if j.grid is None and not j.tied]
                x = rows[name]
                target = fold_target(g.value(name), jobs[0].k) if jobs and len(jobs) == len(groups[name]) else None
                if not jobs or x is None or target is None or any(len(_linear_inputs(ctx, j)) != 1 for j in jobs) \
                        or not _only_readers(g.value(name), jobs):
                    if jobs:
                        skipped.append(name)
                    continue
                result = awq_group(jobs, [stored_nk(j, g.initializers[j.weight]) for j in jobs], x, search)
                loss_rtn += result["loss_rtn"]
                if result["s"] is None:
                    kept_rtn.append(name)
                    loss_awq += result["loss_rtn"]
                    continue
                loss_awq += result["loss"]
                s = result["s"]
                undo.append((target[0].inputs[target[1]], np.asarray(target[0].inputs[target[1]].tensor.numpy()),
                             target[0]))
                _fold(g, target, 1.0 / s)
                for job, ws_, grid in zip(jobs, result["weights"], result["grids"]):
                    undo.append((job, np.asarray(g.initializers[job.weight].tensor.numpy_uncached()), None))
                    job.grid = grid
                    job.sqnr_db = weight_sqnr_db(ws_, grid)
                    job.algorithm = "awq"
                    job.input_scale = s
                    _set_weight(g, job, ws_)
                    scaled += 1
        if guard is not None and scaled:
            drop_rtn, drop_awq = guard.drop_rtn, guard.drop_now()
            if not drop_awq < drop_rtn:
                _undo(g, undo)
                ctx.notes.append(f"awq: the whole model keeps round-to-nearest: with AWQ its output error on "
                                 f"{len(guard.samples)} calibration samples is {drop_awq:.4g}, against {drop_rtn:.4g} "
                                 f"without")
                return PassResult(True, {"layers": 0, "reverted": scaled, "drop_rtn": drop_rtn,
                                         "drop_awq": drop_awq})
        if skipped:
            ctx.notes.append(f"awq: {len(skipped)} layer groups keep round-to-nearest (no op before them to fold "
                             f"the scales into, or a reader outside the group): "
                             f"{', '.join(n[:40] for n in skipped[:5])}")
        if kept_rtn:
            ctx.notes.append(f"awq: {len(kept_rtn)} layer groups keep round-to-nearest (no scale or clipping "
                             f"beat it on the calibration rows): {', '.join(n[:40] for n in kept_rtn[:5])}")
        return PassResult(True, {"layers": scaled, "skipped_groups": len(skipped), "kept_rtn_groups": len(kept_rtn),
                                 "output_loss_rtn": loss_rtn, "output_loss": loss_awq})


def grid_output_error(f: np.ndarray, w: np.ndarray, grid: BlockGrid, s: Optional[np.ndarray] = None) -> float:
    """|| F (W - deq(grid) / s)^T ||^2 (float64), by chunks of rows of W: the output error the grid gives."""
    n, k = w.shape
    total = 0.0
    step = _chunk_rows(n, max(k, f.shape[0]))
    for r in range(0, n, step):
        rows = slice(r, min(n, r + step))
        e = grid.dequantize(rows)
        if s is not None:
            e /= s
        np.subtract(np.asarray(w[rows], np.float32), e, out=e)
        out = f @ e.T
        total += float(np.einsum("ij,ij->", out, out, dtype=np.float64))
    return total


def awq_group(jobs, ws, x: np.ndarray, search: str) -> dict:
    """AWQ for the weights of one group read by the rows `x`, held against round-to-nearest on the same
    objective (the group's output error on the sampled rows): the scale search scores every alpha with the
    round-to-nearest grid the plan would write (alpha = 0 is exactly it), the clipping search keeps that grid
    per block unless a clipped one is better, and the group keeps plain round-to-nearest (s None) unless the
    result beats it. Returns s, the scaled weights and their grids, and both losses.
    BLAS on one thread (the module docstring says why)."""
    with threadpool_limits(1, "blas"):
        return _awq_group(jobs, ws, x, search)


def _awq_group(jobs, ws, x: np.ndarray, search: str) -> dict:
    f = gram_factor(sample_rows(x, AWQ_ROWS))
    j0 = jobs[0]
    grid_fn = block_grid_fn(j0.bits, j0.symmetric, search)
    s, _ = awq_search_shared(ws, x, j0.bits, j0.block_size, j0.symmetric, grid_fn=grid_fn, max_rows=AWQ_ROWS, f=f)
    rtn = [block_grid(w, j.bits, j.block_size, symmetric=j.symmetric, search=search) for j, w in zip(jobs, ws)]
    loss_rtn = sum(grid_output_error(f, w, gr) for w, gr in zip(ws, rtn))
    xs = x / s[None, :]
    weights, grids = [], []
    for job, w in zip(jobs, ws):
        ws_ = w * s[None, :]
        base = block_grid(ws_, job.bits, job.block_size, symmetric=job.symmetric, search=search)
        q, scales, zps, _ = awq_clip_search(ws_, xs, job.bits, job.block_size, job.symmetric,
                                            base=(base.scales, base.zero_points))
        weights.append(ws_)
        grids.append(BlockGrid(q=q, scales=scales, zero_points=zps, bits=job.bits, block_size=job.block_size,
                               symmetric=job.symmetric))
    loss = sum(grid_output_error(f, w, gr, s) for w, gr in zip(ws, grids))
    if not loss < loss_rtn:
        return {"s": None, "loss_rtn": loss_rtn, "loss": loss}
    return {"s": s, "weights": weights, "grids": grids, "loss_rtn": loss_rtn, "loss": loss}


GUARD_SAMPLES = 16


class ModelGuard:
    """The whole model's output error on the first GUARD_SAMPLES calibration samples with every weight on its
    grid: before AWQ (every weight on its round-to-nearest grid) and after. Per-group gains on the layers' own
    float inputs need not add up (the errors of successive layers compound), so the pass keeps AWQ only where
    the model as a whole is closer to float with it."""

    def __init__(self, ctx, search: str):
        self.ctx, self.search = ctx, search
        self.jobs = list(ctx.weight_plan.jobs.values())
        self.samples = first_samples(ctx, GUARD_SAMPLES)
        self.drop_rtn = self._drop()

    def _drop(self) -> float:
        ev = Evaluator(self.ctx, self.jobs, self.samples)
        planned = {j.weight: dequantized(j if j.grid is not None else self._rtn(j, ev.floats[j.weight]),
                                         ev.floats[j.weight]) for j in self.jobs}
        return ev.drop(planned, range(len(self.samples)))

    def drop_now(self) -> float:
        return self._drop()

    def _rtn(self, job, arr):
        alt = copy.copy(job)
        w = np.asarray(arr, np.float32)
        alt.grid = block_grid(w if job.rows_axis == 0 else w.T, job.bits, job.block_size, symmetric=job.symmetric,
                              search=self.search)
        return alt


def _undo(g, undo) -> None:
    """Put back what the pass changed, newest first: folded constants and scaled weights, and the jobs' grids."""
    for what, orig, writer in reversed(undo):
        if writer is not None:
            g.set_constant(what, orig, writer=writer)
            continue
        what.grid, what.sqnr_db, what.algorithm, what.input_scale = None, None, "", None
        v = g.initializers[what.weight]
        v.tensor = type(v.tensor).from_array(np.ascontiguousarray(orig))


def _only_readers(x, jobs) -> bool:
    """Whether every node reading `x` is a linear reader of one of `jobs` (folding 1/s into x's producer must
    change nothing else) and x is no graph output."""
    readers = {r for j in jobs for r, kind in j.readers}
    return all(not u.is_graph_output and u.user.name in readers for u in x.uses())


def _linear_inputs(ctx, job):
    nodes = {n.name: n for n in ctx.model.graph.nodes}
    return {nodes[r].inputs[0].name if r in nodes else r for r, kind in job.readers
            if kind in ("matmul", "gemm", "head")}


def _fold(g, target, factor: np.ndarray) -> None:
    """Multiply the constant at `target` (node, slot, axis) by `factor` along its axis."""
    node, slot, axis = target
    v = node.inputs[slot]
    orig = np.asarray(v.tensor.numpy())
    arr = orig.astype(np.float32)
    shape = [1] * arr.ndim
    shape[axis] = -1
    new = (arr * factor.reshape(shape)).astype(orig.dtype)      # a float16 model keeps its float16 constant
    g.set_constant(v, new, writer=node)


def _set_weight(g, job, w_nk: np.ndarray) -> None:
    """Store the scaled weight W [N, K] back in its layout (the writer replaces it with the narrow form)."""
    v = g.initializers[job.weight]
    arr = w_nk if job.rows_axis == 0 else w_nk.T
    v.tensor = type(v.tensor).from_array(np.ascontiguousarray(arr.astype(v.tensor.numpy_uncached().dtype)))
