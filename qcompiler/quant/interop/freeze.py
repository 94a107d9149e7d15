"""Freeze encodings read from an AIMET encodings file onto a plan (`quantize(load_encodings=...)`).

Frozen values keep the file's encodings; everything else is calibrated as usual. Every entry of the file ends in
exactly one place, and the report says where:
- applied: an activation the plan quantizes, or a weight at a weight input (axis and layout from its op:
  encodings_io.aimet_axes / fit_param_encoding);
- bias: a bias input of a quantized op; qcompiler re-derives int32 biases as s_in * s_w from the frozen input
  and weight scales (what onnxruntime's QDQ Conv/Gemm fusions expect), so the entry is only noted;
- not applied, one warning per kind with the count and a few names: a name no value of the model has; an
  activation qcompiler does not quantize (data-movement outputs, values kept float); a constant that is no
  quantized weight (LayerNorm scale/bias, Gather tables, Add biases kept float, other constants).
A created bias is named `<node>.bias` by AIMET and `<node>_bias` by qcompiler before either name
matches the other (item 4).

A frozen weight encoding must cover the weights it is applied to (item 3): values beyond its grid by more than
WARN_BEYOND of the grid's span are a warning, by more than REFUSE_BEYOND a ConfigError (no clipping scheme clips
that much; the encoding was computed on other weights). Per-output-channel factors between the weights and the
grid are what a BatchNorm fold gives: the message then says that AIMET's model was not BN-folded (qcompiler folds
BatchNorm into Conv/Gemm before quantizing).
"""
from __future__ import annotations

import os
from typing import Optional

import numpy as np

from qcompiler.errors import ConfigError
from qcompiler.quant.core.encoding import broadcast_qparams
from qcompiler.quant.interop.encodings_io import (
    aimet_axes,
    check_activation_encoding,
    fit_param_encoding,
    grid_limits,
    read_encodings,
)
from qcompiler.quant.runtime.memory import drop_cached
from qcompiler.quant.settings.selection import warning
from qcompiler.quant.targets.profiles import weight_axis

WARN_BEYOND = 0.05      # weights beyond the frozen grid by 5 % of its span: warning
REFUSE_BEYOND = 0.5     # ... by half its span: refused
SHOW_NAMES = 3          # names shown per warning
_BIAS_SUFFIXES = (".bias", "_bias")
_BN_CAUSE = ("the weights differ from those the encodings were computed on by a factor per output channel, as "
             "folding a BatchNorm gives: qcompiler folds BatchNorm into the Conv/Gemm before quantizing, so export "
             "AIMET's encodings from a BN-folded model (aimet_onnx.batch_norm_fold.fold_all_batch_norms_to_weight)")
_OTHER_CAUSE = ("the encodings were computed on other weights (a BatchNorm folded into them, or another "
                "checkpoint)")


def _bias_alias(name: str, names) -> Optional[str]:
    """The model's name for a created bias the file names in the other convention (`.bias` <-> `_bias`)."""
    for a, b in (_BIAS_SUFFIXES, _BIAS_SUFFIXES[::-1]):
        if name.endswith(a):
            alt = name[: -len(a)] + b
            if alt in names:
                return alt
    return None


def _coverage(w: np.ndarray, enc, out_axis: Optional[int]):
    """(how far the weights reach beyond `enc`'s grid as a fraction of its span, values outside, BN-like).

    BN-like: the per-output-channel ratio of the weights' reach to the grid's reach varies by more than 1.5x
    (a per-channel factor, as folding a BatchNorm applies)."""
    w = np.asarray(w, np.float32)
    scale, zp = broadcast_qparams(enc, w.shape, np.float32)
    q = w / scale
    q += zp
    lo, hi = grid_limits(enc)
    span = float(hi - lo)
    beyond = max(float(q.max(initial=lo)) - hi, lo - float(q.min(initial=hi)), 0.0) / span
    outside = int(np.count_nonzero((q > hi + 0.5) | (q < lo - 0.5)))
    bn_like = False
    if out_axis is not None and w.ndim >= 2 and w.shape[out_axis] > 1:
        # reach of each output channel relative to its grid's reach on the same side of zero
        zpf = np.broadcast_to(zp, q.shape)
        d = np.moveaxis(q - zpf, out_axis, 0).reshape(w.shape[out_axis], -1)
        reach = np.abs(d).max(axis=1)
        grid = max(hi - float(np.max(zpf)), float(np.min(zpf)) - lo, 1.0)
        r = reach[reach > 0] / grid
        bn_like = r.size > 1 and float(r.max()) > 1.05 and float(r.max() / r.min()) > 1.5
    return beyond, outside, bn_like


def _names(names: list, limit: int = 80) -> str:
    """Up to SHOW_NAMES names, joined, at most `limit` characters (a warning's value is shown whole up to 80)."""
    out = ""
    for n in names[:SHOW_NAMES]:
        part = (", " if out else "") + n
        if len(out) + len(part) > limit - 5:
            part = part[: max(0, limit - 5 - len(out))]
            return out + part + ", ..."
        out += part
    return out + (", ..." if len(names) > SHOW_NAMES and len(out) <= limit - 5 else "")


def freeze_encodings(plan, model, path, notes: list, warnings: Optional[list] = None) -> dict:
    """Freeze encodings from an AIMET file: those values keep them; everything else is calibrated.

    Each entry used is first checked against the model (encodings_io.fit_param_encoding /
    check_activation_encoding: axis, channel and block counts against the weight's shape; activations per
    tensor; only float tensors); a bad entry is one ConfigError line naming the file and the entry. FLOAT
    entries (float16/float32) leave their tensor unquantized. Entries that are not applied are listed in
    `notes` and, one per kind, in `warnings` (see the module docstring); a weight encoding that does not cover
    its weights is a warning or a ConfigError.

    Returns the FLOAT entries applied, `{"activations": {name: Encoding}, "params": {...}}`: they have no
    quantizer, so the QDQ model does not hold them; the result's encodings (and a file written from them) do,
    so a second round trip keeps them.
    """
    path = os.fspath(path)
    g = model.graph
    graphs = g.all_graphs()
    param_names = [v.name for sg in graphs for v in sg.initializers.values()] + \
        [n.outputs[0].name for sg in graphs for n in sg.nodes_by_op("Constant")]
    acts, params = read_encodings(path, param_names=param_names)
    names = {v.name for sg in graphs for v in sg.local_values()}
    by_name = plan.nodes
    weight_uses, bias_uses = {}, set()
    for (node_name, slot), spec in plan.uses.items():
        v = by_name[node_name].inputs[slot] if slot < len(by_name[node_name].inputs) else None
        if v is None:
            continue
        if spec.kind == "weight":
            weight_uses.setdefault(v.name, []).append((by_name[node_name], slot, spec))
        elif spec.kind == "bias":
            bias_uses.add(v.name)
    kinds = {"missing": [], "activation": [], "param": [], "bias": []}
    aliased = []
    floats = {"activations": {}, "params": {}}

    def resolve(name):
        if name in names:
            return name
        alt = _bias_alias(name, names)
        if alt is not None:
            aliased.append(name)
        return alt

    def freeze_activation(name, enc):
        spec = plan.values.get(name)
        check_activation_encoding(path, name, enc)
        dt = plan.dtypes.get(name)
        if dt is not None and getattr(dt, "kind", "f") != "f":
            raise ConfigError(f"{path}: encoding '{name[:60]}': the model's tensor holds {dt}, not floats; "
                              f"only float tensors are quantized")
        enc.frozen = True
        if enc.dtype == "float":
            spec.encoding, spec.frozen = None, True
            spec.float_(f"float{enc.bits} in the encodings file")
            floats["activations"][name] = enc
            return
        spec.encoding, spec.frozen, spec.keep_float, spec.reason = enc, True, False, ""
        spec.bits, spec.symmetric = enc.bits, enc.symmetric

    weights = {}
    for section, entries in (("activation", acts), ("param", params)):
        for fname, enc in entries.items():
            name = resolve(fname)
            if name is None:
                kinds["missing"].append(fname)
            elif name in weight_uses:       # by name: 2.0.0's split used the file's name, not its alias
                weights[name] = (fname, enc)
            elif name in bias_uses:
                kinds["bias"].append(fname)
            elif name in plan.values:
                freeze_activation(name, enc)
            else:
                kinds[section].append(fname)

    covered = {"warn": [], "bn": False, "worst": 0.0, "outside": 0}
    for name, (fname, enc) in weights.items():
        node, slot, spec = weight_uses[name][0]
        v = node.inputs[slot]
        shape = v.shape
        rank = len(shape) if shape is not None else 0
        hint = spec.axis
        if hint is None and shape is not None:
            hint = weight_axis(plan.profile, node, slot, rank)
        channel, block = aimet_axes(node, slot, rank) if shape is not None else (None, None)
        enc = fit_param_encoding(path, fname, enc, shape, hint, channel_axis=channel, block_axis=block)
        enc.frozen = True
        if enc.dtype == "float":
            floats["params"][name] = enc
        else:
            _check_coverage(path, fname, node, v, enc, channel, covered)
        for _, _, s in weight_uses[name]:
            if enc.dtype == "float":
                s.encoding, s.frozen = None, True
                s.float_(f"float{enc.bits} in the encodings file")
                continue
            s.encoding, s.frozen, s.keep_float = enc, True, False
            s.axis, s.bits, s.block_size = enc.axis, enc.bits, enc.block_size
            s.range_bits = enc.meta.get("range_bits")
    if plan.needs_opset() > model.opset:
        # NOTE: the opset was chosen from this file too (opset.required_opset); this catches a file changed
        # since, or a grid that became wide here: refusing beats exporting Q/DQ types the opset does not have
        raise ConfigError(f"{path}: int4/int16 or per-block encodings need opset {plan.needs_opset()}, but the "
                          f"model is at opset {model.opset} for this target and these settings")
    _report(kinds, aliased, covered, notes, warnings, warning)
    return floats


def _check_coverage(path, fname, node, v, enc, out_axis, covered) -> None:
    """Refuse (ConfigError) or record a frozen weight encoding whose grid does not cover the weights."""
    w = v.const_value()
    if w is None or not np.issubdtype(np.asarray(w).dtype, np.floating) or np.size(w) == 0:
        return
    beyond, outside, bn_like = _coverage(w, enc, out_axis)
    drop_cached(v)
    if beyond <= WARN_BEYOND:
        return
    cause = _BN_CAUSE if bn_like else _OTHER_CAUSE
    if beyond > REFUSE_BEYOND:
        raise ConfigError(f"{path}: encoding '{fname[:60]}' does not cover the weights of {node.op_type} "
                          f"'{node.name[:60]}': {outside} of {np.size(w)} values lie outside its grid, up to "
                          f"{beyond:.0%} of its span beyond it; {cause}")
    covered["warn"].append(fname)
    covered["bn"] = covered["bn"] or bn_like
    covered["worst"] = max(covered["worst"], beyond)
    covered["outside"] += outside


def _report(kinds, aliased, covered, notes, warnings, warning) -> None:
    what = {
        "missing": ("names no quantizable value", "name no value of the model"),
        "activation": ("names a value qcompiler does not quantize (a data-movement output or a value kept float); "
                       "not applied", "activation entries name values qcompiler does not quantize"),
        "param": ("names a constant that is no quantized weight (LayerNorm scale/bias, a Gather table, an Add "
                  "bias kept float, ...); not applied", "param entries name constants that are no quantized weight"),
    }
    out = []
    for kind, (one, many) in what.items():
        lst = kinds[kind]
        if not lst:
            continue
        notes.append(f"--load-encodings: {len(lst)} {many if len(lst) > 1 else 'entry ' + one}: "
                     f"{_names(lst, 200)}")
        out.append(("frozen encoding", _names(lst), one if len(lst) == 1 else
                    f"{one.split(';')[0].replace('names', 'name')} ({len(lst)} entries of this kind, "
                    f"{SHOW_NAMES if len(lst) > SHOW_NAMES else len(lst)} shown); not applied"))
    if kinds["bias"]:
        notes.append(f"--load-encodings: {len(kinds['bias'])} bias entries not applied: biases are re-derived as "
                     f"int32 with scale s_in * s_w from the frozen input and weight scales ({_names(kinds['bias'], 200)})")
    if aliased:
        notes.append(f"--load-encodings: {len(aliased)} created-bias names matched in the other convention "
                     f"(<node>.bias / <node>_bias): {_names(aliased)}")
    if covered["warn"]:
        lst = covered["warn"]
        cause = _BN_CAUSE if covered["bn"] else _OTHER_CAUSE
        text = (f"does not cover its weights ({len(lst)} weight encodings, {covered['outside']} values outside "
                f"their grids, up to {covered['worst']:.0%} of a grid's span beyond it); {cause}")
        notes.append(f"--load-encodings: {_names(lst)} {text}")
        out.append(("frozen encoding", _names(lst), text))
    if warnings is not None:
        warnings.extend(warning(k, v, p) for k, v, p in out)
