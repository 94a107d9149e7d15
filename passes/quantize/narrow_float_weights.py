"""`narrow-float-weights`: after W8A8 placement, the weights still float become 8-bit weight-only kernels.

A MatMul whose input activation stays float (a decoder's down_proj after SiLU(gate) * up, an input too wide for
8 bits) runs a float kernel, so placement leaves its weight float; so does an embedding Gather. On a target
with weight-only kernels (`ort_cpu`: MatMulNBits, GatherBlockQuantized) those weights can still be stored
int8 and read by a kernel that takes float activations: the file shrinks by three quarters for those tensors
and the MatMul reads a quarter of the bytes. Each becomes an 8-bit weight-only job (blocks of 128 along the
reduction axis with zero points, weight SQNR ~44 dB) through the weight-only passes' own grid and writer, at
accuracy_level 4 where check-accuracy-level's measure on the calibration data allows it (int8 activations: fast
at one token), else 0; `--optimize accuracy` keeps them float. The report's `narrow_float_weights` lists them.
"""
from __future__ import annotations

import numpy as np

from qcompiler.passes.quantize.check_accuracy_level import lower_levels
from qcompiler.passes.quantize.plan_weights import DEFAULT_BLOCK, ROWS_AXIS, stored_nk, weight_reads
from qcompiler.passes.quantize.weight_grid import FAST_ABOVE, grid_job
from qcompiler.passes.quantize.write_weights import write_nbits
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.core.weight_only import WeightJob, WeightOnlyPlan, default_accuracy_level

BITS = 8


def float_weight_jobs(ctx) -> WeightOnlyPlan:
    """The weight-only jobs of the float weights left after Q/DQ insertion: every reader a MatMul, Gemm, head
    or embedding Gather the form runs, no other reader, the node not kept float by the user."""
    form = ctx.profile.weight_only
    plan = WeightOnlyPlan(form=form)
    g = ctx.model.graph
    cfg = ctx.options.config if ctx.options is not None else None
    by_weight: dict = {}
    for w, node, kind, why in weight_reads(g, bodies=False):
        by_weight.setdefault(w.name, (w, []))[1].append((node, kind, why))
    for name, (w, readers) in by_weight.items():
        if any(why for _, _, why in readers) or len({ROWS_AXIS[k] for _, k, _ in readers}) > 1:
            continue
        if any(kind == "gather" and form.gather is None for _, kind, _ in readers):
            continue
        if cfg is not None and any(cfg.settings_for(n).keep_float or not cfg.settings_for(n).weight_quantized
                                   for n, _, _ in readers):
            continue
        if _on_a_grid(ctx, readers):   # prefolded: already on the grid the plan (and the encodings file) gave it
            continue
        nodes = {n for n, _, _ in readers} | {n.inputs[1].producer for n, k, _ in readers if k == "head"}
        if any(u.user not in nodes for u in w.uses()):
            continue
        rows_axis = ROWS_AXIS[readers[0][1]]
        depth = int(w.shape[1 - rows_axis])
        job = WeightJob(weight=name, n=int(w.shape[rows_axis]), k=depth, bits=BITS,
                        block_size=block_for(depth), symmetric=not form.zero_points,
                        readers=[(n.name, "gemm" if k == "gemm_t" else k) for n, k, _ in readers],
                        rows_axis=rows_axis, algorithm="rtn")
        if job.stored_bytes() >= job.float_bytes() // 2:   # a small weight: blocks, scales and zero points
            continue                                        # would take more than they save
        plan.jobs[name] = job
    return plan


def block_for(k: int) -> int:
    """Blocks of 128 along the reduction axis, or one block per row (a power of two, at least 16, as MatMulNBits
    and GatherBlockQuantized take) when the axis is shorter: a 64-wide embedding padded to 128 would not shrink."""
    return min(DEFAULT_BLOCK[BITS], max(16, 1 << (k - 1).bit_length()))


def _on_a_grid(ctx, readers) -> bool:
    """A reader's weight use the plan quantized (stored float on its grid for a float kernel)."""
    uses = ctx.plan.uses if ctx.plan is not None else {}
    for node, kind, _ in readers:
        spec = uses.get((node.name, 0 if kind == "gather" else 1))
        if spec is not None and not spec.keep_float:
            return True
    return False


@register_pass
class NarrowFloatWeights(QuantPass):
    name = "narrow-float-weights"
    description = "W8A8: float weights of float-kernel MatMuls and embeddings stored int8 for weight-only kernels"
    preserves_semantics = False
    requires = ("quant-context", "qdq")

    @staticmethod
    def _applies(ctx) -> bool:
        form = ctx.profile.weight_only
        return form is not None and form.matmul == "MatMulNBits" and BITS in form.bits \
            and ctx.settings.optimize != "accuracy"

    def rounding_noise_request(self, ctx) -> dict:
        """Every linear layer's input -> its block (calibration gathers its level-4 rounding noise): which of
        them stay float is known only after placement, and the noise costs two numbers per input channel."""
        if not self._applies(ctx) or default_accuracy_level(ctx.settings, ctx.profile.weight_only) != 4:
            return {}
        out = {}
        for w, node, kind, why in weight_reads(ctx.model.graph, bodies=False):
            x = node.inputs[0]
            if why or kind == "gather" or x is None or w.shape is None or len(w.shape) != 2 or \
                    (node.op_type == "Gemm" and node.attr("transA", 0)):
                continue
            depth = w.shape[1 - ROWS_AXIS[kind]]
            if isinstance(depth, int) and depth > 0:
                out.setdefault(x.name, block_for(depth))
        return out

    def run(self, ctx) -> PassResult:
        if not self._applies(ctx):
            return PassResult(False, {"weights": 0})
        done = narrow_float_weights(ctx)
        return PassResult(bool(done), {"weights": done})


def narrow_float_weights(ctx) -> int:
    """Store the float weights of float-kernel MatMuls and embeddings int8 for the weight-only kernels (the
    pass, and the latency search for the readers it turned float again); returns how many. Jobs join
    ctx.narrow_weights."""
    form = ctx.profile.weight_only
    if not NarrowFloatWeights._applies(ctx):
        return 0
    plan = float_weight_jobs(ctx)
    g = ctx.model.graph
    search = "fast" if sum(j.n * j.k for j in plan.jobs.values()) > FAST_ABOVE else "mse"
    for name, job in list(plan.jobs.items()):
        w = stored_nk(job, g.initializers[job.weight])
        if not np.isfinite(w).all():     # an inf/NaN weight stays as the model has it (calibrate says why)
            del plan.jobs[name]
            continue
        job.grid = grid_job(job, w, search)
    if default_accuracy_level(ctx.settings, form) == 4 and ctx.samples is not None \
            and ctx.samples.can_read_again:    # int8 activations where the calibration data shows they
        lower_levels(ctx, list(plan.jobs.values()))   # cost little (fast at one token), float elsewhere
    for job in plan.jobs.values():
        if job.accuracy_level is None:   # not measured: these MatMuls were left float for their
            job.accuracy_level = 0       # activations' sake, so float activations
        write_nbits(ctx, job)
        job.grid = None
    if plan.jobs:
        ctx.model.opset_imports.setdefault("com.microsoft", 1)
        if ctx.narrow_weights is not None:
            ctx.narrow_weights.jobs.update(plan.jobs)
        else:
            ctx.narrow_weights = plan
        ctx.notes.append(f"{len(plan.jobs)} float weights (float-kernel MatMuls, embeddings) stored int8 for "
                         f"{form.matmul}/{form.gather}: {', '.join(j.weight[:40] for j in list(plan.jobs.values())[:4])}"
                         + (" ..." if len(plan.jobs) > 4 else ""))
    return len(plan.jobs)
