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
from qcompiler.quant.runtime.switchable import Site, Wide, add_switches, rename_reads

MS_DOMAIN = "com.microsoft"   # its QuantizeLinear/DequantizeLinear take 16-bit grids at any opset


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
    rename_reads(g, rename)


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
    rename_reads(g, rename)
    if refill:
        for t in g.initializer:
            if t.name in refill:
                arr = np.asarray(refill[t.name]).astype(numpy_helper.to_array(t).dtype)
                t.CopyFrom(numpy_helper.from_array(arr, t.name))
    g.initializer.extend(new_inits)
    del g.value_info[:]     # renamed values: onnxruntime infers the rest
    return m


def switchable(qproto, idx: GraphIndex, quants: List[Quantizer], float_weights: Dict[str, np.ndarray],
               widen: bool = False):
    """(ModelProto, Switches): `qproto` with a switch on each quantizer (qcompiler/quant/runtime/switchable.py):
    `Where(on[i], quantized, float)` where its readers read, `on` a bool graph input of len(quants). One session
    then measures any set of quantizers turned on (the safety net's construction). A weight with no float
    counterpart stays quantized either way. `widen`: a second switch `wide[i]` puts an activation on its 16-bit
    grid instead, whether or not on[i] is set (the fallback widens quantizers it took out)."""
    m = onnx.ModelProto()
    m.CopyFrom(qproto)
    if widen:
        _ms_opset(m)
    sites: List[Site] = []
    for i, z in enumerate(quants):
        if "sites" in z.extra:      # an activation Q in the main graph, its DQs inside bodies
            sites += [Site(i, out, z.x, path=path) for path, _, out in z.extra["sites"]]
            continue
        if z.kind == "activation":
            wide = None
            if widen and not z.path:
                scale, zp = wide_grid(z)
                wide = Wide(z.x, scale, zp, axis=z.axis if np.size(scale) > 1 else None, domain=MS_DOMAIN)
            sites.append(Site(i, z.out, z.x, wide=wide, path=z.path))
            continue
        w = float_weights.get(z.name) if z.matched else None
        if w is None:
            continue
        if z.path:
            sites.append(Site(i, z.out, np.asarray(w, np.float32), path=z.path))
        elif z.prefolded:           # the weight stored on its grid in float: its readers read the switch
            dtype = helper.tensor_dtype_to_np_dtype(idx.inits[z.x].data_type)
            sites.append(Site(i, z.x, np.asarray(w, np.float32).astype(dtype)))
        else:
            op = (lambda f, out, z=z: _float_op(z, f, out)) if z.op else None
            sites.append(Site(i, z.out, np.asarray(w, np.float32), off_op=op))
    switches = add_switches(m, sites, len(quants), wide=widen, wide_over_off=True, body_at=body_at,
                            prefix="qcompiler_dbg")
    return m, switches
