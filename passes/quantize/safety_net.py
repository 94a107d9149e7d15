"""`safety-net`: when an output's SQNR is below the floor (`--min-sqnr`), find and fix the quantizers that break
it (keep float or widen to 16 bits). A no-op above the floor.

The safety net: find the activation quantizers that break the output and keep them float (or widen them).

Calibration statistics find tensors 8 bits cannot carry (placement.py), but not an error a later op amplifies:
E[x²]−E[x]² of a normalization the patterns missed cancels catastrophically when x has a large mean, with every
tensor on its own well resolved. So, only when the output SQNR (min over float graph outputs, on the calibration
samples) is below the floor, the quantized model is measured with quantizers switched on and off:

- one "switchable" copy of the QDQ graph is built: after each activation Q→DQ pair of the main graph,
  `Where(on[i], DQ, x)` (and, when the profile has int16 activations, `Where(wide[i], DQ16(Q16(x)), DQ)`), with
  `on`/`wide` as bool graph inputs; ONE onnxruntime session runs every trial of a pass (a trial = the
  TRIAL_SAMPLES kept samples with the largest error, one setting of the switches);
- the quantizers are searched by bisection on what turning them OFF gains (the others on, so quantizers that
  only hurt together, like E[x²] and E[x]² of one variance, are seen together; `search`): the half that removes
  most of the noise is followed while it removes at least half of what its group removed, else the group is
  fixed as one; a fixed group is widened to 16 bits when that gets close to float (or well above the floor),
  else kept float, and then its members are turned back on one by one while the output stays well above the
  floor; rounds repeat until the output SQNR reaches the floor, nothing more helps, or `MAX_TRIALS` trials;
- the fixes are applied to the real QDQ model (the Q/DQ pair removed, or its grid replaced by a 16-bit one),
  and the report's SQNR is measured again on it (a second session, the real fused kernels); when that is still
  below the floor, a second pass (MAX_PASSES) starts from it. Cost bound: MAX_TRIALS trials and MAX_SECONDS in
  all, two sessions per pass.

NOTE: only main-graph activation quantizers take part in the search: weights are per channel and their float
copies are gone after export. Quantizers inside If/Loop/Scan bodies are not switchable one by one
(a Where per quantizer would have to bubble its switch into every body); when the search leaves the output below
the floor, `body_fallback` tries them as one group: all turned float, kept when the output gains MIN_GAIN_DB,
and the report names each; otherwise the note says they were not searched (the quality gate still applies). Models whose weights exceed `MAX_WEIGHT_BYTES` are skipped
(the switchable copy is one protobuf), with a note.
"""
from __future__ import annotations

import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from qcompiler.errors import QCompilerError
from qcompiler.ir import verify
from qcompiler.onnx_io import model_to_proto
from qcompiler.onnx_io.importer import model_from_proto
from qcompiler.ort_session import create_session
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.core.context import Outcome, QuantPass
from qcompiler.quant.core.encoding import compute_encoding
from qcompiler.quant.core.qdq import (
    _qparams,
    cast_ends,
    pinned_pairs,
    remove_qdq,
    storage_dtype,
)
from qcompiler.quant.interop.report import OutputError, output_errors, rounded_db
from qcompiler.quant.runtime.memory import weight_bytes

# NOTE: the default floor. Output SQNR (min over outputs) of the corpus models with the defaults (ort_cpu,
# min_max), on their calibration samples, before this module: digits_cnn 36.1 dB, char_rnn 36.8 dB, ppocr_cls
# 22.9 dB, minilm_l6 17.9 dB (last_hidden_state; sentence_embedding 22.0 dB). The floor sits below every one of
# them (the net never runs on them, their results do not change) and well above garbage (the issue's
# unrecognised normalization: -3.5 dB, 4 % top-1 agreement; 24 dB with it float).
MAX_TRIALS = 48            # switchable-model trials (each: TRIAL_SAMPLES runs; one more over every kept sample)
MAX_SECONDS = 30.0         # no trial starts after this many seconds (minilm_l6: ~0.5 s a trial)
TRIAL_SAMPLES = 8          # calibration samples per trial: the kept samples with the largest error
MAX_FIXES = 16             # groups of quantizers turned float / widened at most
WIDEN_GAP_DB = 3.0         # widen (not float) when 16 bits get within this much of float ...
WIDEN_MARGIN_DB = 6.0      # ... or this much above the floor; members are turned back on while this much above
MIN_GAIN_DB = 0.5          # a fix is kept only when the output SQNR gains at least this much
GROUP_DB_PER_HALVING = 3.0  # a group of n that only hurts together is fixed as one if it gains 3·log2(n) dB
MAX_WEIGHT_BYTES = 1 << 30
TARGET_MARGIN_DB = 1.5     # the search aims this far above the floor (see run_safety_net)
MAX_PASSES = 2             # switchable sessions at most
_SWITCH_ON, _SWITCH_WIDE = "qcompiler_safety_net_on", "qcompiler_safety_net_wide"


def worst_sqnr(errors: dict) -> float:
    """Min SQNR (dB) over the outputs of `output_errors()`; +inf when there are none."""
    vals = [e.sqnr_db() for e in (errors or {}).values()]
    return min(vals) if vals else float("inf")


@dataclass
class _Quantizer:
    key: str            # the plan/encodings name of the quantized value
    q: object           # QuantizeLinear node (IR)
    dq: object          # DequantizeLinear node (IR)
    enc: object         # its Encoding


def activation_quantizers(model, acts: Dict[str, object]) -> List[_Quantizer]:
    """Main-graph activation Q→DQ pairs whose encoding is per tensor, in graph order, keyed by their value name."""
    g = model.graph
    found = []
    for q in g.nodes_by_op("QuantizeLinear"):
        x = q.inputs[0]
        if x is None or x.tensor is not None or (x.producer is not None and x.producer.op_type == "Constant"):
            continue
        out = q.outputs[0]
        uses = out.uses()
        if len(uses) != 1 or uses[0].is_graph_output or uses[0].user.op_type != "DequantizeLinear" \
                or uses[0].user.graph is not g:   # read only through bodies' own DQs (qdq.local_dequantizers)
            continue
        dq = uses[0].user
        if dq.outputs[0].is_output_of_any_graph() and not g.can_take_name(x):
            continue   # a graph input (or output) read straight into a graph output: nothing to turn off
        ends = cast_ends(q, dq)    # float16 at opset < 19: Cast -> Q -> DQ -> Cast (qdq.float_route)
        key = next((v.name for v in (dq.outputs[0], x, ends[1], ends[0]) if v.name in acts), x.name)
        enc = acts.get(key)
        if enc is None or enc.per_channel or enc.frozen or not _same_scale(q, enc):
            continue
        found.append(_Quantizer(key, q, dq, enc))
    order = {n: i for i, n in enumerate(g.topological_nodes(("QuantizeLinear",)))}
    found.sort(key=lambda z: order[z.q])
    return found


def reaching(model, quants: List[_Quantizer], outputs) -> List[_Quantizer]:
    """The quantizers whose value reaches one of the graph outputs named in `outputs` (turning the others off
    cannot change those outputs: a trial on them would be wasted)."""
    wanted = set(outputs)
    reached = model.graph.outputs_reached([z.dq.outputs[0] for z in quants])
    return [z for z in quants if any(o.name in wanted for o in reached[z.dq.outputs[0]])]


def _same_scale(q, enc) -> bool:
    """Is `enc` the grid this Q node carries (a per-use Q/DQ has its own, not its value's)?"""
    sv = q.inputs[1] if len(q.inputs) > 1 else None
    arr = sv.const_value() if sv is not None else None
    return arr is not None and np.size(arr) == 1 and np.allclose(np.asarray(arr, np.float64).reshape(()),
                                                                  np.asarray(enc.scale, np.float64).reshape(()))


def _wide_encoding(enc, bits: int):
    e = compute_encoding(enc.min, enc.max, bits=bits, symmetric=enc.symmetric, signed=enc.signed)
    e.meta = dict(enc.meta)
    return e


def _switch_proto(model, quants: List[_Quantizer], wide_bits: Optional[int]):
    """The QDQ model as a ModelProto with a Where switch after each quantizer (see the module docstring)."""
    mp = model_to_proto(model)
    g = mp.graph
    k = len(quants)
    by_dq = {z.dq.name: (i, z) for i, z in enumerate(quants)}
    g.input.append(helper.make_tensor_value_info(_SWITCH_ON, TensorProto.BOOL, [k]))
    if wide_bits:
        g.input.append(helper.make_tensor_value_info(_SWITCH_WIDE, TensorProto.BOOL, [k]))
    nodes = list(g.node)
    del g.node[:]
    p = "qcompiler_sn"
    for n in nodes:
        hit = by_dq.get(n.name) if n.op_type == "DequantizeLinear" else None
        if hit is None:
            g.node.append(n)
            continue
        i, z = hit
        out, x = n.output[0], z.q.inputs[0].name
        dq_out = f"{p}{i}_dq"
        n.output[0] = dq_out
        g.node.append(n)
        g.initializer.append(numpy_helper.from_array(np.asarray(i, np.int64), f"{p}{i}_idx"))
        g.node.append(helper.make_node("Gather", [_SWITCH_ON, f"{p}{i}_idx"], [f"{p}{i}_on"], name=f"{p}{i}_g"))
        chosen = dq_out
        if wide_bits:
            e = _wide_encoding(z.enc, wide_bits)
            s_dtype = np.asarray(z.q.inputs[1].const_value()).dtype      # float16 scales: qdq.float_route
            g.initializer.append(numpy_helper.from_array(np.asarray(e.scale, np.float32).astype(s_dtype),
                                                         f"{p}{i}_s16"))
            g.initializer.append(numpy_helper.from_array(
                np.asarray(e.zero_point).astype(storage_dtype(e)), f"{p}{i}_z16"))
            g.node.append(helper.make_node("QuantizeLinear", [x, f"{p}{i}_s16", f"{p}{i}_z16"], [f"{p}{i}_q16"],
                                           name=f"{p}{i}_q16"))
            g.node.append(helper.make_node("DequantizeLinear", [f"{p}{i}_q16", f"{p}{i}_s16", f"{p}{i}_z16"],
                                           [f"{p}{i}_dq16"], name=f"{p}{i}_dq16"))
            g.node.append(helper.make_node("Gather", [_SWITCH_WIDE, f"{p}{i}_idx"], [f"{p}{i}_w"],
                                           name=f"{p}{i}_gw"))
            g.node.append(helper.make_node("Where", [f"{p}{i}_w", f"{p}{i}_dq16", dq_out], [f"{p}{i}_sel"],
                                           name=f"{p}{i}_ww"))
            chosen = f"{p}{i}_sel"
        g.node.append(helper.make_node("Where", [f"{p}{i}_on", chosen, x], [out], name=f"{p}{i}_where"))
    del mp.graph.value_info[:]   # the DQ outputs were renamed; onnxruntime infers the rest
    return mp


class _Trials:
    """Runs one setting of the switches on the trial samples; harm = max over outputs of noise/signal, scaled so
    that all quantizers on gives the harm over every kept sample (`pick`)."""

    def __init__(self, sess, kept, k: int, wide: bool, max_trials: int, max_seconds: float = float("inf")):
        self.sess, self.kept, self.k, self.wide, self.max_trials = sess, kept, k, wide, max_trials
        self.names = [o.name for o in sess.get_outputs()]
        self.count = 0
        self.scale: Dict[str, float] = {}
        self.deadline = time.perf_counter() + max_seconds
        self.out_of_time = False

    def left(self) -> int:
        if time.perf_counter() > self.deadline:
            self.out_of_time = True
            return 0
        return self.max_trials - self.count

    def pick(self, samples: int) -> None:
        """All quantizers on, over every kept sample (one trial): keep the `samples` samples with the most noise
        relative to their output (the error is often in a few samples: ppocr_cls, first 8 of 32: 49 dB, all 32:
        24 dB) and the scale from their harm to the harm over all samples."""
        per = self._errors(self.kept, range(self.k), (), per_sample=True)
        total: Dict[str, OutputError] = {}
        for errs in per:
            for n, e in errs.items():
                t = total.setdefault(n, OutputError())
                t.signal, t.noise, t.count = t.signal + e.signal, t.noise + e.noise, t.count + 1
        worst = max(total, key=lambda n: _ratio(total[n]), default=None)
        if worst is None:
            return
        order = sorted(range(len(per)), key=lambda i: -(per[i][worst].noise if worst in per[i] else 0.0))
        self.kept = [self.kept[i] for i in sorted(order[:samples])]
        chosen = [per[i] for i in sorted(order[:samples])]
        for n, t in total.items():
            sig = sum(c[n].signal for c in chosen if n in c)
            noise = sum(c[n].noise for c in chosen if n in c)
            self.scale[n] = (_ratio(t) / (noise / sig)) if noise > 0 and sig > 0 else 1.0

    def _errors(self, kept, on, wide, per_sample: bool = False):
        self.count += 1
        flags = np.zeros(self.k, bool)
        flags[list(on)] = True
        feedx = {_SWITCH_ON: flags}
        if self.wide:
            w = np.zeros(self.k, bool)
            w[list(wide)] = True
            feedx[_SWITCH_WIDE] = w
        out = []
        # NOTE: two single-threaded runs in flight, as report._output_errors (a busy 2-core box)
        with ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1))) as pool:
            runs = pool.map(lambda item: self.sess.run(self.names, {**item[0], **feedx},
                                                       where="a safety-net trial"), kept)
            for (feed, ref), outs in zip(kept, runs):
                errs: Dict[str, OutputError] = {}
                for n, a in zip(self.names, outs):
                    r = ref.get(n)
                    if r is not None and np.issubdtype(np.asarray(r).dtype, np.floating):
                        errs.setdefault(n, OutputError()).update(r, a, feed)
                out.append(errs)
        if per_sample:
            return out
        total: Dict[str, OutputError] = {}
        for errs in out:
            for n, e in errs.items():
                t = total.setdefault(n, OutputError())
                t.signal, t.noise = t.signal + e.signal, t.noise + e.noise
        return total

    def harm(self, on, wide=()) -> float:
        errs = self._errors(self.kept, on, wide)
        return max((_ratio(e) * self.scale.get(n, 1.0) for n, e in errs.items()), default=0.0)


def _ratio(e) -> float:
    if e.noise == 0.0:
        return 0.0
    return e.noise / e.signal if e.signal > 0 else float("inf")


def db(harm: float) -> float:
    if harm <= 0:
        return float("inf")
    return float(-10 * np.log10(harm)) if np.isfinite(harm) else float("-inf")


def search(trials: _Trials, k: int, floor: float, wide_bits: Optional[int], no_wide=frozenset()):
    """Returns [(indices, "float"|"wide", dB before, dB after)] in the order they were fixed.

    Each round starts from every quantizer not fixed yet, turned off together (the others as they are): when
    that gains less than MIN_GAIN_DB the rest of the harm is not in activations and the search stops. Otherwise
    the group is halved while one half, turned off alone, removes at least half the noise the group removed;
    when neither half does, the quantizers of the group only hurt together (E[x²] and E[x]² cancelling) and the
    group is fixed as one if it gains GROUP_DB_PER_HALVING·log2(size) dB (else the harm is spread thin over many
    quantizers: the better half is followed while it gains MIN_GAIN_DB, so a 1 dB gain never widens 80 of them);
    the smallest group on the way down that gains that much is the one fixed. A fixed group is widened when 16
    bits get within WIDEN_GAP_DB of float (or above the floor by WIDEN_MARGIN_DB; never one already at 16 bits,
    `no_wide`), else kept float; then its members are turned back on one by one (a trial each,
    within the cap) where the output SQNR stays WIDEN_MARGIN_DB above the floor.
    """
    fixed: Dict[int, str] = {}
    fixes = []

    def measure(off=(), wide=()):
        off, wide = set(off), set(wide)
        on = [j for j in range(k) if j not in off and fixed.get(j) != "float"]
        w = [j for j in range(k) if (fixed.get(j) == "wide" or j in wide) and j not in off]
        return trials.harm(on, w)

    h_cur = measure()
    while db(h_cur) < floor and trials.left() > 1 and len(fixes) < MAX_FIXES:
        group = [j for j in range(k) if j not in fixed]
        if not group:
            break
        h_g = measure(off=group)
        if not db(h_g) > db(h_cur) + MIN_GAIN_DB:
            break
        def fixable(grp, h):
            return db(h) - db(h_cur) >= max(MIN_GAIN_DB, GROUP_DB_PER_HALVING * math.log2(len(grp)))

        path = [(group, h_g)]
        while len(group) > 1 and trials.left() > 4:
            half = len(group) // 2
            parts = [(measure(off=p), p) for p in (group[:half], group[half:])]
            h_best, best = min(parts, key=lambda t: t[0])
            if (h_cur - h_best) >= 0.5 * (h_cur - h_g):
                group, h_g = best, h_best          # one half carries it
            elif fixable(group, h_g):
                break                              # they hurt together, and enough to be fixed as one
            elif db(h_best) > db(h_cur) + MIN_GAIN_DB:
                group, h_g = best, h_best          # harm spread thin: follow the better half
            else:
                break
            path.append((group, h_g))
        found = [(grp, h) for grp, h in path if fixable(grp, h)]
        if not found:
            break
        group, h_g = list(found[-1][0]), found[-1][1]   # the smallest group on the way that is worth fixing
        choice, h_new = "float", h_g
        if wide_bits and not no_wide.intersection(group) and trials.left() > 1:
            h_w = measure(wide=group)
            if db(h_w) >= min(db(h_g) - WIDEN_GAP_DB, floor + WIDEN_MARGIN_DB):
                choice, h_new = "wide", h_w
        for j in group:
            fixed[j] = choice
        if len(group) > 1:
            for j in list(group):
                if trials.left() < 2 or len(group) == 1:
                    break
                del fixed[j]
                h_try = measure()
                if db(h_try) >= max(floor + WIDEN_MARGIN_DB, db(h_cur) + MIN_GAIN_DB):
                    group.remove(j)
                    h_new = h_try
                else:
                    fixed[j] = choice
        fixes.append((group, choice, db(h_cur), db(h_new)))
        h_cur = h_new
    return fixes


def run_safety_net(model, plan, acts: dict, kept: list, errors: dict, floor: float, profile,
                   max_trials: Optional[int] = None, samples: Optional[int] = None):
    """When the output SQNR in `errors` is below `floor`: find and fix the quantizers that break it (in place on
    `model`, `plan` and `acts`). Returns (Outcome, errors of the fixed model or None when nothing changed)."""
    out = Outcome(before_db=worst_sqnr(errors))
    out.after_db = out.before_db
    if not (out.before_db < floor) or not kept:
        return out, None
    out.triggered = True
    if weight_bytes(model) > MAX_WEIGHT_BYTES:
        out.note = f"skipped: weights over {MAX_WEIGHT_BYTES >> 20} MB"
        return out, None
    wide_bits = profile.wide_activation_bits
    if wide_bits and model.opset < 21:
        wide_bits = None
    out.samples = min(len(kept), samples or TRIAL_SAMPLES)
    budget, deadline = max_trials or MAX_TRIALS, time.perf_counter() + MAX_SECONDS
    new_errors = None
    # NOTE: the trials' estimate (the worst samples, fake-quantized) and the real model (onnxruntime's fused
    # integer kernels, every kept sample) can differ by a few dB (trt, mean 20: 16.2 vs 13.2 dB): the search aims
    # TARGET_MARGIN_DB above the floor, and a second pass (a fresh switchable copy) starts from the real figure
    cur = errors
    for _ in range(MAX_PASSES):
        # only quantizers upstream of an output the search must lift (below the floor plus its margin)
        low = [n for n, e in cur.items() if e.sqnr_db() < floor + TARGET_MARGIN_DB]
        quants = reaching(model, activation_quantizers(model, acts), low)
        if not quants:
            out.note = out.note or "no activation quantizer to turn off"
            break
        no_wide = {i for i, z in enumerate(quants) if wide_bits and z.enc.bits >= wide_bits}
        fixes, note = _one_pass(model, kept, quants, floor, wide_bits, no_wide, out, budget - out.trials, deadline)
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
        if out.after_db >= floor or out.trials >= budget - 2 or time.perf_counter() > deadline:
            break
    if out.after_db < floor:
        fixed = body_fallback(model, plan, acts, kept, new_errors or errors, out)
        new_errors = fixed if fixed is not None else new_errors
    return out, new_errors


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
    trial = model_from_proto(model_to_proto(model))
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


def _one_pass(model, kept, quants, floor, wide_bits, no_wide, out: Outcome, trials_left: int, deadline: float):
    """One switchable session and a search: (fixes, note)."""
    trials = None
    try:
        sess = create_session(_switch_proto(model, quants, wide_bits), role="safety net")
        trials = _Trials(sess, kept, len(quants), bool(wide_bits), trials_left, deadline - time.perf_counter())
        if len(kept) > out.samples:
            trials.pick(out.samples)
        fixes = search(trials, len(quants), floor + TARGET_MARGIN_DB, wide_bits, no_wide)
    except QCompilerError as e:
        # NOTE: the net is a best effort on a model that already quantized: onnxruntime refusing the switchable
        # copy (or a trial run) leaves the model as it is, with the reason, and the quality gate still applies
        out.trials += trials.count if trials is not None else 0
        return [], f"could not run: {getattr(e, 'reason', str(e))[:200]}"
    out.trials += trials.count
    note = f"stopped after {MAX_SECONDS:g} s of trials" if trials.out_of_time else ""
    return fixes, note


def _apply(model, plan, acts, quants, fixes, wide_bits, out: Outcome) -> None:
    g = model.graph
    for i, choice, before, after, n in ((i, c, b, a, len(grp)) for grp, c, b, a in fixes for i in grp):
        z = quants[i]
        shown = f"{after:.1f} dB" if np.isfinite(after) else f"{after}"
        it = "it" if n == 1 else f"it and {n - 1} more (they hurt together)"
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
                                        ctx.settings.min_sqnr, ctx.profile)
        ctx.safety_net = outcome
        if fixed is not None:
            ctx.errors = fixed
        return PassResult(bool(outcome.changed), {"triggered": outcome.triggered, "changed": len(outcome.changed)})
