"""`seq-mse` (optional, `--recipe seq-mse`): Sequential MSE weight ranges for MatMul/Gemm.

Runs after `assign-encodings` and before `insert-qdq`. Layer by layer in graph order, each MatMul/Gemm whose
weight the plan quantizes gets, per output channel (per block with `--block-size`, one for a per-tensor grid),
the weight scale among 20 candidates (0.5..1.0 times the assigned one) that minimises the layer output's squared
error on the calibration data, its input taken from the model with the weights of the layers before it already
quantized. The plan's weight encodings are rewritten; nothing else changes. Best where weights are narrow:

    qcompiler quantize model.onnx --calib calib.npz -o model.int4.onnx \
        --weight-bits 4 --block-size 32 --act-bits 16 --recipe seq-mse

How the inputs are captured: with onnxruntime, not numpy. Feeding each layer the outputs of the quantized layers
before it means running everything between them (LayerNorm, Softmax, GELU, reshapes), which only the model can do;
so one session of the float model takes every optimised weight as an overridable input, and each level of
layers (qcompiler/quant/calibration/layer_inputs.py: Q, K and V together) costs one pass over at most 128 samples with the
chosen fake-quantized weights fed in. The search itself is numpy: all candidates at
once through the input's Gram matrix or a factor of it; a 4096 x 4096 MatMul takes about a second.

The report's `layers` entry of each optimised node gets `seq_mse`: mean and least fraction chosen, how many
channels (or blocks) changed, and the layer output MSE on the captured rows under the assigned grid and under the
chosen one (never larger: f = 1 is a candidate). Skipped nodes (shared, frozen or non-float32 weights, Gemm
with transA) are listed in the pass's stats. Conv is not handled (its encodings stay as assigned): the stats'
`skipped_op_types` and a note name each op type left alone and why.

Order with bias correction: `--recipe seq-mse,bias-correction` (bias correction must see the final grid);
named the other way round, the biases are corrected for the grid seq-mse then replaces, and a note says so.

Sequential MSE: per output channel (or per block), the weight range among N candidates
that minimises the layer output's squared error on calibration data, layer after layer.

For a MatMul/Gemm y = x W (W as [K, N]), the output error of channel n is X (W_n - Q(W_n)) = X e_n, and
||X e_n||^2 = e_n^T G e_n with G = X^T X: the output MSE decomposes per output channel, so each channel picks its
own candidate independently. Candidates are the assigned grid with its scale times f, f in
`fractions` (default 20 values 0.5..1.0; zero points unchanged, so f = 1 is exactly the assigned encoding and the
choice is never worse than it on the captured rows). All candidates are evaluated at once: the errors of every
candidate for a chunk of m channels are built in place as one float32 [K, C, m] array (`candidate_errors`: the
scales broadcast, never repeated; about CHUNK_BYTES so the element-wise passes stay in cache), and one float32
GEMM F [r, K] @ E [K, C*m] gives every candidate's output error (BLAS is fine here: no onnxruntime session runs
during the search; calibrate.py's einsum-not-dot note is about running beside one), with BLAS held to
BLAS_THREADS = 1 thread (`blas_threads`). A 4096 x 4096 MatMul (4096 rows, 20 candidates), quiet machine:
1.4 s per channel and 1.8 s per block 32 (before: 1.8 s wall / 3.3 s CPU and 5.7 s / 8.0 s; under load
20 s / 26 s), `python benchmarks/bench_seq_mse.py --search-only 4096`, same chosen scales.

The losses use a factor F with F^T F = G (or an estimate of it), chosen by cost:
  - rows <= r: F = X itself (exact);
  - K <= r: F = cholesky(X^T X)^T, K x K (exact; the rows do not matter any more);
  - else F = r rows of X drawn at random (fixed seed), scaled by sqrt(rows / r): an unbiased estimate.
r is set so that the candidate search costs about FLOP_BUDGET floating-point operations; a 4096 x 4096 MatMul
per channel uses r = 64 rows, per block (below) the exact block Grams.

Per-block weights (`--block-size B`, blocks along K): each (block, channel) first picks its candidate by the error
of its own slice, e_bn^T G_bb e_bn, with G_bb the exact B x B diagonal block of G (what AIMET does for blockwise
grids; cost C * K * B * N). When the whole G is affordable (rows * K^2 within FLOP_BUDGET: every minilm layer),
`refine_blocks` then adds the cross-block terms: per channel it starts from the better of that choice and the
assigned grid by the full loss, and sweeps the blocks (SWEEPS) taking for each the candidate that minimises the
full loss with the others fixed, so the loss never rises. On minilm W4A16 block 32 this moved the mean cosine
from 0.974 (block-diagonal only) to 0.981. Otherwise each channel's full error under the chosen blocks is
compared with the assigned grid's through F, and a channel that got worse keeps the assigned grid.
A per-tensor weight picks the one candidate with the least total loss.

Target: each layer matches X W, X its input with the layers before quantized (AIMET's 'symqt'). Matching the
float model's output instead (`target="float"`: ||X_f W - X Q(W)||^2, the float inputs kept from one pass) scored
0.968 against 0.974 on minilm (before refine_blocks), so it is not the default.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np
from threadpoolctl import threadpool_limits

from qcompiler.errors import DataError
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.progress import bar
from qcompiler.quant.calibration.layer_inputs import (
    LAYER_OPS,
    MAX_ROWS,
    MAX_SAMPLES,
    Layer,
    SequentialCapture,
    fake_quant_kn,
    kn_qparams,
    stored_qparams,
    weight_layers,
)
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.interop.report import skipped_op_types

FRACTIONS = tuple(float(f) for f in np.linspace(0.5, 1.0, 20))
FLOP_BUDGET = 4e10        # per layer, for the candidate search (a few seconds of float32 BLAS on one core)
MIN_ROWS = 64
SWEEPS = 2                # coordinate-descent sweeps over the blocks (refine_blocks)
TARGET = "quantized"        # the output each layer matches: "float" (X_float W) or "quantized" (X W)
CHUNK_BYTES = 8 << 20     # the [K, C, m] candidate errors are built this many bytes at a time
BLAS_THREADS = 1          # BLAS threads during a layer's search (None: leave BLAS alone); see blas_threads


@dataclass
class LayerResult:
    """What seq-mse chose for one layer: mean/min fraction over channels (or blocks), how many changed, and the
    layer output MSE (per element, on the captured rows) under the assigned and the chosen grid."""

    name: str
    fraction_mean: float
    fraction_min: float
    changed: int
    groups: int
    mse_before: float
    mse_after: float
    rows: int
    exact: bool
    seconds: float
    encoding: object = None
    weight_dq: Optional[np.ndarray] = None    # the chosen fake-quantized weight, stored layout

    def report(self) -> dict:
        return {"fraction_mean": round(self.fraction_mean, 4), "fraction_min": round(self.fraction_min, 4),
                "changed": f"{self.changed}/{self.groups}", "mse_before": float(f"{self.mse_before:.4g}"),
                "mse_after": float(f"{self.mse_after:.4g}"), "rows": self.rows, "exact": self.exact,
                "seconds": round(self.seconds, 3)}


def blas_threads(limit: Optional[int]):
    """A context that limits BLAS to `limit` threads (threadpoolctl), or does nothing when limit is None or
    threadpoolctl is missing. Why 1: on a shared machine (and beside onnxruntime's spinning pool between the
    captures) two OpenBLAS threads spin against each other; the 4096 x 4096 search took 6-13 s CPU with two
    threads under load against 1.4 s with one, and the old stacked-matmul search 23 s against 2 s."""
    if limit is None:
        return contextlib.nullcontext()
    return threadpool_limits(limits=int(limit), user_api="blas")


def gram_factor(x: np.ndarray, r: int, seed: int = 0):
    """(F, exact): F^T F = X^T X exactly when `exact`, else an unbiased estimate from r scaled rows. The exact
    factor is the cheaper of X itself and cholesky(X^T X)^T (K x K) when either has at most r rows."""
    rows, k = x.shape
    if k < rows and k <= r:
        g = x.T.astype(np.float64) @ x.astype(np.float64)
        jitter = 1e-9 * max(float(np.trace(g)) / k, 1e-30)
        try:
            c = np.linalg.cholesky(g + jitter * np.eye(k))
            return np.ascontiguousarray(c.T, np.float32), True
        except np.linalg.LinAlgError:
            lam, u = np.linalg.eigh(g)
            return np.ascontiguousarray((u * np.sqrt(np.maximum(lam, 0.0))).T, np.float32), True
    if rows <= r:
        return x, True
    pick = np.sort(np.random.default_rng(seed).choice(rows, r, replace=False))
    return np.ascontiguousarray(x[pick] * np.float32(np.sqrt(rows / r))), False


def candidate_errors(w: np.ndarray, scale: np.ndarray, zp: np.ndarray, qmin: int, qmax: int,
                     block: Optional[int], out: Optional[np.ndarray] = None) -> np.ndarray:
    """E[k, c, j] = Q_c(W)[k, j] - W[k, j] for every candidate c at once, laid out [Kp, C, n] (Kp = K rounded up
    to whole blocks; padded rows are 0) so that one GEMM F @ E.reshape(K, C*n) gives every candidate's output
    error and a block's rows E[b*B:(b+1)*B] are one contiguous [B, C*n] matrix. scale/zp [C, nb, n].

    Element for element the same float32 arithmetic as `fake_quant_kn` (w / s, rint, + z, clip, - z, * s), with
    the scales broadcast instead of repeated, in place in `out`; the zero point steps are skipped when every zero
    point is 0 (adding and subtracting 0.0 changes no value)."""
    k, n = w.shape
    c, nb = scale.shape[0], scale.shape[1]
    bsz = k if nb == 1 else int(block)
    kp = nb * bsz
    if out is None:
        out = np.empty((kp, c, n), np.float32)
    wb = w if kp == k else np.pad(w, ((0, kp - k), (0, 0)))
    wb = wb.reshape(nb, bsz, 1, n)
    o = out.reshape(nb, bsz, c, n)
    s = np.ascontiguousarray(scale.transpose(1, 0, 2), np.float32)[:, None]     # [nb, 1, C, n]
    np.divide(wb, s, out=o)
    np.rint(out, out=out)
    if np.any(zp):
        z = np.ascontiguousarray(zp.transpose(1, 0, 2), np.float32)[:, None]
        o += z
        np.clip(out, qmin, qmax, out=out)
        o -= z
    else:
        np.clip(out, qmin, qmax, out=out)
    o *= s
    o -= wb
    return out


def _col_chunk(c: int, kp: int, n: int) -> int:
    """Columns per chunk: the [Kp, C, m] errors stay about CHUNK_BYTES (a few MB: in cache for the in-place
    passes, and one GEMM still spans C*m columns)."""
    return int(max(1, min(n, CHUNK_BYTES // max(4 * c * kp, 1))))


def channel_losses(f: np.ndarray, w: np.ndarray, scale: np.ndarray, zp: np.ndarray, qmin: int, qmax: int,
                   block: Optional[int], h: Optional[np.ndarray] = None) -> np.ndarray:
    """||F e||^2 - 2 h.e per candidate and channel, e = Q_c(W) - W: scale/zp [C, nb, N] -> [C, N].
    One float32 GEMM F [r, K] @ E [K, C*m] per chunk of m columns (BLAS: no onnxruntime session runs here)."""
    c, k, n = scale.shape[0], w.shape[0], w.shape[1]
    nb = scale.shape[1]
    kp = k if nb == 1 else nb * int(block)
    out = np.empty((c, n), np.float64)
    step = _col_chunk(c, max(kp, f.shape[0]), n)
    buf = np.empty(kp * c * step, np.float32)
    for j in range(0, n, step):
        sl = slice(j, min(n, j + step))
        m = sl.stop - sl.start
        e = candidate_errors(w[:, sl], scale[:, :, sl], zp[:, :, sl], qmin, qmax, block,
                             buf[:kp * c * m].reshape(kp, c, m))[:k]
        y = f @ e.reshape(k, c * m)                                         # [r, C*m]
        out[:, sl] = np.einsum("rj,rj->j", y, y, dtype=np.float64).reshape(c, m)
        if h is not None:
            out[:, sl] -= 2.0 * np.einsum("kcm,km->cm", e, h[:, sl], dtype=np.float64)
    return out


def block_losses(x: np.ndarray, w: np.ndarray, scale: np.ndarray, zp: np.ndarray, qmin: int, qmax: int,
                 block: int, h: Optional[np.ndarray] = None) -> np.ndarray:
    """e_bn^T G_bb e_bn - 2 h_bn.e_bn per candidate, block and channel: scale/zp [C, nb, N] -> [C, nb, N]."""
    c, nb, n = scale.shape
    k = w.shape[0]
    pad = nb * block - k
    xb = np.pad(x, ((0, 0), (0, pad))) if pad else x
    xb = np.ascontiguousarray(xb.reshape(x.shape[0], nb, block).transpose(1, 0, 2))   # [nb, R, B]
    gb = np.matmul(xb.transpose(0, 2, 1), xb)                          # [nb, B, B]
    del xb
    hb = None if h is None else (np.pad(h, ((0, pad), (0, 0))) if pad else h).reshape(nb, block, n)
    out = np.empty((c, nb, n), np.float64)
    step = _col_chunk(c, nb * block, n)
    buf = np.empty(nb * block * c * step, np.float32)
    for j in range(0, n, step):
        sl = slice(j, min(n, j + step))
        m = sl.stop - sl.start
        e = candidate_errors(w[:, sl], scale[:, :, sl], zp[:, :, sl], qmin, qmax, block,
                             buf[:nb * block * c * m].reshape(nb * block, c, m))
        e = e.reshape(nb, block, c * m)                                 # block b: one [B, C*m] matrix, no copy
        # NOTE: one [B, B] @ [B, C*m] product per block: a broadcast stack (gb[None] @ e[C, nb, B, n]) makes
        # numpy leave BLAS for its plain loop (2.4 s against 0.05 s for a 384 x 1536 layer)
        t = np.matmul(gb, e)                                            # [nb, B, C*m]
        if hb is not None:
            t.reshape(nb, block, c, m)[...] -= 2.0 * hb[:, :, None, sl]
        q = np.einsum("bik,bik->bk", t, e)                              # [nb, C*m]
        out[:, :, sl] = q.reshape(nb, c, m).transpose(1, 0, 2)
    return out


def refine_blocks(x, w, scale, zp, qmin, qmax, block, lb, pick, base, h=None):
    """Coordinate descent over the blocks with the cross-block terms of the whole Gram matrix G = X^T X: per
    channel, start from the better of the block-wise choice and the assigned grid (by the full loss), then
    block after block take the candidate minimising the full loss with the other blocks fixed (never larger).
    Returns (pick [nb, N], loss of the assigned grid [N], loss of the choice [N])."""
    k, n = w.shape
    g = x.T @ x                                                           # [K, K]

    def errors(p):
        s = np.take_along_axis(scale, p[None], 0)[0]
        return fake_quant_kn(w, s, zp[0], qmin, qmax, block) - w

    def loss(e, ge):
        out = np.einsum("kn,kn->n", e, ge, dtype=np.float64)
        return out if h is None else out - 2.0 * np.einsum("kn,kn->n", h, e, dtype=np.float64)

    e, e0 = errors(pick), errors(np.full_like(pick, base))
    ge, ge0 = g @ e, g @ e0
    l_pick, l_base = loss(e, ge), loss(e0, ge0)
    keep = l_base < l_pick
    pick[:, keep], e[:, keep], ge[:, keep] = base, e0[:, keep], ge0[:, keep]
    del e0, ge0
    cols = np.arange(n)
    for _ in range(SWEEPS):
        moved = 0
        for b in range(pick.shape[0]):
            sl = slice(b * block, min(k, (b + 1) * block))
            cross = ge[sl] - g[sl, sl] @ e[sl]                            # what the other blocks add
            cand = fake_quant_kn(w[sl], scale[:, b:b + 1], zp[:, b:b + 1], qmin, qmax, block) - w[sl]
            tot = lb[:, b] + 2.0 * np.einsum("cin,in->cn", cand, cross, dtype=np.float64)
            new = np.argmin(tot, axis=0)
            change = new != pick[b]
            if not change.any():
                continue
            moved += int(change.sum())
            de = cand[new, :, cols].T - e[sl]                             # [Bb, N]
            ge += g[:, sl] @ de
            e[sl] += de
            pick[b] = new
        if not moved:
            break
    return pick, l_base, loss(e, ge)


def choose(layer: Layer, x: np.ndarray, fractions=FRACTIONS, budget: float = FLOP_BUDGET, seed: int = 0,
           x_float: Optional[np.ndarray] = None) -> LayerResult:
    """The best candidate per channel (or block) of `layer` on its captured rows `x` [R, K] (see _choose), with
    BLAS limited to BLAS_THREADS threads."""
    with blas_threads(BLAS_THREADS):
        return _choose(layer, x, fractions, budget, seed, x_float)


def _choose(layer: Layer, x: np.ndarray, fractions=FRACTIONS, budget: float = FLOP_BUDGET, seed: int = 0,
            x_float: Optional[np.ndarray] = None) -> LayerResult:
    """The best candidate per channel (or block) of `layer` on its captured input rows `x` [R, K].

    `x_float`: the same rows from the float model; the target is then the float output X_float W instead of
    X W (the error of the layers before is part of what this layer's grid can win back):
    ||X_f w - X q||^2 = ||D w||^2 - 2 h.e + e^T G e, D = X_f - X, h = X^T D w, e = q - w.
    """
    t0 = time.perf_counter()
    enc = layer.spec.encoding
    w = layer.kn()
    k, n = w.shape
    s0, z0 = kn_qparams(layer, enc)                                     # [nb, N]
    fr = np.asarray(fractions, np.float32)
    if not np.any(fr == 1.0):
        fr = np.append(fr, np.float32(1.0))
    base = int(np.flatnonzero(fr == 1.0)[0])
    tiny = np.float32(np.finfo(np.float32).tiny * 1e3)
    scale = np.maximum(fr[:, None, None] * s0[None], tiny).astype(np.float32)   # [C, nb, N]
    zp = np.broadcast_to(z0[None], scale.shape)
    per_tensor = s0.shape[1] == 1 and n > 1
    if per_tensor:
        scale, zp = np.broadcast_to(scale, (len(fr), 1, n)), np.broadcast_to(zp, (len(fr), 1, n))
    qmin, qmax = enc.qmin, enc.qmax
    block = int(enc.block_size) if enc.block_size else None
    rows = x.shape[0]
    h, const = None, np.zeros(n)
    if x_float is not None:
        dw = (x_float - x) @ w                                          # [R, N]
        h = x.T @ dw                                                      # [K, N]
        const = np.einsum("rn,rn->n", dw, dw, dtype=np.float64)
        del dw
    per_block = block is not None and s0.shape[0] > 1
    evals = 3 if per_block else len(fr)
    r = int(max(MIN_ROWS, budget / (2.0 * evals * k * max(n, 1))))
    exact = True
    if per_block:
        lb = block_losses(x, w, scale, zp, qmin, qmax, block, h)        # [C, nb, N]
        pick = np.argmin(lb, axis=0)                                      # [nb, N]
        if 2.0 * rows * k * k + 2.0 * (SWEEPS + 2) * k * k * n <= budget:
            pick, before, after = refine_blocks(x, w, scale, zp, qmin, qmax, block, lb, pick, base, h)
            exact = True
        else:
            f, exact = gram_factor(x, r, seed)
            best_s = np.take_along_axis(scale, pick[None], 0)[0]
            chosen = np.stack([best_s, scale[base]])                      # [2, nb, N]
            full = channel_losses(f, w, chosen, np.broadcast_to(z0[None], chosen.shape), qmin, qmax, block, h)
            worse = full[0] > full[1]
            pick[:, worse] = base
            before, after = full[1], np.minimum(full[0], full[1])
        best_s = np.take_along_axis(scale, pick[None], 0)[0]
        chosen_f = fr[pick]
    else:
        f, exact = gram_factor(x, r, seed)
        lc = channel_losses(f, w, scale, zp, qmin, qmax, block, h)       # [C, N]
        if per_tensor:                                                    # one choice for the tensor
            c = int(np.argmin(lc.sum(1)))
            before, after = lc[base], lc[c]
            best_s = scale[c, :, :1]
            chosen_f = fr[[c]]
        else:
            pick = np.argmin(lc, axis=0)[None]                            # [1, N]
            before, after = lc[base], np.take_along_axis(lc, pick, 0)[0]
            best_s = np.take_along_axis(scale, pick[None], 0)[0]
            chosen_f = fr[pick]
    denom = float(max(rows, 1) * n)      # F^T F stands for all `rows` rows (exactly or as an estimate)
    new_scale, new_zp = stored_qparams(layer, np.ascontiguousarray(best_s), z0, enc)
    meta = dict(enc.meta)
    meta["seq_mse"] = {"candidates": len(fr)}
    new = replace(enc, scale=new_scale, zero_point=new_zp, meta=meta)
    dq = fake_quant_kn(w, best_s, z0, qmin, qmax, block)
    return LayerResult(layer.name, float(chosen_f.mean()), float(chosen_f.min()), int((chosen_f < 1).sum()),
                       int(chosen_f.size), max(float((before.sum() + const.sum()) / denom), 0.0),
                       max(float((after.sum() + const.sum()) / denom), 0.0), rows, exact,
                       time.perf_counter() - t0, new, layer.stored(dq))


def run_seq_mse(model, plan, samples, fractions=None, max_rows: Optional[int] = None,
                max_samples: Optional[int] = None, target: Optional[str] = None, progress=None):
    """Sequential MSE over every MatMul/Gemm layer of `plan` (see the module docstring); rewrites the plan's
    weight encodings. `target`: "float" (X_float W, the default) or "quantized" (X W, AIMET's 'symqt').
    Returns ([LayerResult] in order, {node: why skipped}, capture seconds)."""
    fractions = FRACTIONS if fractions is None else fractions
    target = TARGET if target is None else target
    layers, skipped = weight_layers(model, plan)
    if not layers:
        return [], skipped, 0.0
    cap = SequentialCapture(model, layers, samples, max_rows or MAX_ROWS, max_samples or MAX_SAMPLES)
    quantized: dict = {}
    results = []
    t0 = time.perf_counter()
    if target == "float":
        cap.cache_float(layers)
    capture_s = time.perf_counter() - t0
    with bar("seq-mse", len(layers), progress, unit="layer") as shown:
        for level in sorted({layer.level for layer in layers}):
            capture_s += _one_level(cap, [layer for layer in layers if layer.level == level], quantized, results,
                                    skipped, fractions, target, shown)
    return results, skipped, capture_s


def _one_level(cap, todo, quantized, results, skipped, fractions, target, shown) -> float:
    """The layers of one level: their inputs captured at once, then each one's ranges chosen."""
    t0 = time.perf_counter()
    xs = cap.capture(todo, quantized, float_too=target == "float")
    capture_s = time.perf_counter() - t0
    for layer in todo:
        shown.update(1)
        x, xf = xs.get(layer.input_name, (None, None))
        if x is None or x.shape[0] == 0 or x.shape[1] != layer.kn().shape[0]:
            skipped[layer.name] = "input not captured (no rows, or not [.., K])"
            continue
        if not np.isfinite(x).all():
            skipped[layer.name] = "input holds NaN or infinity on the calibration data"
            continue
        res = choose(layer, x, fractions, x_float=xf)
        layer.spec.encoding = res.encoding
        quantized[layer.weight.name] = res.weight_dq
        res.weight_dq = None
        results.append(res)
    return capture_s


def _samples(ctx):
    """The feeds calibration kept (no file read again) when they are all the samples the capture would use;
    else the sample set, read again once per level (a reader that cannot rewind: the kept ones, with a note)."""
    cal = ctx.calibration
    kept = [feed for feed, _ in cal.kept] if cal is not None else []
    if kept and len(kept) >= min(cal.samples, MAX_SAMPLES):
        return kept
    try:
        it = iter(ctx.samples)
        next(it, None)              # a reader read once without rewind() refuses here, not mid-run
        it.close()
    except DataError:
        if not kept:
            raise
        ctx.notes.append(f"seq-mse used the {len(kept)} calibration samples kept in memory: the reader cannot be "
                         f"read again (no rewind())")
        return kept
    return ctx.samples


@register_pass
class SequentialMse(QuantPass):
    name = "seq-mse"
    description = "Sequential MSE: per-channel/per-block MatMul/Gemm weight ranges minimising each layer's " \
                  "output error, layer by layer on calibration data"
    preserves_semantics = False
    requires = ("quant-context", "statistics", "encodings")
    after = "assign-encodings"

    def run(self, ctx) -> PassResult:
        names = [p.name for p in ctx.passes]
        if "bias-correction" in names and self.name in names \
                and names.index("bias-correction") < names.index(self.name):
            ctx.notes.append("seq-mse ran after bias-correction: the biases were corrected for the grids "
                             "seq-mse replaced (name seq-mse first in --recipe)")
        results, skipped, capture_s = run_seq_mse(ctx.model, ctx.plan, _samples(ctx), progress=ctx.settings.progress)
        for r in results:
            ctx.layers.setdefault(r.name, {})["seq_mse"] = r.report()
        if results:
            before = sum(r.mse_before for r in results)
            after = sum(r.mse_after for r in results)
            ctx.notes.append(f"seq-mse on {len(results)} MatMul/Gemm layers: summed layer output MSE "
                             f"{before:.4g} -> {after:.4g}; {sum(r.changed for r in results)} of "
                             f"{sum(r.groups for r in results)} channel/block ranges narrowed")
        other = skipped_op_types(ctx.model, ctx.plan, LAYER_OPS, self.name)
        if other:
            ctx.notes.append("seq-mse left alone: " + "; ".join(f"{op} ({why})" for op, why in other.items()))
        stats = {"layers": len(results), "skipped": dict(list(skipped.items())[:20]), "skipped_op_types": other,
                 "capture_seconds": round(capture_s, 3),
                 "search_seconds": round(sum(r.seconds for r in results), 3)}
        return PassResult(bool(results), stats)
