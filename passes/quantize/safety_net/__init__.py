"""`safety-net`: when an output's SQNR is below the floor (`--min-sqnr`), find and fix the quantizers that break
it (keep float or widen to 16 bits; weights too). A no-op above the floor. User documentation: docs/safety-net.md.

Calibration statistics find tensors 8 bits cannot carry (placement.py), but not an error a later op amplifies:
E[x²]−E[x]² of a normalization the patterns missed cancels catastrophically when x has a large mean, with every
tensor on its own well resolved. So, only when the output SQNR (min over float graph outputs, on the calibration
samples) is below the floor, the quantized model is measured with quantizers switched on and off, in phases that
each run only while the output is still below the floor:

1. quantizers (`search.py`): one switchable copy of the QDQ graph (`trials.py`: a `Where` after each main-graph
   activation Q→DQ, ONE onnxruntime session for every trial) and a bisection on what turning quantizers OFF
   gains; a fixed group is widened to 16 bits when that gets close to float, else kept float;
2. regions (`regions.py`): when the quantizer search ends below the floor (damage spread over a module that only
   hurts together), name scopes, supergroups and contiguous stretches in graph order are tried whole, the
   smallest that reaches the floor kept and shrunk;
3. weights (`weights.py`): when every activation quantizer float still does not reach the floor, the weights'
   grids are switched the same way: per-channel where the profile allows it for the reader, else 16 bits where
   the target runs 16-bit weights, else float;
4. If/Loop/Scan bodies (`body_fallback`): their activation quantizers, all float at once.

The fixes are applied to the real QDQ model and the output SQNR measured again on it (the real fused kernels);
when still below the floor a second pass (MAX_PASSES) starts from it. The budget of sample runs grows with the model
(`budget.py`); every region and weight trial is in the report (`safety_net.tried`) and the summary says in one
line what was kept and why (`safety_net.summary`). Independent trials (the two halves of a group, one round's
candidate regions) run at once on the run's executor (`parallel.py`; `--ray`), with the serial run's result.

NOTE: quantizers inside If/Loop/Scan bodies are not switchable one by one (a Where per quantizer would have to
bubble its switch into every body). The switchable copy shares the model's weights (runtime/switchable.py), so
a model of any size is searched: its session goes to onnxruntime with external data above one protobuf's worth.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from qcompiler.errors import QCompilerError
from qcompiler.ir import verify
from qcompiler.onnx_io.rewrite import rewritten_copy
from qcompiler.ort_session import create_session
from qcompiler.passes.quantize.safety_net.budget import Clock, float_nodes
from qcompiler.passes.quantize.safety_net.parallel import describe, trial_pool
from qcompiler.passes.quantize.safety_net.regions import MAX_REGION_TRIALS, RegionSearch
from qcompiler.passes.quantize.safety_net.search import MIN_GAIN_DB, search
from qcompiler.passes.quantize.safety_net.weights import weight_phase
from qcompiler.passes.quantize.safety_net.trials import (
    RUNS_IN_FLIGHT,
    TRIAL_SAMPLES,
    _Quantizer,
    _Trials,
    _wide_encoding,
    activation_quantizers,
    db,
    reaching,
    switch_sites,
    worst_sqnr,
)
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.progress import bar
from qcompiler.quant.core.context import Outcome, QuantPass
from qcompiler.quant.core.qdq import _qparams, pinned_pairs, remove_qdq
from qcompiler.quant.interop.report import output_errors, rounded_db
from qcompiler.quant.runtime.executor import run_executor
from qcompiler.quant.runtime.memory import weight_bytes
from qcompiler.quant.runtime.switchable import switchable_model

# NOTE: the default floor. Output SQNR (min over outputs) of the corpus models with the defaults (ort_cpu,
# min_max), on their calibration samples, before this module: digits_cnn 36.1 dB, char_rnn 36.8 dB, ppocr_cls
# 22.9 dB, minilm_l6 17.9 dB (last_hidden_state; sentence_embedding 22.0 dB). The floor sits below every one of
# them (the net never runs on them, their results do not change) and well above garbage (the issue's
# unrecognised normalization: -3.5 dB, 4 % top-1 agreement; 24 dB with it float).
MAX_TRIALS = 48            # quantizer-search trials (each: TRIAL_SAMPLES runs; one more over every kept sample)
TARGET_MARGIN_DB = 1.5     # the search aims this far above the floor (see run_safety_net)
MAX_PASSES = 2             # switchable sessions at most
REGIONS = True             # phase 2 (tests turn it off to show what the quantizer search alone reaches)

__all__ = ["TRIAL_SAMPLES", "_Quantizer", "_Trials", "activation_quantizers", "db", "reaching", "run_safety_net",
           "switch_sites", "worst_sqnr"]


def run_safety_net(model, plan, acts: dict, kept: list, errors: dict, floor: float, profile,
                   max_trials: Optional[int] = None, samples: Optional[int] = None, progress=None, source=None,
                   params: Optional[dict] = None, executor=None, ray: Optional[str] = None,
                   prepared: Optional[dict] = None):
    """When the output SQNR in `errors` is below `floor`: find and fix the quantizers that break it (in place on
    `model`, `plan` and `acts`). Returns (Outcome, errors of the fixed model or None when nothing changed).
    `source`: the float model as the caller gave it (float weights for phase 3; `prepared`: those a prepare pass
    wrote, ctx.prepared_weights). `executor` (an object with
    map(fn, items)) runs the independent trials (parallel.py); without one, `run_executor(ray, ...)`'s rule
    picks it, only once the net runs."""
    out = Outcome(before_db=worst_sqnr(errors))
    out.after_db = out.before_db
    if not (out.before_db < floor) or not kept:
        return out, None
    out.triggered = True
    wide_bits = profile.wide_activation_bits
    if wide_bits and model.opset < 21:
        wide_bits = None
    out.samples = min(len(kept), samples or TRIAL_SAMPLES)
    budget = max_trials or MAX_TRIALS
    clock = Clock(float_nodes(model))
    own = executor is None
    if own:
        executor = run_executor(ray, weight_bytes(model), in_process=RUNS_IN_FLIGHT)
    out.executor = describe(executor)
    try:
        new_errors = _passes(model, plan, acts, kept, errors, floor, profile, source, params, out, clock, wide_bits, budget,
                executor, progress, prepared)
    finally:
        if own:
            executor.close()
    out.seconds_budget = round(clock.seconds, 1)
    out.runs_budget, out.runs = clock.runs_budget, clock.runs
    out.summary = summary_line(out, floor)
    return out, new_errors


def _passes(model, plan, acts, kept, errors, floor, profile, source, params, out: Outcome, clock, wide_bits,
            budget: int, executor, progress, prepared: Optional[dict] = None) -> Optional[dict]:
    """The phases of run_safety_net (its docstring): the fixed model's errors, or None."""
    new_errors = None
    # NOTE: the trials' estimate (the worst samples, fake-quantized) and the real model (onnxruntime's fused
    # integer kernels, every kept sample) can differ by a few dB (trt, mean 20: 16.2 vs 13.2 dB): the search aims
    # TARGET_MARGIN_DB above the floor, and a second pass (a fresh switchable copy) starts from the real figure
    cur = errors
    with bar("safety net", None, progress, unit="trial") as shown:
        for _ in range(MAX_PASSES):
            # only quantizers upstream of an output the search must lift (below the floor plus its margin)
            low = [n for n, e in cur.items() if e.sqnr_db() < floor + TARGET_MARGIN_DB]
            quants = reaching(model, activation_quantizers(model, acts), low)
            if not quants:
                out.note = out.note or "no activation quantizer to turn off"
                break
            no_wide = {i for i, z in enumerate(quants) if wide_bits and z.enc.bits >= wide_bits}
            fixes, note = _one_pass(model, plan, kept, quants, floor, wide_bits, no_wide, out,
                                    budget - out.trials, clock, shown.update, executor)
            if note:
                out.note = note
            if not fixes:
                out.note = out.note or ("no further activation quantizer found whose removal helps" if out.changed
                                        else "no activation quantizer found whose removal helps")
                break
            _apply(model, plan, acts, quants, fixes, wide_bits, out)
            verify(model.graph)
            new_errors = cur = output_errors(model, kept)
            out.after_db = worst_sqnr(new_errors)
            if out.after_db >= floor or clock.out():
                break
        if out.after_db < floor and clock.out():
            out.note = f"{out.note}; " if out.note else ""
            out.note += f"weights not searched: the search spent {clock.spent()}"
        elif out.after_db < floor and source is not None:
            fixed = weight_phase(model, plan, kept, new_errors or errors, floor, profile,
                                 source, out, clock, shown.update, params, executor, prepared)
            new_errors = fixed if fixed is not None else new_errors
    if out.after_db < floor:
        fixed = body_fallback(model, plan, acts, kept, new_errors or errors, out)
        new_errors = fixed if fixed is not None else new_errors
    return new_errors


def _changed_phrase(changed: List[dict]) -> str:
    """`3 quantizers (2 at 16 bits and 1 float: 'a', 'b', 'c')`."""
    acts = [c["action"] for c in changed]
    parts = [f"{acts.count('widened')} at 16 bits" if "widened" in acts else "",
             f"{acts.count('float')} float" if "float" in acts else ""]
    names = ", ".join(f"'{c['value']}'" for c in changed[:3]) + (", ..." if len(changed) > 3 else "")
    return f"{len(changed)} quantizers ({' and '.join(p for p in parts if p)}: {names})"


def summary_line(out: Outcome, floor: float) -> str:
    """One line: what the net kept float (or widened) and why."""
    if not out.triggered:
        return ""
    acts = [c for c in out.changed if c["action"] in ("widened", "float")]
    phrases = [out.kept.get("region") or (_changed_phrase(acts) if acts else ""), out.kept.get("weights", "")]
    what = "; ".join(p for p in phrases if p) or "nothing"
    verdict = "reaches" if out.after_db >= floor else "still below"
    why = f"output SQNR {out.before_db:.1f} dB -> {out.after_db:.1f} dB, {verdict} the floor {floor:g} dB"
    return f"kept {what}: {why}"


def body_quantizers(model, acts: Dict[str, object]) -> List[_Quantizer]:
    """Activation Q→DQ pairs inside If/Loop/Scan bodies (what qdq.apply_plan wrote there), keyed like
    `activation_quantizers`."""
    found = []
    for body in model.graph.subgraphs(recursive=True):
        for q in body.nodes_by_op("QuantizeLinear"):
            x = q.inputs[0]
            if x is None or x.tensor is not None or (x.producer is not None and x.producer.op_type == "Constant"):
                continue
            uses = q.outputs[0].uses()
            if len(uses) != 1 or uses[0].is_graph_output or uses[0].user.op_type != "DequantizeLinear":
                continue
            dq = uses[0].user
            if dq.outputs[0].is_output_of_any_graph() and not body.can_take_name(x):
                continue
            key = dq.outputs[0].name if dq.outputs[0].name in acts else x.name
            if key in acts:
                found.append(_Quantizer(key, q, dq, acts[key]))
    return found


def body_fallback(model, plan, acts: dict, kept: list, errors: dict, out: Outcome) -> Optional[dict]:
    """Still below the floor after the search: every activation quantizer inside the bodies turned float at once,
    measured on a copy, applied when the output gains MIN_GAIN_DB. Returns the new errors, or None."""
    quants = body_quantizers(model, acts)
    if not quants:
        return None
    before = worst_sqnr(errors)
    trial = rewritten_copy(model, lambda proto: proto, "copy the model")   # shares the weights
    _drop_quantizers(body_quantizers(trial, dict(acts)))
    after = worst_sqnr(output_errors(trial, kept))
    del trial
    if not after - before >= MIN_GAIN_DB:
        note = (f"{len(quants)} activation quantizers inside If/Loop/Scan bodies not searched one by one; all of "
                f"them float gave {after:.1f} dB (from {before:.1f} dB): kept")
        out.note = f"{out.note}; {note}" if out.note else note
        return None
    _drop_quantizers(quants)
    reason = (f"left float by the safety net: output SQNR {before:.1f} dB -> {after:.1f} dB with every activation "
              f"quantizer inside If/Loop/Scan bodies float ({len(quants)}; they are not searched one by one)")
    for z in quants:
        _left_float(plan, acts, z.key, reason)
        out.changed.append({"value": z.key, "action": "float", "sqnr_before_db": rounded_db(before),
                            "sqnr_after_db": rounded_db(after), "reason": reason})
    verify(model.graph)
    new = output_errors(model, kept)
    out.after_db = worst_sqnr(new)
    return new


def _drop_quantizers(quants: List[_Quantizer]) -> None:
    for z in quants:
        remove_qdq(z.q.graph, z.q, z.dq)


def _one_pass(model, plan, kept, quants, floor, wide_bits, no_wide, out: Outcome, trials_left: int, clock,
              on_trial=None, executor=None):
    """One switchable session, the quantizer search and (below the floor) the region search: (fixes, note)."""
    trials = pool = None
    target = floor + TARGET_MARGIN_DB
    try:
        copy, _ = switchable_model(model, switch_sites(quants, wide_bits), len(quants), bool(wide_bits))
        pool = trial_pool(executor, copy)
        sess = create_session(copy, role="safety net")
        del copy
        trials = _Trials(sess, kept, len(quants), bool(wide_bits), trials_left, clock, on_trial, pool)
        if len(kept) > out.samples:
            trials.pick(out.samples)
        tried = []
        fixes, fixed, h_cur = search(trials, len(quants), target, wide_bits, no_wide, [z.key for z in quants],
                                     tried)
        out.tried.extend(_tried_dict(t) for t in tried)
        out.quantizer_search_db = db(h_cur)
        if REGIONS and db(h_cur) < target and not clock.out():
            trials.max_trials = trials.count + MAX_REGION_TRIALS
            rs = RegionSearch(trials, quants, fixed, target, wide_bits, no_wide)
            found = rs.run(plan)
            out.tried.extend(_tried_dict(t) for t in rs.tried)
            if found is not None:
                region, members, action, reached = found
                fixes.append((members, action, db(h_cur), reached, region.label))
                out.kept["region"] = (f"{'module' if region.kind == 'scope' else region.kind} '{region.label}' "
                            f"({len(members)} quantizers) {'at 16 bits' if action == 'wide' else 'float'}"
                            if region.kind != "stretch" else
                            f"{region.label} ({len(members)} quantizers) "
                            f"{'at 16 bits' if action == 'wide' else 'float'}")
                out.kept["region"] += (f" (single quantizers alone reached {db(h_cur):.1f} dB: they only hurt "
                                       f"together)")
    except QCompilerError as e:
        # NOTE: the net is a best effort on a model that already quantized: onnxruntime refusing the switchable
        # copy (or a trial run) leaves the model as it is, with the reason, and the quality gate still applies
        out.trials += trials.count if trials is not None else 0
        return [], f"could not run: {getattr(e, 'reason', str(e))[:200]}"
    finally:
        if pool is not None:
            out.parallel_trials += pool.trials
            pool.close()
    out.trials += trials.count
    note = f"stopped after {clock.spent()}" if trials.out_of_time else ""
    return fixes, note


def _tried_dict(t) -> dict:
    return {"region": t.region, "kind": t.kind, "action": t.action, "quantizers": t.quantizers,
            "sqnr_db": rounded_db(t.sqnr_db), "kept": t.kept}


def _apply(model, plan, acts, quants, fixes, wide_bits, out: Outcome) -> None:
    g = model.graph
    for i, choice, before, after, n, label in ((i, f[1], f[2], f[3], len(f[0]), f[4] if len(f) > 4 else None)
                                               for f in fixes for i in f[0]):
        z = quants[i]
        shown = f"{after:.1f} dB" if np.isfinite(after) else f"{after}"
        it = "it" if n == 1 else f"it and {n - 1} more (they hurt together)"
        if label:
            it = f"'{label}' ({n} quantizers, region search: they only hurt together)"
        if choice == "wide":
            what = f"widened to {wide_bits} bits by the safety net"
            reason = f"{what}: output SQNR {before:.1f} dB -> {shown} with {it} at {wide_bits} bits"
            enc = _wide_encoding(z.enc, wide_bits)
            scale, zp = _qparams(g, enc, f"{z.key}_wide", np.asarray(z.q.inputs[1].const_value()).dtype)
            old = list(z.q.inputs[1:3])
            pinned = [n for pair in pinned_pairs(z.dq) for n in pair]   # pairs on its grid after data movement
            for node in (z.q, z.dq, *pinned):
                g.set_input(node, 1, scale)
                g.set_input(node, 2, zp)
            g.drop_if_unused(old)
            # the Q output's declared type was the 8-bit storage type: onnxruntime refused the widened model
            # (uint8 declared, uint16 produced); the new type follows from the zero point
            for node in (z.q, *pinned[::2]):
                node.outputs[0].type = None
            acts[z.key] = enc
            spec = plan.values.get(z.key)
            if spec is not None:
                spec.bits, spec.widened, spec.encoding = int(wide_bits), reason, enc
        else:
            reason = f"left float by the safety net: output SQNR {before:.1f} dB -> {shown} with {it} float"
            remove_qdq(g, z.q, z.dq)
            _left_float(plan, acts, z.key, reason)
        out.changed.append({"value": z.key, "action": "widened" if choice == "wide" else "float",
                            "sqnr_before_db": rounded_db(before), "sqnr_after_db": rounded_db(after), "reason": reason})


def _left_float(plan, acts: dict, key: str, reason: str) -> None:
    """Record that the safety net took value `key`'s quantizer out: no encoding, float, with `reason` (it
    replaces whatever reason placement gave)."""
    acts.pop(key, None)
    spec = plan.values.get(key)
    if spec is not None:
        spec.encoding = None
        spec.float_(reason)
        spec.reason = reason


@register_pass
class SafetyNet(QuantPass):
    name = "safety-net"
    description = "below the output SQNR floor: keep float or widen the quantizers that break an output"
    preserves_semantics = False
    requires = ("quant-context", "qdq", "output-errors")

    def run(self, ctx) -> PassResult:
        outcome, fixed = run_safety_net(ctx.model, ctx.plan, ctx.activations, ctx.calibration.kept, ctx.errors,
                                        ctx.settings.min_sqnr, ctx.profile, progress=ctx.settings.progress,
                                        source=ctx.source, params=ctx.params, executor=ctx.settings.executor,
                                        ray=ctx.settings.ray, prepared=ctx.prepared_weights)
        ctx.safety_net = outcome
        if fixed is not None:
            ctx.errors = fixed
        return PassResult(bool(outcome.changed), {"triggered": outcome.triggered, "changed": len(outcome.changed)})
