"""Phase 3 of the safety net: weights. When every activation quantizer float still leaves the output below the
floor, the loss sits in the weights' grids (qnn_htp's per-tensor 8-bit MatMul weights on a transformer). Each
main-graph weight DequantizeLinear gets a finer alternative, the first the target carries:

- per-channel 8 bits, when the reader's op may be per-channel on the target (profile `per_channel_ops`) and the
  weight is per-tensor;
- 16 bits on the same granularity, when the target runs 16-bit weights (one fact: mixed_precision's
  `legal_candidates`) and the model is at opset 21;
- float.

The alternatives are switched like activation quantizers (one session, `Where(on[i], DQ, alternative)`:
qcompiler/quant/runtime/switchable.py), searched
by the same bisection (search.py) and, below the floor, the same region search (regions.py); the weights kept
are rewritten in the model (a new integer tensor and grid, or the float weight) and the plan says why.

The float weights come from the model as the caller gave it (`source`): the quantized integers are all the QDQ
model holds. A source weight is used only when the stored integers are its rounding on the current grid (a
prepare pass that changed it, or renamed it, leaves that weight out).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional

import numpy as np

from qcompiler.errors import QCompilerError
from qcompiler.ir import verify
from qcompiler.onnx_io.initializers import proto_initializers, read_initializers
from qcompiler.ort_session import create_session
from qcompiler.passes.quantize.mixed_precision.search import legal_candidates
from qcompiler.passes.quantize.safety_net.parallel import trial_pool
from qcompiler.passes.quantize.safety_net.regions import MAX_REGION_TRIALS, RegionSearch
from qcompiler.passes.quantize.safety_net.search import search
from qcompiler.passes.quantize.safety_net.trials import _Trials, db, worst_sqnr
from qcompiler.quant.core.encoding import compute_encoding
from qcompiler.quant.core.qdq import _qparams, _quantize_array, broadcast_qparams, output_axis
from qcompiler.quant.interop.report import output_errors, rounded_db
from qcompiler.quant.runtime.switchable import Site, switchable_model

MAX_WEIGHT_TRIALS = 48
# NOTE: weights aim this far above the floor (the activations aim 1.5 dB above it): a finer weight grid changes
# no activation grid, only bytes. minilm_l6 on qnn_htp, aiming 1.5 dB above: 5 weights at 16 bits, 15.9 dB and
# mean cosine 0.989 on its eval set; cosine 0.99 needs about 17 dB (1 - cos is about 1 / (2 SNR))
WEIGHT_MARGIN_DB = 3.0
_SUFFIX = "_quantized"


@dataclass
class WeightChoice:
    key: str             # the weight's name (plan / encodings)
    dq: object           # its DequantizeLinear (IR)
    enc: object          # current Encoding
    kind: str            # "per-channel" | "16 bits" | "float"
    new_enc: object      # the finer Encoding (None: float)
    alt: np.ndarray      # what the DQ would give with it (float32, the DQ output's values)
    float_w: np.ndarray


def _source_weights(source, names, prepared: Optional[dict] = None) -> dict:
    """{name: float array} for those of `names` the caller's float model holds as main-graph initializers, with
    the weights a prepare pass wrote (`prepared`) winning: the model quantized holds them.

    NOTE: from a file only these tensors are read (onnx_io.initializers): loading the whole float model again
    held every weight once more beside the quantized model and its switchable copy."""
    prepared = prepared or {}
    out = {name: np.asarray(prepared[name]) for name in names if name in prepared}
    names = [name for name in names if name not in out]
    if not names or source is None:
        return out
    if isinstance(source, (str, os.PathLike)):
        out.update(read_initializers(os.fspath(source), names))
    elif hasattr(source, "SerializeToString"):
        out.update(proto_initializers(source, names))
    else:
        inits = source.graph.initializers
        out.update({name: np.asarray(inits[name].const_value()) for name in names if name in inits})
    return out


def sixteen_bit_weights(profile) -> bool:
    """Does the target run 16-bit weights (the mixed-precision search's list of what it can carry)?"""
    return any(c.weight_bits == 16 for c in legal_candidates(profile)[0])


def _finer(enc, w: np.ndarray, reader, profile, wide_ok: bool):
    """(kind, Encoding or None) of the first finer grid the target carries for weight `w` read by `reader`."""
    axis = output_axis(reader) if reader.op_type != "MatMul" else (w.ndim - 1 if w.ndim >= 2 else None)
    if not enc.per_channel and axis is not None and reader.op_type in profile.per_channel_ops:
        red = tuple(a for a in range(w.ndim) if a != axis)
        e = compute_encoding(w.min(axis=red), w.max(axis=red), bits=enc.bits, symmetric=enc.symmetric,
                             signed=enc.signed, axis=axis)
        return "per-channel", e
    if wide_ok and enc.bits < 16:
        if enc.per_channel:
            red = tuple(a for a in range(w.ndim) if a != enc.axis)
            e = compute_encoding(w.min(axis=red), w.max(axis=red), bits=16, symmetric=enc.symmetric,
                                 signed=enc.signed, axis=enc.axis)
        else:
            e = compute_encoding(float(w.min()), float(w.max()), bits=16, symmetric=enc.symmetric,
                                 signed=enc.signed)
        return "16 bits", e
    return "float", None


def _dequantize(q: np.ndarray, enc) -> np.ndarray:
    scale, zp = broadcast_qparams(enc, q.shape)
    return ((q.astype(np.float64) - zp) * scale).astype(np.float32)


def weight_choices(model, params: dict, profile, source, prepared: Optional[dict] = None):
    """The main graph's weight DQs whose float original the source holds (unchanged), with their finer grid;
    and {why skipped: count}."""
    if source is None and not prepared:
        return [], {"no float model to read the weights from": 1}
    g = model.graph
    wide_ok = model.opset >= 21 and sixteen_bit_weights(profile)
    skipped: dict = {}
    found = []   # (dq, key, enc, readers, why)
    for dq in g.nodes_by_op("DequantizeLinear"):
        qv = dq.inputs[0]
        if qv is None or qv.tensor is None or not qv.name.endswith(_SUFFIX):
            continue
        key = qv.name[:-len(_SUFFIX)]
        enc = (params or {}).get(key)
        readers = [u.user for u in dq.outputs[0].uses() if not u.is_graph_output]
        why = None
        if enc is None or not readers:
            why = "no weight encoding"
        elif enc.bits < 8 or getattr(enc, "block_size", None):
            why = "per-block or below 8 bits"
        found.append((dq, key, enc, readers, why))
    floats = _source_weights(source, [key for _, key, _, _, why in found if why is None], prepared)
    out = []
    for dq, key, enc, readers, why in found:
        w = None if why else floats.get(key)
        if why is None and (w is None or not np.issubdtype(w.dtype, np.floating)):
            why = "not in the float model (a prepare pass made it)"
        if why is None:
            q = np.asarray(dq.inputs[0].const_value())
            if q.shape != w.shape or not np.array_equal(_quantize_array(w, enc), q):
                why = "changed since the float model (a prepare pass)"
        if why:
            skipped[why] = skipped.get(why, 0) + 1
            continue
        kind, new_enc = _finer(enc, w.astype(np.float64), readers[0], profile, wide_ok)
        alt = w.astype(np.float32) if new_enc is None else _dequantize(_quantize_array(w, new_enc), new_enc)
        out.append(WeightChoice(key, dq, enc, kind, new_enc, alt, w))
    return out, skipped


def _switch_sites(choices: List[WeightChoice]) -> List[Site]:
    """Switch i after weight i's DequantizeLinear: off reads its alternative (in the DQ's output type)."""
    return [Site(i, c.dq.outputs[0].name, c.alt.astype(np.asarray(c.dq.inputs[1].const_value()).dtype, copy=False))
            for i, c in enumerate(choices)]


def weight_phase(model, plan, kept, errors, floor, profile, source, out, clock, on_trial=None,
                 params: Optional[dict] = None, executor=None, prepared: Optional[dict] = None) -> Optional[dict]:
    """Search and apply finer weight grids (module docstring) until the output is WEIGHT_MARGIN_DB above `floor`.
    Returns the new errors, or None."""
    target = floor + WEIGHT_MARGIN_DB
    if MAX_WEIGHT_TRIALS <= 2:
        return None            # no trial to spend on a search: no session either
    choices, skipped = weight_choices(model, params, profile, source, prepared)
    if skipped:
        note = "weights not searched: " + ", ".join(f"{n} {why}" for why, n in skipped.items())
        out.note = f"{out.note}; {note}" if out.note else note
    if not choices:
        return None
    trials = pool = None
    try:
        copy, _ = switchable_model(model, _switch_sites(choices), len(choices))
        pool = trial_pool(executor, copy)
        sess = create_session(copy, role="safety net (weights)")
        del copy
        trials = _Trials(sess, kept, len(choices), False, MAX_WEIGHT_TRIALS, clock, on_trial, pool)
        if len(kept) > out.samples:
            trials.pick(out.samples)
        tried = []
        fixes, fixed, h = search(trials, len(choices), target, None, names=[c.key for c in choices], tried=tried,
                                 noun="weights")
        label = None
        if db(h) < target and not clock.out():
            trials.max_trials = trials.count + MAX_REGION_TRIALS
            rs = RegionSearch(trials, [_Named(c) for c in choices], fixed, target, None, noun="weights")
            found = rs.run(None)
            tried.extend(rs.tried)
            if found is not None:
                region, members, _, reached = found
                fixes.append((members, "float", db(h), reached))
                label = region.label
    except QCompilerError as e:
        out.trials += trials.count if trials is not None else 0
        out.note = (out.note + "; " if out.note else "") + f"weights not searched: {getattr(e, 'reason', str(e))[:200]}"
        return None
    finally:
        if pool is not None:
            out.parallel_trials += pool.trials
            pool.close()
    out.trials += trials.count
    out.tried.extend({"region": t.region, "kind": t.kind if t.kind.startswith("weights") else f"weights {t.kind}",
                      "action": "finer grid" if t.action == "float" else t.action, "quantizers": t.quantizers,
                      "sqnr_db": rounded_db(t.sqnr_db), "kept": t.kept} for t in tried)
    chosen = sorted({i for f in fixes for i in f[0]})
    if not chosen:
        return None
    before = worst_sqnr(errors)
    for i in chosen:
        _apply(model, plan, choices[i], params)
    verify(model.graph)
    new = output_errors(model, kept)
    after = worst_sqnr(new)
    kinds = sorted({choices[i].kind for i in chosen})
    for i in chosen:
        c = choices[i]
        reason = (f"weight {'made ' + c.kind if c.kind == 'per-channel' else 'widened to 16 bits' if c.kind == '16 bits' else 'kept float'} "
                  f"by the safety net: output SQNR {before:.1f} dB -> {after:.1f} dB with {len(chosen)} weights "
                  f"finer")
        out.changed.append({"value": c.key, "action": f"weight {c.kind}", "sqnr_before_db": rounded_db(before),
                            "sqnr_after_db": rounded_db(after), "reason": reason})
    names = ", ".join(f"'{choices[i].key}'" for i in chosen[:3]) + (", ..." if len(chosen) > 3 else "")
    where = f" (region search: {label})" if label else ""
    what = f"{len(chosen)} weight{'s' if len(chosen) != 1 else ''}{where} " + \
        " / ".join({"16 bits": "at 16 bits", "per-channel": "per channel", "float": "float"}[k] for k in kinds) + \
        f" ({names}; activations alone could not reach the floor)"
    out.kept["weights"] = what
    out.after_db = after
    return new


class _Named:
    """A WeightChoice seen as a quantizer by the region search (its name scope is its reader's)."""

    def __init__(self, c: WeightChoice):
        self.key = c.key
        readers = [u.user for u in c.dq.outputs[0].uses() if not u.is_graph_output]
        self.q = _Reader(readers[0] if readers else c.dq)
        self.dq = c.dq


class _Reader:
    def __init__(self, node):
        self.inputs = [_Value(node)]


class _Value:
    def __init__(self, node):
        self.producer = node


def _apply(model, plan, c: WeightChoice, params: Optional[dict]) -> None:
    g = model.graph
    specs = [sp for sp in plan.uses.values() if sp.kind == "weight" and sp.encoding is c.enc]
    if c.new_enc is None:
        fv = g.add_constant(np.asarray(c.float_w), c.key)
        for u in list(c.dq.outputs[0].uses()):
            if not u.is_graph_output:
                g.set_input(u.user, u.index, fv)
        old = list(c.dq.inputs)
        if not c.dq.outputs[0].uses():
            g.remove_node(c.dq)
        g.drop_if_unused(old)
        for spec in specs:
            spec.encoding = None
            spec.float_("weight kept float by the safety net")
        if params is not None:
            params.pop(c.key, None)
        return
    for u in list(c.dq.outputs[0].uses()):
        if not u.is_graph_output and u.index == 1:
            _requantize_bias(g, u.user, c.new_enc)
    qarr = _quantize_array(c.float_w, c.new_enc)
    wq = g.add_constant(qarr, f"{c.key}{_SUFFIX}")
    scale, zp = _qparams(g, c.new_enc, c.key, np.asarray(c.dq.inputs[1].const_value()).dtype)
    old = list(c.dq.inputs)
    g.set_input(c.dq, 0, wq)
    g.set_input(c.dq, 1, scale)
    g.set_input(c.dq, 2, zp)
    if c.new_enc.per_channel:
        c.dq.set_attr("axis", int(c.new_enc.axis))
    g.drop_if_unused(old)
    for spec in specs:
        spec.encoding = c.new_enc
        spec.bits = c.new_enc.bits
        if c.new_enc.per_channel:
            spec.axis = c.new_enc.axis
    if params is not None:
        params[c.key] = c.new_enc


def _requantize_bias(g, reader, enc) -> None:
    """An int32 bias DQ of `reader` (Conv/Gemm) on the grid s_in x s_w of the new weight grid `enc`, as the fused
    integer kernels read it (onnxruntime takes the int32 values and assumes that scale). Left as it is when the
    structure differs or the values would not fit in int32 (then the reader runs float on that target)."""
    bias = reader.inputs[2] if len(reader.inputs) > 2 else None
    x = reader.inputs[0]
    bdq, xdq = getattr(bias, "producer", None), getattr(x, "producer", None)
    if bdq is None or xdq is None or bdq.op_type != "DequantizeLinear" or xdq.op_type != "DequantizeLinear" \
            or len(bias.uses()) != 1:
        return
    b_int, b_s, s_in = (bdq.inputs[0].const_value(), bdq.inputs[1].const_value(),
                        xdq.inputs[1].const_value() if len(xdq.inputs) > 1 else None)
    if b_int is None or b_s is None or s_in is None or np.asarray(b_int).dtype != np.int32 or np.size(s_in) != 1:
        return
    b = np.asarray(b_int, np.float64) * np.asarray(b_s, np.float64)
    scale = float(np.asarray(s_in).reshape(())) * np.asarray(enc.scale, np.float64).reshape(-1)
    if scale.size not in (1, b.size) or not np.all(scale > 0):
        return
    q = np.round(b / scale)
    if np.abs(q).max(initial=0) > 2 ** 31 - 1:
        return
    shape = () if scale.size == 1 else (scale.size,)
    name = bdq.inputs[0].name
    new = [g.add_constant(q.astype(np.int32).reshape(np.shape(b_int)), name),
           g.add_constant(scale.astype(np.asarray(b_s).dtype).reshape(shape), f"{name}_scale"),
           g.add_constant(np.zeros(shape, np.int32), f"{name}_zero_point")]
    old = list(bdq.inputs)
    for i, v in enumerate(new):
        g.set_input(bdq, i, v)
    if scale.size > 1:
        bdq.set_attr("axis", 0)
    g.drop_if_unused(old)
