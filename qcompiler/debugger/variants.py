"""A copy of the QDQ model with some quantizers taken out: the measurement behind "that module alone" and the
fallback search (measured, never added up from per-quantizer numbers).

An activation pair taken out: its readers read the value the Q read (a graph output keeps its name through an
Identity). A weight taken out: its readers read the float model's weight; a weight with no float counterpart
(folded or rescaled on the way, so not the float model's) stays on its grid.
"""
from __future__ import annotations

from typing import Dict, Iterable, List

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qcompiler.debugger.quantizers import GraphIndex, Quantizer, body_at, wide_grid

MS_DOMAIN = "com.microsoft"   # its QuantizeLinear/DequantizeLinear take 16-bit grids at any opset


def _rename_inputs(graph, rename: Dict[str, str]) -> None:
    """Rename read values in `graph` and in every body below it (a body reads outer values by name)."""
    for n in graph.node:
        for s, x in enumerate(n.input):
            if x in rename:
                n.input[s] = rename[x]
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                _rename_inputs(a.g, rename)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for g in a.graphs:
                    _rename_inputs(g, rename)


def _float_op(z: Quantizer, weight: str, out: str):
    """The float operator a weight-only operator stands for, reading the float weight `weight`."""
    if z.op == "MatMulNBits":
        return helper.make_node("MatMul", [z.extra["reads"], weight], [out], name=f"{out}_float_op")
    return helper.make_node("Gather", [weight, z.extra["reads"]], [out], name=f"{out}_float_op",
                            axis=z.extra.get("gather_axis", 0))


def _rebuild(g, drop=(), replace=None, after=None, first=()) -> None:
    """`g`'s node list with the nodes at the indices `drop` left out, `replace[i]` instead of node i and
    `after[i]` after it, `first` at the start."""
    replace, after = replace or {}, after or {}
    nodes = list(g.node)
    del g.node[:]
    g.node.extend(first)
    for i, n in enumerate(nodes):
        if i in replace:
            g.node.append(replace[i])
        elif i not in drop:
            g.node.append(n)
        g.node.extend(after.get(i, ()))


def _body_off(g, zs: List[Quantizer], float_weights: Dict[str, np.ndarray]) -> None:
    """Take the quantizers `zs` (all in the body at one path) out of their body `g`: a weight's DQ becomes its
    float weight (a body initializer)."""
    drop, replace, rename = set(), {}, {}
    for z in zs:
        if z.kind == "weight":
            w = float_weights.get(z.name) if z.matched else None
            if w is not None:
                g.initializer.append(numpy_helper.from_array(np.asarray(w), f"{z.out}_float_weight"))
                replace[z.dq_index] = helper.make_node("Identity", [f"{z.out}_float_weight"], [z.out],
                                                       name=f"{z.out}_float")
            continue
        drop.update(i for i in (z.q_index, z.dq_index) if i is not None)
        if z.out in z.extra.get("body_outputs", ()):
            replace[z.dq_index] = helper.make_node("Identity", [z.x], [z.out], name=f"{z.out}_float")
        else:
            rename[z.out] = z.x
    _rebuild(g, drop, replace)
    _rename_inputs(g, rename)


def _by_path(zs) -> Dict[tuple, list]:
    out: Dict[tuple, list] = {}
    for z in zs:
        out.setdefault(z.path, []).append(z)
    return out


def _ms_opset(m) -> None:
    if not any(o.domain == MS_DOMAIN for o in m.opset_import):
        m.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))


def _wide_pair(g, z: Quantizer, src: str, out: str, tag: str) -> list:
    """A 16-bit Q->DQ of `src` into `out` over z's range (quantizers.wide_grid); adds its grid to `g`."""
    scale, zp = wide_grid(z)
    g.initializer.extend([numpy_helper.from_array(scale, f"{tag}_s16"), numpy_helper.from_array(zp, f"{tag}_z16")])
    kw = {"axis": z.axis} if np.size(scale) > 1 else {}
    return [helper.make_node("QuantizeLinear", [src, f"{tag}_s16", f"{tag}_z16"], [f"{tag}_q16"], name=f"{tag}_q16",
                             domain=MS_DOMAIN, **kw),
            helper.make_node("DequantizeLinear", [f"{tag}_q16", f"{tag}_s16", f"{tag}_z16"], [out],
                             name=f"{tag}_dq16", domain=MS_DOMAIN, **kw)]


def without(qproto, idx: GraphIndex, off: Iterable[Quantizer], float_weights: Dict[str, np.ndarray],
            wide: Iterable[Quantizer] = ()):
    """A ModelProto: `qproto` with the quantizers `off` taken out (module docstring) and the activation pairs
    `wide` on 16-bit grids over the same ranges. `float_weights`: the float model's weights by name (only those of
    weight quantizers are read)."""
    m = onnx.ModelProto()
    m.CopyFrom(qproto)
    g = m.graph
    wide = [z for z in wide if z.kind == "activation" and not z.path]
    if wide:
        _ms_opset(m)
    off = list(off)
    # NOTE: bodies first: their GraphProtos are reached through the main graph's nodes by index, before the main
    # node list is rebuilt; the deepest first, so a path never crosses an edited list
    sites: Dict[tuple, list] = {}
    for z in off:
        for path, i, out in z.extra.get("sites", ()):
            sites.setdefault(path, []).append(Quantizer("activation", z.name, False, "", "", 0, z.x, out,
                                                        dq_index=i, path=path))
    for path, zs in sorted(_by_path([z for z in off if z.path] + [s for v in sites.values() for s in v]).items(),
                           key=lambda t: -len(t[0])):
        _body_off(body_at(g, path), zs, float_weights)
    off = [z for z in off if not z.path]
    drop, replace, rename = set(), {}, {}
    new_inits = []
    refill = {}
    for z in off:
        if z.kind == "activation" and "sites" in z.extra:
            drop.add(z.q_index)
            continue
        if z.kind == "activation":
            drop.update((z.q_index, z.dq_index))
            if z.out in idx.outputs:
                replace[z.dq_index] = helper.make_node("Identity", [z.x], [z.out], name=f"{z.out}_float")
            else:
                rename[z.out] = z.x
            continue
        w = float_weights.get(z.name) if z.matched else None
        if w is None:
            continue
        if z.prefolded:
            refill[z.x] = w
            continue
        fname = f"{z.out}_float_weight"
        new_inits.append(numpy_helper.from_array(np.asarray(w), fname))
        drop.add(z.dq_index)
        replace[z.dq_index] = _float_op(z, fname, z.out) if z.op else \
            helper.make_node("Identity", [fname], [z.out], name=f"{z.out}_float")
    wide_at = {}
    for z in wide:
        drop.update((z.q_index, z.dq_index))
        wide_at[z.dq_index] = _wide_pair(g, z, z.x, z.out, f"{z.out}_wide")
    for i, pair in wide_at.items():
        replace[i] = pair[0]
    _rebuild(g, drop - set(replace), replace, {i: pair[1:] for i, pair in wide_at.items()})
    _rename_inputs(g, rename)
    if refill:
        for t in g.initializer:
            if t.name in refill:
                arr = np.asarray(refill[t.name]).astype(numpy_helper.to_array(t).dtype)
                t.CopyFrom(numpy_helper.from_array(arr, t.name))
    g.initializer.extend(new_inits)
    del g.value_info[:]     # renamed values: onnxruntime infers the rest
    return m


SWITCH_INPUT = "qcompiler_debug_on"
WIDE_INPUT = "qcompiler_debug_wide"


def switchable(qproto, idx: GraphIndex, quants: List[Quantizer], float_weights: Dict[str, np.ndarray],
               widen: bool = False):
    """`qproto` with a switch on each quantizer: `Where(on[i], quantized, float)` where its readers read, `on` a
    bool graph input of len(quants) (SWITCH_INPUT). One session then measures any set of quantizers turned on
    (the safety net's construction). A weight with no float counterpart stays quantized either way. `widen`: a
    second switch `wide[i]` (WIDE_INPUT) puts an activation on its 16-bit grid instead."""
    m = onnx.ModelProto()
    m.CopyFrom(qproto)
    g = m.graph
    k = len(quants)
    g.input.append(helper.make_tensor_value_info(SWITCH_INPUT, onnx.TensorProto.BOOL, [k]))
    if widen:
        g.input.append(helper.make_tensor_value_info(WIDE_INPUT, onnx.TensorProto.BOOL, [k]))
        _ms_opset(m)
    after: Dict[int, list] = {}
    first: list = []
    rename: Dict[str, str] = {}
    inits = []
    p = "qcompiler_dbg"
    nodes = list(g.node)
    body_after: Dict[tuple, Dict[int, list]] = {}
    for i, z in enumerate(quants):
        inits.append(numpy_helper.from_array(np.asarray(i, np.int64), f"{p}{i}_idx"))
        gather = helper.make_node("Gather", [SWITCH_INPUT, f"{p}{i}_idx"], [f"{p}{i}_on"], name=f"{p}{i}_g")
        if "sites" in z.extra:
            first.append(gather)
            for path, di, out in z.extra["sites"]:
                body = body_at(g, path)
                body.node[di].output[0] = f"{p}{i}_{di}_dq"
                body_after.setdefault(path, {})[di] = [helper.make_node(
                    "Where", [f"{p}{i}_on", f"{p}{i}_{di}_dq", z.x], [out], name=f"{p}{i}_{di}_where")]
            continue
        if z.path:
            # the switch is computed in the main graph and read inside the body by name
            fl = z.x
            if z.kind == "weight":
                w = float_weights.get(z.name) if z.matched else None
                if w is None:
                    continue
                fl = f"{p}{i}_f"
                inits.append(numpy_helper.from_array(np.asarray(w, np.float32), fl))
            first.append(gather)
            body = body_at(g, z.path)
            body.node[z.dq_index].output[0] = f"{p}{i}_dq"
            body_after.setdefault(z.path, {})[z.dq_index] = [helper.make_node(
                "Where", [f"{p}{i}_on", f"{p}{i}_dq", fl], [z.out], name=f"{p}{i}_where")]
            continue
        if z.kind == "activation":
            dq = nodes[z.dq_index]
            dq.output[0] = f"{p}{i}_dq"
            tail = [gather, helper.make_node("Where", [f"{p}{i}_on", f"{p}{i}_dq", z.x],
                                             [f"{p}{i}_sel" if widen else z.out], name=f"{p}{i}_where")]
            if widen:
                tail += _wide_pair(g, z, z.x, f"{p}{i}_dq16", f"{p}{i}") + [
                    helper.make_node("Gather", [WIDE_INPUT, f"{p}{i}_idx"], [f"{p}{i}_w"], name=f"{p}{i}_gw"),
                    helper.make_node("Where", [f"{p}{i}_w", f"{p}{i}_dq16", f"{p}{i}_sel"], [z.out],
                                     name=f"{p}{i}_wwhere")]
            after[z.dq_index] = tail
            continue
        w = float_weights.get(z.name) if z.matched else None
        if w is None:
            continue
        inits.append(numpy_helper.from_array(np.asarray(w, np.float32).astype(
            numpy_helper.to_array(idx.inits[z.x]).dtype if z.prefolded else np.float32), f"{p}{i}_f"))
        if z.prefolded:
            rename[z.x] = f"{p}{i}_w"
            first += [gather, helper.make_node("Where", [f"{p}{i}_on", z.x, f"{p}{i}_f"], [f"{p}{i}_w"],
                                               name=f"{p}{i}_where")]
        else:
            dq = nodes[z.dq_index]
            dq.output[0] = f"{p}{i}_dq"
            fl = f"{p}{i}_f"
            extra = []
            if z.op:
                extra, fl = [_float_op(z, fl, f"{p}{i}_fo")], f"{p}{i}_fo"
            after[z.dq_index] = extra + [gather, helper.make_node("Where", [f"{p}{i}_on", f"{p}{i}_dq", fl],
                                                                  [z.out], name=f"{p}{i}_where")]
    for path, at in sorted(body_after.items(), key=lambda t: -len(t[0])):
        _rebuild(body_at(g, path), after=at)
    _rename_inputs(g, rename)
    nodes = list(g.node)
    del g.node[:]
    g.node.extend(first)
    for i, n in enumerate(nodes):
        g.node.append(n)
        g.node.extend(after.get(i, ()))
    g.initializer.extend(inits)
    del g.value_info[:]
    return m
