"""`weight-grid`: the round-to-nearest grid of every planned weight that no earlier pass gridded.

Not the first grid but the best one: per block, the scale (and zero point) that minimises the block's squared
rounding error on the full integer range (qcompiler/quant/core/block_grid.py), never worse than the min/max grid
onnxruntime's own quantizer writes. It needs no calibration data. Weights are read one at a time and not kept
(`Tensor.numpy_uncached`), so a model larger than memory streams through. Above FAST_ABOVE weights in all the
search is block_grid's "fast" one (three candidates and the least-squares refits: about half the time, most of
the gain), so a 0.5 B decoder quantizes in about the time onnxruntime's own quantizer takes.
"""
from __future__ import annotations

import numpy as np

from qcompiler.passmanager import PassResult, register_pass
from qcompiler.progress import bar
from qcompiler.quant.core.block_grid import block_grid
from qcompiler.quant.core.context import QuantPass
from qcompiler.sqnr import db_from_powers
from qcompiler.passes.quantize.plan_weights import stored_nk, weight_value


def grid_job(job, w, search: str = "mse"):
    """The job's BlockGrid for W [N, K] (float32), with its weight SQNR recorded."""
    grid = block_grid(w, job.bits, job.block_size, symmetric=job.symmetric, search=search)
    job.sqnr_db = weight_sqnr_db(w, grid)
    return grid


def block_grid_fn(bits: int, symmetric: bool, search: str = "mse"):
    """The per-block grid choice as round-to-nearest makes it (GPTQ's, AWQ's scale search):
    `fn(w_block [N, b]) -> (scale [N], zp [N])`."""
    def fn(w_block):
        g = block_grid(w_block, bits, w_block.shape[1], symmetric=symmetric, search=search)
        return g.scales[:, 0], g.zero_points[:, 0]
    return fn


SQNR_CHUNK = 1 << 22   # weight elements dequantized at a time for the weight SQNR


def weight_sqnr_db(w, grid) -> float:
    """The weight's SQNR on its grid, a chunk of rows at a time (never a second float copy of the weight)."""
    n, k = grid.q.shape
    step = max(1, SQNR_CHUNK // max(k, 1))
    signal = noise = 0.0
    for r in range(0, n, step):
        rows = slice(r, min(n, r + step))
        ref = np.asarray(w[rows], np.float32)
        d = grid.dequantize(rows) - ref
        signal += float(np.einsum("ij,ij->", ref, ref, dtype=np.float64))
        noise += float(np.einsum("ij,ij->", d, d, dtype=np.float64))
    return db_from_powers(signal, noise)


FAST_ABOVE = 64_000_000


def grid_search(plan) -> str:
    """block_grid's search for the plan's round-to-nearest grids: "fast" above FAST_ABOVE weights in all."""
    return "fast" if sum(j.n * j.k for j in plan.jobs.values()) > FAST_ABOVE else "mse"


@register_pass
class WeightGrid(QuantPass):
    name = "weight-grid"
    description = "weight-only: the per-block grid minimising each block's rounding error (round-to-nearest)"
    requires = ("quant-context", "weight-plan")
    ensures = ("weight-grids",)

    def run(self, ctx) -> PassResult:
        plan, g = ctx.weight_plan, ctx.model.graph
        todo = [j for j in plan.jobs.values() if j.grid is None]
        search = grid_search(plan)
        with bar("weights", len(todo), ctx.settings.progress) as progress:
            for job in todo:
                job.grid = grid_job(job, stored_nk(job, weight_value(g, job.weight)), search)
                job.algorithm = job.algorithm or "rtn"
                progress.update(1)
        return PassResult(False, {"gridded": len(todo), "search": search})
