"""`check-accuracy-level`: keep MatMulNBits' int8 activations (accuracy_level 4) only where they cost nothing.

At accuracy_level 4 onnxruntime's CPU kernel quantizes each MatMulNBits input to int8 per block of the
reduction axis before the integer dot products: the fastest path, and what onnxruntime-genai writes for CPU.
On outlier-heavy activations that rounding can move the output far more than the 4-bit weights do
(onnxruntime issue #29849 reports greedy tokens flipping on such LLMs). For each weight-only MatMul this pass
replays that rounding in numpy on the layer's float inputs from the calibration data (`emulate_level4`) and
compares the output with the float-activation product on the same narrow weights: a layer whose output SQNR
at level 4 falls below `LEVEL4_MIN_DB` gets level 0 (float activations), with the figures in the report.
Without calibration data nothing is measured and the profile's level stays (the report says so).
Where calibration already gathered the inputs' level-4 rounding noise (narrow-float-weights asks for it:
qcompiler/quant/calibration/rounding_noise.py), `lower_levels` reads the figure from there instead of running
the model again; layers it has nothing on are captured as above.

A width the profile lists in `weight_only.slow_level0_bits` (8 on ort_cpu: onnxruntime's level-0 kernel for it is
10x a float MatMul at one token) gets level 4 even where the level asked for is 0 (`--accuracy-level 0`), unless
`--optimize accuracy` asks for the level as given, or the same check measures level 4 below `LEVEL4_MIN_DB`.
"""
from __future__ import annotations

import numpy as np

from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.calibration.rounding_noise import emulate_level4
from qcompiler.quant.calibration.weight_inputs import chunks, first_rows, input_groups, rows_session
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.runtime.memory import release
from qcompiler.quant.core.weight_only import default_accuracy_level
from qcompiler.quant.placement.widening import mean_square
from qcompiler.sqnr import db_from_powers, powers

LEVEL4_MIN_DB = 30.0       # int8 activation rounding must stay this far below the signal (4-bit weights: ~20 dB)
MAX_ROWS = 2048            # input rows kept per layer group for the check
CHECK_SAMPLES = 16
ROW_BUDGET = 256 << 20
STEP_ROWS = 128            # rows per product in level4_db


def level4_db(x: np.ndarray, w: np.ndarray, block: int) -> float:
    """SQNR of the level-4 product of rows `x` [r, K] with `w` [N, K] against the float-activation product, a
    few rows at a time (STEP_ROWS): a 32000-wide head's whole products, in float64 for the sums, were 2 GB."""
    signal = noise = 0.0
    for i in range(0, len(x), STEP_ROWS):
        xs = x[i:i + STEP_ROWS]
        s, n = powers(xs @ w.T, emulate_level4(xs, block) @ w.T)
        signal += s
        noise += n
    return db_from_powers(signal, noise)


def _decide(job, db: float, lowered: list) -> None:
    if db < LEVEL4_MIN_DB:
        job.accuracy_level = 0
        job.notes.append(f"accuracy_level 0: int8 activations would give {db:.1f} dB on its "
                         f"output (< {LEVEL4_MIN_DB:g} dB)")
        lowered.append(job.weight)
    else:
        job.accuracy_level = 4


def _from_calibration(ctx, groups: dict, lowered: list) -> dict:
    """Decide the jobs whose input's rounding noise calibration gathered; returns the groups left to capture."""
    cal = ctx.calibration
    noise = getattr(cal, "rounding_noise", None) or {}
    if not noise:
        return groups
    nodes = {n.name: n for n in ctx.model.graph.nodes}
    left = {}
    for name, jobs in groups.items():
        acc = noise.get(name)
        rest = []
        for job in jobs:
            if job.grid is None or job.accuracy_level == 0:
                continue
            out = [nodes[r].outputs[0] for r, _ in job.readers if r in nodes and nodes[r].outputs]
            obs = cal.observers.get(out[0].name) if len(out) == 1 and out[0] is not None else None
            mean_sq = mean_square(obs.stats()) if obs is not None and getattr(obs, "count", 0) else None
            db = acc.output_db(job.grid.dequantize(), mean_sq) if acc is not None and acc.block == job.block_size \
                else None
            if db is None:
                rest.append(job)
            else:
                _decide(job, db, lowered)
        if rest:
            left[name] = rest
    return left


def lower_levels(ctx, jobs) -> list:
    """Give accuracy_level 0 to each job among `jobs` whose output int8 activations (level 4) would move by more
    than LEVEL4_MIN_DB SQNR on its calibration inputs, level 4 to the others; returns the weights set to 0."""
    lowered: list = []
    groups = _from_calibration(ctx, input_groups(ctx, jobs), lowered)
    session = rows_session(ctx, groups) if groups else None
    for names in chunks(groups, lambda n, js: 4 * MAX_ROWS * js[0].k, ROW_BUDGET):
        rows = first_rows(ctx, names, MAX_ROWS, CHECK_SAMPLES, session=session)
        for name in names:
            x = rows[name]
            if x is None or not len(x):
                continue
            for job in groups[name]:
                if job.grid is None or job.accuracy_level == 0:
                    continue
                _decide(job, level4_db(x, job.grid.dequantize(), job.block_size), lowered)
    del session
    release(collect=True)
    return lowered


@register_pass
class CheckAccuracyLevel(QuantPass):
    name = "check-accuracy-level"
    description = "weight-only: MatMulNBits level 4 (int8 activations) only where it moves the output little"
    requires = ("quant-context", "weight-grids")
    after = "weight-grid"

    def run(self, ctx) -> PassResult:
        plan = ctx.weight_plan
        if plan.form.matmul != "MatMulNBits":
            return PassResult(False, {"checked": 0})
        if default_accuracy_level(ctx.settings, plan.form) != 4:
            return _raise_slow_widths(ctx, plan)
        if ctx.samples is None:
            ctx.notes.append("accuracy_level 4 (int8 activations in MatMulNBits) not checked: no calibration data")
            return PassResult(False, {"checked": 0})
        jobs = list(plan.jobs.values())
        lowered = lower_levels(ctx, jobs)
        for job in jobs:            # what the check did not reach (an embedding) keeps the default
            if job.accuracy_level == 4:
                job.accuracy_level = None
        if lowered:
            ctx.notes.append(f"accuracy_level 0 (float activations) for {len(lowered)} MatMulNBits whose output "
                             f"int8 activations move by more than {LEVEL4_MIN_DB:g} dB SQNR; level 4 elsewhere")
        return PassResult(False, {"checked": len(jobs), "level0": len(lowered)})


def _raise_slow_widths(ctx, plan) -> PassResult:
    """Level 4 for the weights whose width has no fast level-0 kernel (the profile's `slow_level0_bits`), where
    the level asked for is 0 and the objective is not accuracy; measured like the default when data is given."""
    slow = set(plan.form.slow_level0_bits)
    jobs = [j for j in plan.jobs.values() if j.bits in slow and j.grid is not None and j.accuracy_level is None
            and any(kind != "gather" for _, kind in j.readers)]
    if not jobs or ctx.settings.optimize == "accuracy":
        return PassResult(False, {"checked": 0})
    why = f"accuracy_level 4: {'/'.join(map(str, sorted(slow)))}-bit MatMulNBits has no fast level-0 kernel"
    if ctx.samples is None:
        for job in jobs:
            job.accuracy_level = 4
            job.notes.append(f"{why} (not checked: no calibration data)")
        return PassResult(False, {"checked": 0, "level4": len(jobs)})
    lower_levels(ctx, jobs)
    for job in jobs:
        if job.accuracy_level == 4:
            job.notes.append(why)
    return PassResult(False, {"checked": len(jobs), "level4": sum(j.accuracy_level == 4 for j in jobs)})
