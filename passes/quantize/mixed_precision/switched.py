"""The sensitivity table on one switchable model per candidate, instead of one model per layer and candidate.

The model with every searched layer at the candidate (the rest float) is lowered once; each of its
DequantizeLinears that belongs to a layer, and each weight stored on its grid, is a site of the switchable copy
(qcompiler/quant/runtime/switchable.py, the safety net's: one switch per layer instead of one per quantizer,
`Where(on[layer], quantized, float)`; an activation's float value is its Q's input, a weight's the calibrated
model's tensor). One onnxruntime session then measures each layer alone by switching only that layer on. A
layer's quantizers are its weights' and biases' DQs and the Q/DQ of the values its nodes write (or, for a value
written outside every layer, of the one layer reading it). float16 is not a DQ but Casts: float16_switch_proto
gates it on the same input.

NOTE: the numbers are those of each layer's quantizers in the context of its neighbours at the same candidate
(a Conv whose input is quantized runs as it will in the plan), not of a model built for that layer alone, so
they can differ slightly from the per-layer models; the table only ranks the layers, and every assignment the
search keeps is measured on its real QDQ model. With every switch off the model must give the float outputs
(else the round is measured the per-layer way)."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from qcompiler.onnx_io import model_to_proto
from qcompiler.quant.core.qdq import constant_dq_value
from qcompiler.ort_session import create_session
from qcompiler.quant.runtime.switchable import ON_INPUT, Site, add_switches

SWITCH = ON_INPUT   # the switch input of switchable.py's models; the float16 one uses it too


def layer_sites(m, base, layers) -> List[Site]:
    """The switch sites (switchable.py; switch i: layer i) of the lowered model `m` (IR, changed here): each of
    its DequantizeLinears that belongs to a layer, and each weight stored on its grid (a float kernel's,
    prefolded: the (node, slot) that reads it), with the float alternative (an activation DQ's: its Q's input; a
    weight's: the tensor the reader has in `base`, the calibrated float model). A constant weight DQ is folded to
    an initializer first (`_fold`): a weight stored on its grid."""
    node_layer = {n: i for i, layer in enumerate(layers) for n in layer.nodes}
    base_nodes = {n.name: n for n in base.graph.nodes}
    sites: List[Site] = []
    folds = []
    for dq in m.graph.nodes_by_op("DequantizeLinear"):
        x = dq.inputs[0] if dq.inputs else None
        if x is None or not dq.outputs or dq.outputs[0] is None:
            continue
        readers = [u for u in dq.outputs[0].uses() if not u.is_graph_output]
        if x.is_constant():             # a weight or bias: the float tensor the reader had before lowering
            owners = {node_layer.get(u.user.name) for u in readers}
            if len(owners) != 1 or None in owners:
                continue
            u = readers[0]
            b = base_nodes.get(u.user.name)
            v = b.inputs[u.index] if b is not None and u.index < len(b.inputs) else None
            arr = v.const_value() if v is not None else None
            if arr is None:
                continue
            scale = dq.inputs[1].const_value() if len(dq.inputs) > 1 and dq.inputs[1] is not None else None
            dtype = np.asarray(scale).dtype if scale is not None else np.float32
            site = Site(owners.pop(), dq.outputs[0].name, np.asarray(arr).astype(dtype))
            sites.append(site)
            folds.append((site, dq))
            continue
        q = x.producer
        if q is None or q.op_type != "QuantizeLinear" or not q.inputs or q.inputs[0] is None:
            continue
        src = q.inputs[0]
        i = node_layer.get(src.producer.name) if src.producer is not None else None
        if i is None:
            owners = {node_layer.get(u.user.name) for u in readers}
            i = owners.pop() if len(owners) == 1 else None
        if i is not None:
            sites.append(Site(i, dq.outputs[0].name, src.name))
    # weights stored float on their grid (a float kernel's, prefolded): no DQ to switch, the constant itself
    for node in m.graph.nodes:
        i = node_layer.get(node.name)
        b = base_nodes.get(node.name)
        if i is None or b is None:
            continue
        for slot, v in enumerate(node.inputs):
            w = b.inputs[slot] if slot < len(b.inputs) else None
            if v is None or w is None or v.name == w.name or v.tensor is None or w.tensor is None:
                continue
            arr = w.const_value()
            if arr is not None:
                sites.append(Site(i, v.name, np.asarray(arr).astype(v.const_value().dtype), reader=(node.name, slot)))
    for site, dq in folds:
        _fold(m.graph, site, dq)
    return sites


def _fold(g, site: Site, dq) -> None:
    """Replace the constant weight DQ `dq` by its output computed once (qdq.constant_dq_value) and point `site`
    at it; a blocked or unusual DQ (or one that is a graph output) stays."""
    out = dq.outputs[0]
    value = None if out.is_output_of_any_graph() else constant_dq_value(dq)
    if value is None:
        return
    folded = g.add_constant(value, f"{out.name}_folded")
    g.substitute(out, folded, remove=[dq])
    site.value = folded.name


def switchable_proto(m, base, layers) -> Tuple[onnx.ModelProto, List[int]]:
    """(`m` as a ModelProto switched per layer on SWITCH (`layer_sites`; `m` is changed), the indices of the
    layers that have a switch)."""
    sites = layer_sites(m, base, layers)
    mp = model_to_proto(m)
    add_switches(mp, sites, len(layers))
    return mp, sorted({s.index for s in sites})


def float16_switch_proto(base, layers):
    """The calibrated float model `base` (IR) as a ModelProto whose layers can each be switched to float16 as the
    float16 islands run them, emulated: the layer's float32 weights rounded to float16, and the float32
    activations it reads from outside it and writes out of it rounded through Cast(float16) -> Cast(float)."""
    node_layer = {n: i for i, layer in enumerate(layers) for n in layer.nodes}
    float32 = {v.name for n in base.graph.nodes for v in list(n.inputs) + list(n.outputs)
               if v is not None and v.dtype == TensorProto.FLOAT}
    mp = model_to_proto(base)
    g = mp.graph
    inits = {t.name: t for t in g.initializer}
    g.input.append(helper.make_tensor_value_info(SWITCH, TensorProto.BOOL, [len(layers)]))
    for i in sorted(set(node_layer.values())):
        g.initializer.append(numpy_helper.from_array(np.asarray(i, np.int64), f"{SWITCH}_i{i}"))
    producer = {o: n.name for n in g.node for o in n.output}
    readers: Dict[str, set] = {}
    for n in g.node:
        for x in n.input:
            readers.setdefault(x, set()).add(node_layer.get(n.name, -1))
    graph_outputs = {o.name for o in g.output}
    nodes = list(g.node)
    del g.node[:]
    count, done = [0], set()

    def gate(i, x, out_name, rounded=None) -> None:
        """Where(on[i], x rounded to float16, x) -> out_name (`rounded`: the rounded copy, else two Casts)."""
        p = f"{SWITCH}h{count[0]}"
        count[0] += 1
        g.node.append(helper.make_node("Gather", [SWITCH, f"{SWITCH}_i{i}"], [f"{p}_on"], name=f"{p}_g"))
        if rounded is None:
            g.node.append(helper.make_node("Cast", [x], [f"{p}_h"], to=TensorProto.FLOAT16, name=f"{p}_c1"))
            g.node.append(helper.make_node("Cast", [f"{p}_h"], [f"{p}_f"], to=TensorProto.FLOAT, name=f"{p}_c2"))
        else:
            g.initializer.append(numpy_helper.from_array(rounded, f"{p}_f"))
        g.node.append(helper.make_node("Where", [f"{p}_on", f"{p}_f", x], [out_name], name=f"{p}_where"))
    for n in nodes:
        i = node_layer.get(n.name)
        if i is None:
            g.node.append(n)
            continue
        for slot, x in enumerate(n.input):
            if not x or x not in float32 or (x not in inits and node_layer.get(producer.get(x, ""), -1) == i):
                continue
            gated = f"{x}_{SWITCH}{i}"
            if gated not in done:
                done.add(gated)
                t = inits.get(x)
                gate(i, x, gated, None if t is None else
                     numpy_helper.to_array(t).astype(np.float16).astype(np.float32))
            n.input[slot] = gated
        gated = [y for y in n.output if y and y in float32 and (not readers.get(y, set()) <= {i} or
                                                                 y in graph_outputs)]
        for j, y in enumerate(n.output):
            if y in gated:
                n.output[j] = f"{y}_{SWITCH}raw"
        g.node.append(n)    # NOTE: a copy: `n` is changed before it
        for y in gated:
            gate(i, f"{y}_{SWITCH}raw", y)
    del g.value_info[:]
    return mp


def batched_feeds(proto, feeds: List[dict]) -> Optional[dict]:
    """The feeds concatenated along axis 0 (one run instead of one per sample) when every graph input and output
    has a free first dimension and the samples agree on every other one; else None."""
    def free(vi):
        t = vi.type.tensor_type
        d = t.shape.dim[0] if t.HasField("shape") and len(t.shape.dim) > 0 else None
        return d is not None and (not d.HasField("dim_value") or d.dim_value <= 0)   # paddle2onnx writes -1
    names = [i.name for i in proto.graph.input if i.name != SWITCH and i.name in feeds[0]]
    if len(feeds) < 2 or not all(free(i) for i in proto.graph.input if i.name in names) or \
            not all(free(o) for o in proto.graph.output):
        return None
    out = {}
    for n in names:
        arrs = [np.asarray(f[n]) for f in feeds]
        if any(a.ndim == 0 or a.shape[1:] != arrs[0].shape[1:] or a.dtype != arrs[0].dtype for a in arrs):
            return None
        out[n] = np.concatenate(arrs, axis=0)
    return out


def run_settings(proto, feeds: List[dict], settings: List[np.ndarray], pool=None,
                 batch: bool = True) -> Optional[List[list]]:
    """Per setting of the switches, the outputs ({name: array}) on each feed: on `pool` (a SwitchPool) when
    given and able, else in this process, all feeds in one batched run where the model allows it (`batched_feeds`;
    the caller checks the all-off setting against the float outputs, so a model that mixes samples is caught)."""
    names = [o.name for o in proto.graph.output]
    joined = batched_feeds(proto, feeds) if batch else None
    # NOTE: one batched run per setting beats the pool's one run per sample on two workers (minilm_l6: 16
    # samples of 64 tokens), so the pool only takes what cannot be batched
    if pool is not None and joined is None:
        runs = pool.run(feeds, [{SWITCH: s} for s in settings])
        if runs is not None:
            return [[dict(zip(names, r)) for r in per] for per in runs]
    sess = create_session(proto.SerializeToString(), role="mixed-precision switchable model", threads=1)
    if joined is not None:
        sizes = [len(next(iter(f.values()))) for f in feeds]
        cuts = np.cumsum(sizes)[:-1]
        out = []
        for s in settings:
            r = sess.run(names, {**joined, SWITCH: s}, where="a switched sensitivity run")
            if any(len(a) != sum(sizes) for a in r):
                return run_settings(proto, feeds, settings, None, batch=False)
            parts = [np.split(a, cuts) for a in r]
            out.append([dict(zip(names, (p[k] for p in parts))) for k in range(len(feeds))])
        return out
    return [[dict(zip(names, r)) for r in sess.run_each(names, [{**f, SWITCH: s} for f in feeds],
                                                        where="a switched sensitivity run")]
            for s in settings]


__all__ = ["SWITCH", "layer_sites", "switchable_proto", "float16_switch_proto", "batched_feeds", "run_settings"]
