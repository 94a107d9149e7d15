"""`latency-search`: take out the Q/DQ pairs between two float kernels while the output SQNR stays at or above
the floor (`balanced`: the SQNR before; `latency`: `--latency-budget-db` below it).
A no-op for `--optimize accuracy` and for targets without a fusion table.

`--optimize latency`: a measured search that trades accuracy for speed within a stated budget.

Two kinds of candidates, both from placement (placement/float_regions.py, with the profile's fusion table):
- trim: a Q/DQ pair between two ops that both run float kernels on the target (plan.trim_candidates). It costs
  two passes over the tensor on every run and buys no speed; its fast state is "taken out". Taking it out is
  usually more accurate, but not always: on ppocr_cls quantization errors partly cancel, and each pair alone
  moves the output SQNR by -1.5..+1.8 dB. Since the cost rules, placement takes every such pair out under
  balanced and latency alike (float_regions.py), so on a fusion-table target this list is empty and the search
  decides the narrowed groups only;
- narrow: a tie group placement widened to 16 bits (8 bits cannot carry it) whose reader would run an integer
  kernel at 8 bits (onnxruntime CPU has no 16-bit one) (plan.narrow_candidates). Its fast state is 8 bits; its
  accurate state is float (as under `balanced`), with the reader's float weights (plan.narrow_weights: the
  integer kernel's reduced 7-bit weight grid cost minilm_l6's FFN down projection 17 dB). Placement lists only
  the values `balanced` would widen too (a value whose 8-bit readers hold a quarter of the compute keeps 8 bits
  under both: placement/widening.py), and a reader left float gets the float kernel's weight form from
  narrow-float-weights (int8 MatMulNBits on ort_cpu, as under balanced; exact float weights made minilm_l6
  1.01x float at 0.53x its file, against balanced's 0.92x at 0.26x). The trials run such a reader with exact
  float weights; the start and the floor are restated with that form's measured noise (_with_weight_form).

The search starts from the accurate state and moves candidates to their fast state, the trim pairs first, then
the narrowed groups, each in order of estimated gain (the value's element count: a Q and a DQ are each one pass
over it, from the shape calibration saw), while the
output SQNR (min over outputs) stays at or above the floor: all at once, else each half in turn, recursively down
to single candidates (a narrowed tie group moves as one). The floor is `latency_budget_db`
(`--latency-budget-db`, default 1 dB) below the starting SQNR, and never below the safety net's `--min-sqnr`
(unless the start already is). Trials run on the safety net's switchable copy of the QDQ model (one
onnxruntime session; a Where after each candidate's DQ picks the DQ or the float value, another on each kept
float weight) over every kept calibration sample up to ALL_SAMPLES_UP_TO (then the SQNR the search sees is the
one the report measures), beyond that over the TRIAL_SAMPLES with the most noise (an estimate: minilm_l6 ended
0.02 dB under its floor). The result is applied to the real model and its SQNR measured again on every kept
sample. Report key `latency_search`: floor, SQNR before/after, candidates, pairs taken out, groups narrowed.

Measured (onnxruntime 1.32, avx512_vnni, CPU clock, budget 1 dB): minilm_l6 0.98x -> 0.84x float at cosine
0.9964 (6 groups narrowed); ppocr_cls 1.09x -> 0.90x at agreement 0.985 (all 20 trim pairs out, SQNR 23.0 ->
23.3 dB).

Bounded: at most MAX_TRIALS trials and MAX_SECONDS. Only `--optimize latency` searches; a target without a
fusion table (trt, qnn_htp) skips it (placement there does not change).

NOTE: why `balanced` (the default) does not run it with a 0 dB budget: on ppocr_cls the search then takes out all
20 pairs with the output SQNR on the calibration samples rising (22.99 -> 23.3 dB) and the model 0.95x float
instead of 1.09x, but eval agreement falls 0.9925 -> 0.985 (3 of 400 images flip; each quarter of the pairs
alone: 0.9775-0.99). The calibration SQNR cannot promise a discrete metric at that resolution, and the corpus
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

from qcompiler.passes.quantize.safety_net.budget import Clock
from qcompiler.passes.quantize.narrow_float_weights import narrow_float_weights
from qcompiler.passes.quantize.safety_net import _left_float
from qcompiler.passes.quantize.safety_net.trials import (
    _Trials,
    activation_quantizers,
    db,
    switch_sites,
    worst_sqnr,
)

from qcompiler.errors import QCompilerError
from qcompiler.ir import verify
from qcompiler.ort_session import create_session
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.core.qdq import constant_dq_value, remove_qdq
from qcompiler.quant.interop.report import output_errors
from qcompiler.quant.runtime.switchable import Site, switchable_model

MAX_TRIALS = 96         # minilm_l6: 65 candidates, 20 narrowed groups; 64 stopped it half way
MAX_SECONDS = 600.0        # a last resort only: a bound in seconds makes the result depend on the load
                           # (minilm_l6: 60 s gave 24 trials and 0.84x at load 15, fewer and 0.97x at 20)
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
    narrowed: List[str] = field(default_factory=list)
    trials: int = 0
    weight_only: int = 0     # float-kernel weights then stored int8 by narrow-float-weights
    note: str = ""

    def to_dict(self) -> dict:
        def r(v):
            return round(v, 2) if isinstance(v, float) and math.isfinite(v) else (None if isinstance(v, float)
                                                                                   and math.isnan(v) else v)
        return {"ran": self.ran, "floor_db": r(self.floor_db), "sqnr_before_db": r(self.before_db),
                "sqnr_after_db": r(self.after_db), "candidates": self.candidates, "removed": len(self.removed),
                "narrowed_to_8_bits": len(self.narrowed),
                "trials": self.trials, "weights_stored_int8": self.weight_only, **({"note": self.note} if self.note else {})}


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
    model = ctx.model
    trim = set(getattr(ctx.plan, "trim_candidates", ()) or ())
    narrow = set(getattr(ctx.plan, "narrow_candidates", ()) or ())
    quants = [z for z in activation_quantizers(model, ctx.activations) if z.key in trim or z.key in narrow]
    out.candidates = len(quants)
    if not quants:
        out.note = "no Q/DQ pair between two float kernels and no widened value an integer kernel would read"
        return out
    out.ran = True
    kept = ctx.calibration.kept
    budget = s.latency_budget_db
    deadline = time.perf_counter() + MAX_SECONDS
    k = len(quants)
    slow_on = {i for i in range(k) if quants[i].key not in narrow}   # the starting (accurate) state
    # the units the search moves: a trim candidate alone, a narrowed tie group together (one grid)
    units: dict = {}
    for i, z in enumerate(quants):
        units.setdefault(("n", ctx.plan.find(z.key)) if z.key in narrow else ("t", i), []).append(i)
    fast: set = set()      # candidates moved to their fast state (trim: off; narrowed: on at 8 bits)
    try:
        unit_of = {("n", ctx.plan.find(z.key)): i for i, z in enumerate(quants) if z.key in narrow}
        copy, _ = switchable_model(model, switch_sites(quants, None) + _weight_sites(model, ctx.plan, unit_of), k)
        sess = create_session(copy, role="latency search")
        del copy
        trials = _Trials(sess, kept, k, False, MAX_TRIALS, Clock.fixed(MAX_SECONDS))
        if len(kept) > ALL_SAMPLES_UP_TO:
            trials.pick(TRIAL_SAMPLES)

        def on_set(moved):
            return [i for i in range(k) if (i in slow_on) != (i in moved)]

        harm0 = trials.harm(on_set(set()))
        chosen = [harm0]     # the harm of the state the search has reached
        base = db(harm0)
        out.before_db = base
        floor = base - budget
        if math.isfinite(s.min_sqnr):
            floor = max(floor, min(base, s.min_sqnr))
        out.floor_db = floor
        sizes = _sizes(quants, ctx.calibration.observers)
        def by_size(kind):
            return sorted((u for key, u in units.items() if key[0] == kind),
                          key=lambda u: -sum(sizes.get(quants[i].key, 0.0) for i in u))

        def ok(group) -> Optional[bool]:
            if trials.left() <= 0 or time.perf_counter() > deadline:
                return None
            harm = trials.harm(on_set(fast | {i for u in group for i in u}))
            if db(harm) < floor:
                return False
            chosen[0] = harm
            return True

        def take(group) -> None:
            verdict = ok(group)
            if verdict is None:
                return
            if verdict:
                fast.update(i for u in group for i in u)
            elif len(group) > 1:
                half = len(group) // 2
                take(group[:half])
                take(group[half:])

        # the trim pairs first, together (taking them out usually gains SQNR: one trial on minilm's 49), then the
        # narrowed groups: with 64 trials mixed in one order, minilm narrowed 5 groups (0.96x float), this way 18
        take(by_size("t"))
        take(by_size("n"))
        out.trials = trials.count
        if trials.out_of_time or trials.count >= MAX_TRIALS or time.perf_counter() > deadline:
            out.note = f"stopped after {trials.count} trials (the rest stays as placed)"
    except QCompilerError as e:
        out.note = f"could not run: {getattr(e, 'reason', str(e))[:200]}"
        _apply(ctx, quants, set(), narrow, float("nan"))
        return out
    out.removed = _apply(ctx, quants, fast, narrow, floor)
    out.narrowed = [quants[i].key for i in fast if quants[i].key in narrow]
    if any(z in narrow for z in out.removed):   # their readers run float kernels again: the weight form such a
        out.weight_only = narrow_float_weights(ctx)  # kernel's weights take (int8 MatMulNBits on ort_cpu), as under balanced
    if out.removed and ctx.errors is not None:     # measured again only where the pipeline measures
        ctx.errors = output_errors(model, kept)
    out.after_db = worst_sqnr(ctx.errors) if ctx.errors else (out.before_db if not out.removed else float("nan"))
    if out.weight_only and math.isfinite(out.after_db):
        _with_weight_form(out, s, harm0, chosen[0])
    return out


def _with_weight_form(out: SearchOutcome, s, harm0: float, harm_chosen: float) -> None:
    """The trials ran the float-kernel readers with exact float weights; the model stores them as the float
    kernel's weight form (narrow-float-weights: int8 MatMulNBits on ort_cpu), so the start and the floor are
    restated with that form's noise, measured: the real output noise minus the trial's for the chosen state. Its
    noise only shrinks as groups move to 8 bits (their readers then read Q/DQ weights), so the start with it is
    at least this noisy, and the chosen state stays within the budget of the restated start."""
    form = max(0.0, 10 ** (-out.after_db / 10) - harm_chosen)
    out.before_db = db(harm0 + form)
    out.floor_db = out.before_db - s.latency_budget_db
    if math.isfinite(s.min_sqnr):
        out.floor_db = max(out.floor_db, min(out.before_db, s.min_sqnr))


def _weight_sites(model, plan, unit_of: dict) -> List[Site]:
    """Where a narrowed value is switched off, the kernel that reads it runs float with the float weight
    (placement kept it: plan.narrow_weights): on the same switch, that reader's weight slot reads the weight's DQ
    or that copy."""
    weights = getattr(plan, "narrow_weights", None) or {}
    nodes = {n.name: n for n in model.graph} if weights else {}
    sites = []
    for (node_name, slot), (root, arr) in sorted(weights.items(), key=lambda kv: kv[0]):
        node, i = nodes.get(node_name), unit_of.get(("n", root))
        if node is None or i is None or slot >= len(node.inputs) or node.inputs[slot] is None:
            continue
        sites.append(Site(i, node.inputs[slot].name, np.asarray(arr), reader=(node_name, slot)))  # its float type
    return sites


def _apply(ctx, quants, fast: set, narrow: set, floor: float) -> List[str]:
    """Take out the trim candidates moved to their fast state and the narrowed ones not moved (with the weight
    DQs of the readers that then run float folded onto the grid); returns the value names taken out."""
    g = ctx.model.graph
    removed = []
    at = f" (output SQNR stays >= {floor:.1f} dB)" if math.isfinite(floor) else ""
    for i, z in enumerate(quants):
        narrowed = z.key in narrow
        if narrowed == (i in fast):
            continue
        if narrowed:
            why = ("the latency search kept it float: 8 bits cannot carry it within --latency-budget-db, and no "
                   "integer kernel reads 16 bits")
            readers = [u.user for u in z.dq.outputs[0].uses() if not u.is_graph_output]
        else:
            why = (f"no integer kernel on {ctx.profile.name} reads or writes it: its Q/DQ pair only cost time and "
                   f"the latency search took it out{at} (--optimize accuracy keeps it)")
            readers = []
        remove_qdq(g, z.q, z.dq)
        _left_float(ctx.plan, ctx.activations, z.key, why)
        removed.append(z.key)
        for node in readers:
            _float_weights(g, node, ctx.plan, ctx.plan.find(z.key))
            _fold_weight_dqs(g, node)
    if removed:
        verify(g)
    return removed


def _float_weights(g, node, plan, root) -> None:
    """The float weights placement kept for `node` (plan.narrow_weights) replace its weight DQs."""
    for (node_name, slot), (r, arr) in (getattr(plan, "narrow_weights", None) or {}).items():
        if node_name != node.name or r != root or slot >= len(node.inputs):
            continue
        old = node.inputs[slot]
        g.set_input(node, slot, g.add_constant(np.asarray(arr), f"{old.name}_float"))   # its own float type
        dq = old.producer
        if dq is not None and dq.op_type == "DequantizeLinear" and not old.uses():
            ins = list(dq.inputs)
            g.remove_node(dq)
            g.drop_if_unused(ins)
        else:
            g.drop_if_unused([old])
        spec = plan.uses.get((node_name, slot))
        if spec is not None:
            spec.float_(f"{node.op_type} reads a value the latency search kept float: a float kernel, float weight")


def _fold_weight_dqs(g, node) -> None:
    """The reader of a value that went float runs a float kernel: its constant weight/bias DQs would run on every
    inference (onnxruntime does not constant-fold DQ in QDQ models): store them as float32 on their grid."""
    for slot, v in enumerate(node.inputs):
        dq = v.producer if v is not None else None
        if dq is None or dq.op_type != "DequantizeLinear":
            continue
        values = constant_dq_value(dq)
        if values is None:
            continue
        grid = g.add_constant(values, f"{v.name}_prefolded")   # DQ's type
        g.set_input(node, slot, grid)
        if not v.uses():
            ins = list(dq.inputs)
            g.remove_node(dq)
            g.drop_if_unused(ins)


__all__ = ["run_latency_search", "SearchOutcome"]


@register_pass
class LatencySearch(QuantPass):
    name = "latency-search"
    description = "take out Q/DQ pairs between float kernels under an output SQNR floor (--optimize)"
    preserves_semantics = False
    requires = ("quant-context", "qdq")

    def run(self, ctx) -> PassResult:
        out = run_latency_search(ctx)
        ctx.latency_search = out.to_dict()
        return PassResult(bool(out.removed), {"candidates": out.candidates, "removed": len(out.removed),
                                              "trials": out.trials})
