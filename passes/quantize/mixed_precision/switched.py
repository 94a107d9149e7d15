"""The sensitivity table on one switchable model per candidate, instead of one model per layer and candidate.

The model with every searched layer at the candidate (the rest float) is lowered once; after each of its
DequantizeLinears that belongs to a layer a `Where(on[layer], DQ, float)` picks the quantized or the float value
(an activation's float value is its Q's input; a weight's is the calibrated model's tensor). One onnxruntime
session then measures each layer alone by switching only that layer on (the safety net's switchable copy, one
switch per layer instead of one per quantizer). A layer's quantizers are its weights' and biases' DQs and the
Q/DQ of the values its nodes write (or, for a value written outside every layer, of the one layer reading it).

NOTE: the numbers are those of each layer's quantizers in the context of its neighbours at the same candidate
(a Conv whose input is quantized runs as it will in the plan), not of a model built for that layer alone, so
they can differ slightly from the per-layer models; the table only ranks the layers, and every assignment the
search keeps is measured on its real QDQ model. With every switch off the model must give the float outputs
(`off_ok`); a candidate that has no switch (float16 islands are Casts, not DQs) is measured the per-layer way.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from qcompiler.onnx_io import model_to_proto
from qcompiler.ort_session import create_session

SWITCH = "qcompiler_mp_on"


def layer_switches(m, base, layers) -> Dict[str, Tuple[int, object]]:
    """{DequantizeLinear name: (layer index, float alternative: a value name or an array)} in the lowered model
    `m` (IR); `base` is the calibrated float model the weights are read from."""
    node_layer = {n: i for i, layer in enumerate(layers) for n in layer.nodes}
    base_nodes = {n.name: n for n in base.graph.nodes}
    out: Dict[str, Tuple[int, object]] = {}
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
            out[dq.name] = (owners.pop(), np.asarray(arr).astype(dtype))
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
            out[dq.name] = (i, src.name)
    return out


def switch_proto(m, switches: Dict[str, Tuple[int, object]], n: int):
    """`m` as a ModelProto with a bool graph input SWITCH of `n` entries and `Where(on[i], DQ, alternative)`
    after each DequantizeLinear of `switches`."""
    mp = model_to_proto(m)
    g = mp.graph
    g.input.append(helper.make_tensor_value_info(SWITCH, TensorProto.BOOL, [n]))
    for i in range(n):
        g.initializer.append(numpy_helper.from_array(np.asarray(i, np.int64), f"{SWITCH}_i{i}"))
    nodes = list(g.node)
    del g.node[:]
    for j, node in enumerate(nodes):
        hit = switches.get(node.name) if node.op_type == "DequantizeLinear" else None
        if hit is None:
            g.node.append(node)
            continue
        i, alt = hit
        out, p = node.output[0], f"{SWITCH}{j}"
        node.output[0] = f"{p}_dq"
        g.node.append(node)
        if not isinstance(alt, str):
            g.initializer.append(numpy_helper.from_array(alt, f"{p}_float"))
            alt = f"{p}_float"
        g.node.append(helper.make_node("Gather", [SWITCH, f"{SWITCH}_i{i}"], [f"{p}_on"], name=f"{p}_g"))
        g.node.append(helper.make_node("Where", [f"{p}_on", f"{p}_dq", alt], [out], name=f"{p}_where"))
    del g.value_info[:]     # the DQ outputs were renamed; onnxruntime infers the rest
    return mp


def run_settings(proto, feeds: List[dict], settings: List[np.ndarray], pool=None) -> Optional[List[list]]:
    """Per setting of the switches, the outputs ({name: array}) on each feed: on `pool` (a SwitchPool) when
    given and able, else in this process."""
    names = [o.name for o in proto.graph.output]
    if pool is not None:
        runs = pool.run(feeds, [{SWITCH: s} for s in settings])
        if runs is not None:
            return [[dict(zip(names, r)) for r in per] for per in runs]
    sess = create_session(proto.SerializeToString(), role="mixed-precision switchable model", threads=1)
    return [[dict(zip(names, r)) for r in sess.run_each(names, [{**f, SWITCH: s} for f in feeds],
                                                        where="a switched sensitivity run")]
            for s in settings]


__all__ = ["SWITCH", "layer_switches", "switch_proto", "run_settings"]
