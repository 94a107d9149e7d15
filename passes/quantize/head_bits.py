"""`measure-head-bits`: the width of the logits head and the token embedding chosen by measurement when there is
calibration data, not by the rule alone.

plan-weights gives the model's ends 8 bits when the other weights get fewer (`head_bits`, on the test decoders
a 4-bit head costs more logits SQNR than every 4-bit layer between the ends). With calibration data this pass
measures, on the first HEAD_SAMPLES samples, the output SQNR of the whole planned model (every weight on its
grid) with each end at its rule's width and at `--weight-bits`, and keeps the narrower width only where it
costs less than HEAD_COST_DB of output SQNR; the layer's note in the report gives both figures. It does
nothing when `--head-bits` or a config rule set the width, under `--max-drop` (that search chooses every
width, the ends included), without calibration data, or above ONE_PROTO_MAX_BYTES (onnx_io/files.py) of
weights (its evaluation model is one ModelProto: the rule stands, and the notes say so).
"""
from __future__ import annotations

import math

from qcompiler.onnx_io.files import ONE_PROTO_MAX_BYTES
from qcompiler.passes.quantize.weight_mixed_precision import (
    Evaluator,
    candidate_job,
    dequantized,
    first_samples,
    measurable,
)
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.core.context import QuantPass

HEAD_COST_DB = 0.5        # a narrower head must cost less than this much output SQNR
HEAD_SAMPLES = 16


def _db(drop: float) -> float:
    return -20.0 * math.log10(drop) if drop > 0 else math.inf


@register_pass
class MeasureHeadBits(QuantPass):
    name = "measure-head-bits"
    description = "weight-only: the head and embedding at --weight-bits where it costs < 0.5 dB output SQNR"
    requires = ("quant-context", "weight-grids")
    after = "weight-grid"

    def run(self, ctx) -> PassResult:
        plan, s = ctx.weight_plan, ctx.settings
        ends = [j for j in plan.jobs.values() if j.end]
        if not ends or s.max_drop is not None:
            return PassResult(False, {"measured": 0})
        rule = f"{', '.join(j.weight[:40] for j in ends)} at {ends[0].bits} bits by the head rule"
        if ctx.samples is None:
            ctx.notes.append(f"{rule} (no calibration data to measure a {s.weight_bits}-bit head on)")
            return PassResult(False, {"measured": 0})
        if not measurable(ctx):
            ctx.notes.append(f"{rule} (not measured: over {ONE_PROTO_MAX_BYTES >> 20} MiB of weights)")
            return PassResult(False, {"measured": 0})
        jobs = list(plan.jobs.values())
        samples = first_samples(ctx, HEAD_SAMPLES)
        ev = Evaluator(ctx, jobs, samples)
        planned = {j.weight: dequantized(j, ev.floats[j.weight]) for j in jobs}
        every = range(len(samples))
        base = _db(ev.drop(planned, every))
        narrowed = 0
        for job in ends:
            alt = candidate_job(ctx, job, s.weight_bits)
            narrow = _db(ev.drop(dict(planned, **{job.weight: dequantized(alt, ev.floats[job.weight])}), every))
            cost = base - narrow
            figures = (f"output SQNR {base:.2f} dB at {job.bits} bits, {narrow:.2f} dB at {alt.bits} on "
                       f"{len(samples)} calibration samples")
            if cost < HEAD_COST_DB:
                job.notes.append(f"{alt.bits} bits, measured: {figures} (costs {cost:.2f} < {HEAD_COST_DB:g} dB)")
                job.bits, job.block_size, job.grid = alt.bits, alt.block_size, alt.grid
                job.sqnr_db, job.algorithm = alt.sqnr_db, alt.algorithm
                planned[job.weight] = dequantized(job, ev.floats[job.weight])
                base = narrow
                narrowed += 1
            else:
                job.notes.append(f"{job.bits} bits, measured: {figures} ({alt.bits} bits would cost {cost:.2f} "
                                 f">= {HEAD_COST_DB:g} dB)")
        ctx.notes.append(f"head and embedding width measured: {narrowed} of {len(ends)} at {s.weight_bits} bits "
                         f"(kept only where it costs < {HEAD_COST_DB:g} dB output SQNR); the layers' notes give the "
                         f"figures")
        return PassResult(False, {"measured": len(ends), "narrowed": narrowed})
