"""Take out the Q/DQ pairs that only cost time, under a stated accuracy budget (`--optimize latency`).

A Q/DQ pair between two ops that both run float kernels on the target (no integer kernel of the profile's fusion
table reads or writes the value: placement/float_regions.quantizers_without_integer_kernel) costs two passes over
the tensor on every run and buys no speed. Taking it out usually makes the output more accurate, but not always:
on ppocr_cls, quantization errors partly cancel, and taking out every such pair lowered the output SQNR from 23.0
to 20.7 dB (agreement 0.9925 -> 0.985), while each pair alone moves it by -1.5..+1.8 dB. So the pairs are taken
out by a measured greedy search:

- candidates in order of estimated gain: the value's element count (a Q and a DQ are each one pass over it), from
  the shape calibration saw, largest first;
- the search runs on the safety net's switchable copy of the QDQ model (one onnxruntime session; a Where after each
  candidate's DQ picks the DQ or the float value) on every kept calibration sample (up to ALL_SAMPLES_UP_TO;
  beyond, the TRIAL_SAMPLES with the most noise, an estimate), and
  takes a group out when the output SQNR (min over outputs) with it out stays at or above the floor: first all
  candidates at once, else each half in turn, recursively down to single pairs;
- the floor: `latency_budget_db` (`--latency-budget-db`, default 1 dB) below the output SQNR with every pair in
  place, and never below the safety net's `--min-sqnr` (unless the start already is);
- the kept removals are applied to the real model (the pair removed, the value recorded float with the reason),
  and the output SQNR is measured again on every kept sample.

Bounded: at most MAX_TRIALS trials and MAX_SECONDS. Only `--optimize latency` searches; a target without a
fusion table (trt, qnn_htp) skips it (placement there does not change).

NOTE: why `balanced` (the default) does not run it with a 0 dB budget: on ppocr_cls the search then takes out all
20 pairs with the output SQNR on the calibration samples rising (22.99 -> 23.3 dB) and the model 0.95x float
instead of 1.09x, but eval agreement falls 0.9925 -> 0.985 (3 of 400 images flip; every quarter of the pairs
alone flips 0-4). The calibration SQNR cannot promise a discrete metric at that resolution, and the corpus
targets may not drop. Report key `latency_search`: the floor,
the SQNR before and after, the trials, and how many pairs were taken out.

NOTE: the estimated gain is the tensor size, not a timing of each step: one timing per step on a loaded machine
is noise (a 1.3 ms model's median moves by 10%), and every candidate's gain has the same sign.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np

DEFAULT_LATENCY_BUDGET_DB = 1.0
MAX_TRIALS = 64
MAX_SECONDS = 20.0
TRIAL_SAMPLES = 8          # trial samples (those with the most noise) when there are more than ...
ALL_SAMPLES_UP_TO = 32     # ... this many kept samples; up to it every trial runs all of them (exact)


@dataclass
class SearchOutcome:
    ran: bool = False
    floor_db: float = float("nan")
    before_db: float = float("nan")
    after_db: float = float("nan")
    candidates: int = 0
    removed: List[str] = field(default_factory=list)
    trials: int = 0
    note: str = ""

    def to_dict(self) -> dict:
        def r(v):
            return round(v, 2) if isinstance(v, float) and math.isfinite(v) else (None if isinstance(v, float)
                                                                                   and math.isnan(v) else v)
        return {"ran": self.ran, "floor_db": r(self.floor_db), "sqnr_before_db": r(self.before_db),
                "sqnr_after_db": r(self.after_db), "candidates": self.candidates, "removed": len(self.removed),
                "trials": self.trials, **({"note": self.note} if self.note else {})}


def check_latency_budget(value) -> float:
    """`latency_budget_db=` of the API: None -> DEFAULT_LATENCY_BUDGET_DB; a finite number of dB >= 0."""
    from ..arguments import got
    from ..errors import ArgumentError
    if value is None:
        return DEFAULT_LATENCY_BUDGET_DB
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(value)) or not 0 <= float(value) <= 100:
        raise ArgumentError(f"latency_budget_db must be a number of dB between 0 and 100, got {got(value)}")
    return float(value)


def _sizes(quants, observers) -> dict:
    """Element count of each candidate value per sample: its static shape, else the count calibration observed
    (all samples: the same factor for every value), else 0."""
    out = {}
    for z in quants:
        shape = z.q.inputs[0].shape
        if shape and all(isinstance(d, int) and d > 0 for d in shape):
            out[z.key] = float(np.prod(shape))
            continue
        obs = (observers or {}).get(z.key)
        try:
            out[z.key] = float(obs.stats().get("count", 0)) if obs is not None else 0.0
        except Exception:   # noqa: BLE001 - an ordering hint only
            out[z.key] = 0.0
    return out


def run_latency_search(ctx) -> SearchOutcome:
    """The search on a quantized QuantContext (in place on ctx.model, ctx.plan, ctx.activations, ctx.errors)."""
    out = SearchOutcome()
    s = ctx.settings
    if s.optimize != "latency" or not ctx.profile.fusions or not ctx.calibration or not ctx.calibration.kept:
        out.note = f"skipped: --optimize {s.optimize}" if s.optimize != "latency" else \
            ("skipped: the target has no fusion table" if not ctx.profile.fusions else "skipped: no samples")
        return out
    from .safety_net import (_switch_proto, _Trials, _left_float, activation_quantizers, db, worst_sqnr,
                             MAX_WEIGHT_BYTES)
    from .memory import weight_bytes
    model = ctx.model
    names = set(getattr(ctx.plan, "trim_candidates", ()) or ())
    quants = [z for z in activation_quantizers(model, ctx.activations) if z.key in names]
    out.candidates = len(quants)
    if not quants:
        out.note = "no Q/DQ pair between two float kernels"
        return out
    if weight_bytes(model) > MAX_WEIGHT_BYTES:
        out.note = f"skipped: weights over {MAX_WEIGHT_BYTES >> 20} MB"
        return out
    from ..errors import QCompilerError
    from ..ort_session import create_session
    out.ran = True
    kept = ctx.calibration.kept
    budget = s.latency_budget_db
    deadline = time.perf_counter() + MAX_SECONDS
    try:
        sess = create_session(_switch_proto(model, quants, None), role="latency search")
        trials = _Trials(sess, kept, len(quants), False, MAX_TRIALS, MAX_SECONDS)
        if len(kept) > ALL_SAMPLES_UP_TO:
            trials.pick(TRIAL_SAMPLES)
        k = len(quants)
        base = db(trials.harm(range(k)))
        out.before_db = base
        floor = base - budget
        if math.isfinite(s.min_sqnr):
            floor = max(floor, min(base, s.min_sqnr))
        out.floor_db = floor
        sizes = _sizes(quants, ctx.calibration.observers)
        order = sorted(range(k), key=lambda i: -sizes.get(quants[i].key, 0.0))
        off: set = set()

        def ok(group) -> Optional[bool]:
            if trials.left() <= 0 or time.perf_counter() > deadline:
                return None
            on = [i for i in range(k) if i not in off and i not in group]
            return db(trials.harm(on)) >= floor

        def take(group) -> None:
            verdict = ok(group)
            if verdict is None:
                return
            if verdict:
                off.update(group)
            elif len(group) > 1:
                half = len(group) // 2
                take(group[:half])
                take(group[half:])

        take(order)
        out.trials = trials.count
        if trials.out_of_time or trials.count >= MAX_TRIALS:
            out.note = f"stopped after {trials.count} trials"
    except QCompilerError as e:
        out.note = f"could not run: {getattr(e, 'reason', str(e))[:200]}"
        return out
    if not off:
        out.after_db = worst_sqnr(ctx.errors) if ctx.errors else out.before_db
        return out
    g = model.graph
    why = (f"no integer kernel on {ctx.profile.name} reads or writes it: its Q/DQ pair only cost time and the "
           f"latency search took it out (output SQNR stays >= {floor:.1f} dB; --optimize accuracy keeps it)")
    for i in sorted(off):
        z = quants[i]
        g.substitute(z.dq.outputs[0], z.q.inputs[0], remove=[z.dq, z.q])
        _left_float(ctx.plan, ctx.activations, z.key, why)
        out.removed.append(z.key)
    from ..ir import verify
    verify(g)
    from .report import output_errors
    ctx.errors = output_errors(model, kept)
    out.after_db = worst_sqnr(ctx.errors)
    return out


__all__ = ["run_latency_search", "check_latency_budget", "SearchOutcome", "DEFAULT_LATENCY_BUDGET_DB"]
