"""Field notes §6: activations 8 bits cannot carry are widened to the profile's wide grid, or kept float."""
from __future__ import annotations

from typing import Dict

import numpy as np

from qcompiler.ir import walk_up
from qcompiler.quant.calibration.calibrate import min_max_step
from qcompiler.quant.core.plan import QuantPlan
from qcompiler.quant.placement.float_regions import ACTIVATIONS_AS_BALANCED
from qcompiler.quant.targets.profiles import Profile

# field notes §6 thresholds: an 8-bit grid keeps the bulk of a tensor useful while max|x| / p99.9|x| stays
# below ~30; far beyond that (masks, variances) the bulk collapses onto one or two levels.
SENTINEL_MAGNITUDE = 1e20
# float16 models mask with torch.finfo(float16).min (-65504) or onnxconverter-common's clip (-1e4): a tenth of
# float16's largest finite value is a sentinel there (minilm_l6 in float16: cosine 0.46 with its mask quantized)
SENTINEL_FLOAT16 = 0.1 * float(np.finfo(np.float16).max)
OUTLIER_RATIO_LIMIT = 1e3
# the bulk (99.9% of |x|) must span at least this many steps of the min/max grid; BERT's outlier channels
# (FFN outputs up to ~200 over a bulk of ~1) leave it 1-10 steps and wreck the model
MIN_BULK_STEPS = 16.0
# estimated SQNR of the 8-bit min/max grid (calibrate.estimated_sqnr_db) below which a tensor is widened
MIN_SQNR8_DB = 30.0
# the largest grid step a Softmax/LogSoftmax input may have, in its own units: exp turns an input error d into a
# relative error e^d - 1 of each probability, whatever the scores' scale (0.25: at most ~13 %, rms ~7 %)
SOFTMAX_MAX_STEP = 0.25
EXP_OPS = ("Softmax", "LogSoftmax")
# Sin/Cos read their input as an angle: an input error d moves the output by up to d (slope 1) against an output
# power of 1/2, so the 30 dB of MIN_SQNR8_DB needs steps of at most sqrt(6e-3) ~ 0.077 rad. A decoder's rotary
# angles (position x inv_freq, up to the sequence length in radians) on 8 bits have steps of 0.5 rad at 128
# tokens: cos/sin turn to noise for the fast-turning channels of every layer's q and k
PERIODIC_OPS = ("Sin", "Cos")
PERIODIC_MAX_STEP = float(np.sqrt(6.0 * 10 ** (-MIN_SQNR8_DB / 10)))
# what a widening costs: on a target whose integer kernels read only 8-bit activations (onnxruntime's CPU), a
# value widened to 16 bits turns its Conv/MatMul/Gemm readers into float kernels. When those readers hold at
# least HEAVY_SHARE of the model's multiply-accumulates and the 8-bit grid still gives MIN_SQNR8_HEAVY_DB on the
# value (the gain is a few dB: a t(4)-tailed input at 28 dB on 8 bits cost the output 33 -> 27 dB), the value
# keeps 8 bits and its readers their integer kernels
# (a pitch tracker's unfused BatchNorm output widened made the next Conv, half the compute, run float: 1.13x
# float against onnxruntime's 0.71x for 0.35 points). Under `balanced`, `size` and `latency` (whose search then
# measures only the narrowings `balanced` does not make: `latency` is never slower than `balanced`); `accuracy`
# widens as before; the safety net still widens a value that breaks an output.
WEIGHS_WIDENING = ACTIVATIONS_AS_BALANCED + ("latency",)
HEAVY_SHARE = 0.25
MIN_SQNR8_HEAVY_DB = 24.0
MIN_MEDIAN_STEPS = 2.0
# a profile's fixed output range (Softmax/Sigmoid [0, 1]) is checked like an observed one, on its own grid:
# attention probabilities over L keys sit near 1/L, so over 128 tokens most of them are 1-2 steps of a [0, 1]
# 8-bit grid (~17-27 dB each; a 16-layer decoder's logits 14 dB, 21 with those grids wide)


def widen_or_float(plan: QuantPlan, stats: Dict[str, dict], profile: Profile, g=None) -> None:
    """Check each quantized activation's statistics: sentinels, outliers, too few steps for its bulk, and (with
    the graph `g`) a Softmax input whose grid step is too coarse for exp."""
    wide = profile.wide_activation_bits
    exp_inputs = _exp_inputs(g, profile) if g is not None else set()
    angles = _angles(g, profile) if g is not None else set()
    costly = _widening_costs(plan, g, profile) if g is not None and wide else {}
    fixed = _profile_fixed_ranges(plan, g, profile) if g is not None else {}
    for name, spec in plan.values.items():
        if name in fixed:
            _widen_fixed(spec, stats.get(name), fixed[name], wide)
        # NOTE: wide grids are checked too: a -3.4e38 mask destroys an int16 grid as surely as an int8 one
        if spec.keep_float or spec.kind != "activation" or spec.fixed_range is not None:
            continue
        st = stats.get(name)
        if not st:
            continue
        absmax = max(abs(st.get("min", 0.0)), abs(st.get("max", 0.0)))
        headroom = 2.0 ** max(spec.bits - 8, 0)
        fp16 = plan.dtypes is not None and plan.dtypes.get(name) == np.float16
        if absmax >= (SENTINEL_FLOAT16 if fp16 else SENTINEL_MAGNITUDE):
            spec.float_(f"holds sentinel values of magnitude {absmax:.3g} (an additive mask?): "
                        f"{spec.bits} bits cannot carry them together with the rest")
        elif name in exp_inputs and min_max_step(st, spec.bits) > SOFTMAX_MAX_STEP:
            why = (f"feeds a Softmax: a {spec.bits}-bit grid over [{st['min']:.3g}, {st['max']:.3g}] has steps of "
                   f"{min_max_step(st, spec.bits):.3g} (an additive mask of {st['min']:.3g}?), over "
                   f"{SOFTMAX_MAX_STEP} in exp's units")
            if wide and wide > spec.bits and min_max_step(st, wide) <= SOFTMAX_MAX_STEP:
                spec.bits, spec.widened = int(wide), why
            else:
                spec.float_(why)
        elif name in angles and min_max_step(st, spec.bits) > PERIODIC_MAX_STEP:
            why = (f"feeds a Sin/Cos: a {spec.bits}-bit grid over [{st['min']:.3g}, {st['max']:.3g}] has steps of "
                   f"{min_max_step(st, spec.bits):.3g} rad, over {PERIODIC_MAX_STEP:.3g}")
            if wide and wide > spec.bits and min_max_step(st, wide) <= PERIODIC_MAX_STEP:
                spec.bits, spec.widened = int(wide), why
            else:
                spec.float_(why)
        elif st.get("outlier_ratio", 1.0) >= OUTLIER_RATIO_LIMIT * headroom:
            spec.float_(f"max|x| is {st['outlier_ratio']:.3g}x its 99.9th percentile: {spec.bits} bits would zero "
                        f"the bulk")
        elif spec.bits > 8:
            pass
        elif st.get("p999_steps", MIN_BULK_STEPS) < MIN_BULK_STEPS * 2 ** (spec.bits - 8) or \
                (spec.bits == 8 and st.get("sqnr8_db", 99.0) < MIN_SQNR8_DB):
            why = f"an 8-bit grid gives ~{st.get('sqnr8_db', 0):.0f} dB (max|x| {absmax:.3g}"
            why += (f", 99.9% of |x| within {st['p999_steps']:.1f} steps)" if "p999_steps" in st else
                    f", rms {np.sqrt(st.get('mean_sq', 0.0)):.3g})")
            cost = costly.get(name)
            if cost and _bulk_spans_the_grid(st) and st.get("sqnr8_db", 0.0) >= MIN_SQNR8_HEAVY_DB:
                spec.source = (spec.source + "; " if spec.source else "") + \
                    f"kept 8-bit: {why[:-1]}), but 16 bits would run {cost} float on {profile.name}"
            elif wide:
                spec.bits, spec.widened = int(wide), why
            else:
                spec.float_(why)
        elif st.get("nonfinite", 0):
            spec.float_(f"calibration saw {st['nonfinite']} non-finite values")


def _profile_fixed_ranges(plan: QuantPlan, g, profile: Profile) -> Dict[str, str]:
    """value name -> its producer's op, for the 8-bit activations whose fixed range is the profile's
    (`fixed_output_range`), not one a config gave."""
    out: Dict[str, str] = {}
    for n in g.nodes:
        rng = profile.fixed_output_range.get(n.op_type)
        for v in n.outputs if rng is not None else ():
            spec = plan.values.get(v.name) if v is not None else None
            if spec is not None and spec.kind == "activation" and not spec.keep_float and spec.bits == 8 \
                    and spec.fixed_range == tuple(float(x) for x in rng):
                out[v.name] = n.op_type
    return out


def mean_square(st: dict) -> float:
    """E[x²] of a value: the observer's own, else the one its 8-bit estimate (calibrate.estimated_sqnr_db) used."""
    if "mean_sq" in st:
        return float(st["mean_sq"])
    step, db = min_max_step(st, 8), st.get("sqnr8_db")
    return 10 ** (db / 10) * step ** 2 / 12 if db is not None and np.isfinite(db) and step > 0 else 0.0


def fixed_grid_sqnr_db(st: dict, lo: float, hi: float, bits: int = 8) -> float:
    """10·log10(E[x²] / (s²/12)) for the grid of `bits` over the fixed range [lo, hi] (as estimated_sqnr_db
    does for the observed range); inf when the statistics carry no power."""
    power, step = mean_square(st), (hi - lo) / (2 ** bits - 1)
    if not power > 0 or not np.isfinite(power) or step <= 0:
        return float("inf")
    return float(10 * np.log10(power * 12 / step ** 2))


def _widen_fixed(spec, st, op: str, wide) -> None:
    """Widen (or keep float) a fixed-range output whose 8-bit grid gives its values under MIN_SQNR8_DB."""
    if not st or not st.get("count"):
        return
    lo, hi = spec.fixed_range
    db = fixed_grid_sqnr_db(st, lo, hi)
    if db >= MIN_SQNR8_DB:
        return
    why = (f"{op} output: an 8-bit grid over its fixed range [{lo:g}, {hi:g}] gives ~{db:.0f} dB (rms "
           f"{np.sqrt(mean_square(st)):.3g} against steps of {(hi - lo) / 255:.3g})")
    if wide:
        spec.bits, spec.widened = int(wide), why
    else:
        spec.float_(why)


def _bulk_spans_the_grid(st: dict) -> bool:
    """Is the 8-bit SQNR estimate the bulk's, not an outlier's? It counts every value's power, so one value of
    1000 over ~1s, or one channel 2000x the others, scores 24-28 dB while the bulk sits under one step: the
    median nonzero |x| must span MIN_MEDIAN_STEPS steps of the 8-bit min/max grid (a 99.9th percentile would
    not do: an outlier channel of 64 holds 1.6% of the values). Unknown (no magnitude histogram): no."""
    med, step = st.get("abs_median_nonzero"), min_max_step(st, 8)
    return med is not None and step > 0 and med / step >= MIN_MEDIAN_STEPS


def bulk_names(model, profile: Profile, optimize: str) -> frozenset:
    """The values whose bulk the cost rule may need (calibration keeps their median |x|): what the
    Conv/MatMul/Gemm that run integer kernels only at 8 bits read at input 0, the producer behind data movement.
    Empty where the rule does not apply (see _widening_costs)."""
    kernels, wide = profile.integer_weight_kernels, profile.wide_activation_bits
    if optimize not in WEIGHS_WIDENING or not wide or not kernels or \
            all(r.act_bits == wide for r in kernels.values()):
        return frozenset()
    moves = set(profile.shares_input_encoding)
    out = set()
    for n in model.graph.nodes:
        if n.op_type not in kernels or kernels[n.op_type].act_bits == wide or not n.inputs or n.inputs[0] is None:
            continue
        v = n.inputs[0]
        while v.producer is not None and v.producer.op_type in moves and v.producer.inputs \
                and v.producer.inputs[0] is not None:
            v = v.producer.inputs[0]
        out.add(v.name)
    return frozenset(out)


def _widening_costs(plan: QuantPlan, g, profile: Profile) -> Dict[str, str]:
    """value name -> what widening it would cost ("Conv 'x' (40% of the multiply-accumulates)"), for the
    main-graph values whose readers, directly or through data movement, run an integer kernel only at 8 bits
    and hold at least HEAVY_SHARE of the model's multiply-accumulates (plan.macs). Empty for `--optimize
    accuracy` (every quantizer as asked) and for targets whose integer kernels take the wide grid (or that list none)."""
    kernels = profile.integer_weight_kernels
    wide = profile.wide_activation_bits
    total = sum(plan.macs.values())
    if plan.optimize not in WEIGHS_WIDENING or not kernels or not total or \
            all(r.act_bits == wide for r in kernels.values()):
        return {}
    moves = set(profile.shares_input_encoding)
    out: Dict[str, str] = {}
    for v in [x for n in g.nodes for x in n.outputs if x is not None] + list(g.inputs):
        readers, stack = [], [v]
        while stack:
            for u in stack.pop().uses():
                r = u.user
                if u.is_graph_output or r is None or r.graph is not g:
                    continue
                if r.op_type in moves and u.index == 0 and r.outputs and r.outputs[0] is not None:
                    stack.append(r.outputs[0])
                elif u.index == 0 and r.op_type in kernels and kernels[r.op_type].act_bits != wide:
                    readers.append(r)
        macs = sum(plan.macs.get(r.name, 0.0) for r in readers)
        if macs >= HEAVY_SHARE * total:
            names = ", ".join(f"{r.op_type} '{r.name[:40]}'" for r in readers[:2]) + (" ..." if len(readers) > 2 else "")
            out[v.name] = f"{names} ({100 * macs / total:.0f}% of the multiply-accumulates)"
    return out


def _angles(g, profile: Profile) -> set:
    """Names of main-graph values read by a Sin/Cos, directly or through data movement and the ops whose inputs
    share their output's grid (profile.tie_inputs_and_output: a rotary embedding's Concat(freqs, freqs)). A value
    other nodes read too is included: a finer grid costs them nothing in accuracy."""
    moves, ties = set(profile.shares_input_encoding), set(profile.tie_inputs_and_output)

    def step(v):
        p = v.producer
        if p is not None and p.op_type in moves and p.inputs:
            return [p.inputs[0]]
        if p is not None and p.op_type in ties:
            return [x for x in p.inputs if x is not None and not x.is_constant()]
        return []
    seeds = (n.inputs[0] for n in g.nodes if n.op_type in PERIODIC_OPS and n.inputs)
    return {v.name for v in walk_up(seeds, step)}


def _exp_inputs(g, profile: Profile) -> set:
    """Names of main-graph values read by a Softmax/LogSoftmax, directly or through data movement that keeps
    the grid (profile.shares_input_encoding).

    Why: the scores plus an additive attention mask of -1e4 (older BERT exports' `(1 - mask) * -10000.0`,
    a float16 model's clip) span ~1e4, so 8 bits give the scores one step of ~40 and minilm_l6's cosine fell to
    0.59. Nothing in the value's own statistics is wrong (the mask is a quarter to two thirds of its values);
    what is wrong is the step, measured in the units exp reads."""
    moves = set(profile.shares_input_encoding)

    def step(v):
        p = v.producer
        if p is not None and p.op_type in moves and p.inputs and p.inputs[0] is not None and len(v.uses()) == 1:
            return [p.inputs[0]]
        return []
    seeds = (n.inputs[0] for n in g.nodes if n.op_type in EXP_OPS and n.inputs)
    return {v.name for v in walk_up(seeds, step)}
