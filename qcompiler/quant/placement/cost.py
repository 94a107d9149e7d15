"""The size rule (`--optimize latency`, and `balanced` at float-Conv borders only): an integer region too small to
pay for its border stays float.

On onnxruntime's CPU EP a QLinearConv runs in NHWC (Transposes around it) and needs a QuantizeLinear before it
and a DequantizeLinear after it, while the float Conv next to it runs in NCHWc and fuses its activation. A
region of integer kernels joined by quantized values pays these only at its border, so the rule is per region:
its multiply-accumulates per call must reach the fusion table's `min_macs` (ort_cpu only) for each Q or DQ at
its border, plus `macs_per_border_element` for each element of the values those convert: a Q, a reorder and a
Transpose each touch every element, so a 1x1 Conv on a wide tensor (MobileNet's projections) does not pay
where a 3x3 Conv of the same borders does (`small_regions`). The nodes of a region below it are judged "float kernel" by placement
(float_regions._Kernels.size_rule), so their Q/DQ pairs go with the rest of the float region's. digits_cnn (one
region, 2.3 M MACs, 2 borders) stays integer; ppocr_cls's islands between float HardSwish Convs go float.
Under `balanced` (`layout_only`) a border counts only with a float Conv across it (through its elementwise
activation), never a graph input or output: tiny models keep their one integer region, islands still go.

Multiply-accumulates per call = output elements per call (calibration's observer count over the number of
calibration runs, `calls` in the stats) x the reduction length read from the weight's dims (never its values):
Conv: Cin/group x kh x kw; MatMul: the weight's rows; Gemm: its rows or, with transB, its columns; LSTM/GRU/RNN:
gates x (input + hidden) per element of Y. A node
without a constant weight (an activation x activation MatMul) or without observed output has no size here
and is never judged small.
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np


def _dims(v) -> Optional[tuple]:
    """The dims of a constant weight (initializer or Constant node) without decoding its values."""
    if v is None:
        return None
    if v.tensor is not None:
        return None if v.is_input else tuple(v.tensor.dims)
    p = v.producer
    if p is not None and p.op_type == "Constant" and p.domain in ("", "ai.onnx"):
        a = p.attrs.get("value")
        dims = getattr(getattr(a, "value", None), "dims", None)
        return tuple(dims) if dims is not None else None
    return None


# the ops whose size reduction_length reads from their weights' dims (the summary's integer-kernel share)
RECURRENT = ("LSTM", "GRU", "RNN")
SIZED_OPS = ("Conv", "MatMul", "Gemm") + RECURRENT


def reduction_length(node) -> Optional[int]:
    """How many products sum into one output element of `node` (None: no constant weight to read it from)."""
    if len(node.inputs) < 2:
        return None
    if node.op_type in RECURRENT:   # per element of Y [seq, dirs, batch, H]: gates x (input + hidden) products
        w, r = _dims(node.inputs[1]), _dims(node.inputs[2]) if len(node.inputs) > 2 else None
        if not w or not r or len(w) != 3 or len(r) != 3 or not r[2] or w[1] % r[2]:
            return None
        return int(w[1] // r[2] * (w[2] + r[2]))
    dims = _dims(node.inputs[1])
    if not dims or not all(isinstance(d, int) and d > 0 for d in dims):
        return None
    if node.op_type == "Conv" and len(dims) >= 3:
        return int(np.prod(dims[1:]))
    if node.op_type == "MatMul" and len(dims) >= 2:
        return int(dims[-2])
    if node.op_type == "Gemm" and len(dims) == 2:
        return int(dims[1] if node.attr("transB", 0) else dims[0])
    return None


# ops whose output has as many elements as their input 0: an unobserved output (a supergroup's interior, such as
# Conv -> Relu) is sized by the first observed value behind a chain of them
SAME_SIZE = {"Relu", "Clip", "HardSwish", "HardSigmoid", "Sigmoid", "LeakyRelu", "Tanh", "Elu", "Selu", "PRelu",
             "BatchNormalization", "Identity", "Add", "Sub", "Mul", "Div", "Erf", "Softplus", "Gelu", "Swish"}


def _observed_size(v, stats: Dict[str, dict]) -> Optional[dict]:
    for _ in range(8):
        if v is None:
            return None
        st = stats.get(v.name)
        if st:
            return st
        readers = v.consumers()
        if len(readers) != 1 or readers[0].op_type not in SAME_SIZE or not readers[0].outputs:
            return None
        others = [x for x in readers[0].inputs if x is not None and x is not v]
        if readers[0].inputs[0] is not v and not all(x.is_constant() for x in others):
            return None             # a bias Add(b, v) is v's size; Add(a, v) of two activations may broadcast
        v = readers[0].outputs[0]
    return None


def observed_sizes(stats: Dict[str, dict]) -> Dict[str, dict]:
    """value name -> {"count", "calls"}: what the size rule reads of the calibration statistics (plan.sizes)."""
    return {k: {"count": s["count"], "calls": s["calls"]} for k, s in stats.items()
            if isinstance(s, dict) and s.get("count") and s.get("calls")}


def elements_per_call(v, sizes: Dict[str, dict]) -> float:
    """Elements of `v` per call (0 when calibration did not see it or anything of its size behind it)."""
    st = _observed_size(v, sizes)
    return st["count"] / st["calls"] if st else 0.0


def macs_per_call(node, stats: Dict[str, dict]) -> Optional[float]:
    """Multiply-accumulates of one call of `node` from the calibration statistics, or None when unknown."""
    out = node.outputs[0] if node.outputs else None
    st = _observed_size(out, stats)
    k = reduction_length(node)
    if not st or k is None or not st.get("calls") or not st.get("count"):
        return None
    return st["count"] / st["calls"] * k


def node_macs(g, stats: Dict[str, dict], ops) -> Dict[str, float]:
    """node name -> multiply-accumulates per call, for the main-graph nodes of the op types `ops`."""
    out = {}
    for n in g.nodes:
        if n.op_type in ops:
            m = macs_per_call(n, stats)
            if m is not None:
                out[n.name] = m
    return out


# `--optimize balanced`: the float ops across a border that make it cost a layout change (onnxruntime runs a float
# Conv in NCHWc and a QLinearConv in NHWC: reorders and Transposes at every such border, besides the Q or DQ)
LAYOUT_OPS = {"Conv"}
# float ops looked through (each way) for one of LAYOUT_OPS: the activation of a float Conv unit (HardSwish,
# ppocr_cls's decomposed Add/Clip/Mul/Div) runs in its layout
_LAYOUT_THROUGH = SAME_SIZE | {"Clip", "HardSigmoid"}


def _near_layout_op(node, downstream: bool, depth: int = 0) -> bool:
    """Is `node` (a float op at a region's border) a LAYOUT_OPS op, or reached from/into one through at most 4
    elementwise ops?"""
    if node is None:
        return False
    if node.op_type in LAYOUT_OPS:
        return True
    if depth >= 4 or node.op_type not in _LAYOUT_THROUGH:
        return False
    if downstream:
        return any(_near_layout_op(u.user, True, depth + 1) for o in node.outputs if o is not None
                   for u in o.uses() if not u.is_graph_output and u.user.graph is node.graph)
    return any(x is not None and x.producer is not None and x.producer.graph is node.graph
               and _near_layout_op(x.producer, False, depth + 1) for x in node.inputs)


def small_regions(k, g, layout_only: bool = False) -> set:
    """ids of the main-graph nodes whose integer region is too small to pay for its border: a region is a set
    of integer kernels joined by quantized values (directly, through the Relu/Clip a unit absorbs, or through
    ops whose Q/DQ the runtime drops); it pays when its multiply-accumulates per call reach `min_macs` for each
    Q or DQ at its border (each value entering it from a float op or a graph input, each value leaving it to a
    float op or a graph output) plus `macs_per_border_element` per element of those values (plan.sizes).

    `layout_only` (`--optimize balanced`): only a border with a float Conv across it counts (LAYOUT_OPS: the
    layout change is the cost that sinks small islands), never a graph input or output, a Q or DQ next to a
    float Gemm, Flatten or Add: a model's integer kernels go float only where they are islands between float
    Convs (ppocr_cls, MobileNet-style HardSwish blocks); tiny models keep their integer kernels and Q/DQ.

    `k` is float_regions._Kernels judging without the rule. A region whose kernels have no known size (an
    activation x activation MatMul) is kept; one of elementwise units only (`inputs_from_integer` records) has
    no products and goes (they are there for a neighbour that is not integer after all)."""
    nodes = [n for n in g.nodes if k.integer(n)]
    if not nodes:
        return set()
    ids = {id(n): n for n in nodes}
    parent = {i: i for i in ids}

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def readers(v, depth=0):
        """Integer-region readers of v, looking through data movement whose Q/DQ the runtime drops; None marks
        a float reader or a graph output (a border)."""
        out = []
        if v is None:
            return out
        if v.is_output_of_any_graph() and not layout_only:
            out.append(None)
        for u in v.uses():
            if u.is_graph_output:
                continue
            r = u.user
            if id(r) in ids:
                out.append(r)
            elif depth < 8 and r.graph is g and u.index == 0 and r.outputs and (
                    k.rule(r, "drop_qdq") is not None or r.op_type in k.through):   # Relu/Clip the unit absorbs
                out.extend(readers(r.outputs[0], depth + 1))
            elif not layout_only or _near_layout_op(r, True):
                out.append(None)
        return out

    border = {}                         # id(node) -> the values at its region's border (a Q or DQ each)
    for n in nodes:
        for v in n.outputs:
            rs = readers(v)
            for r in rs:
                if r is not None:
                    parent[find(id(r))] = find(id(n))
            if None in rs:
                border.setdefault(id(n), []).append(v)
    for n in nodes:                     # activation inputs that do not come from an integer kernel
        for slot, v in enumerate(n.inputs):
            use = k.plan.uses.get((n.name, slot))
            if v is None or (use is not None and use.kind in ("weight", "bias")) or v.is_constant():
                continue
            p, x = v.producer, v
            for _ in range(8):          # back through data movement to the kernel that wrote it
                if p is None or id(p) in ids or p.graph is not g or not p.inputs or (
                        k.rule(p, "drop_qdq") is None and p.op_type not in k.through):
                    break
                x = p.inputs[0]
                p = x.producer if x is not None else None
            if layout_only and not _near_layout_op(p, False):
                continue                # balanced: a graph input or a float op that is no Conv is no border
            if p is None or id(p) not in ids:
                border.setdefault(id(n), []).append(v)
    macs, known, need, per_elem, crossings, elems, products = {}, {}, {}, {}, {}, {}, set()
    for n in nodes:
        root = find(id(n))
        crossings[root] = crossings.get(root, 0) + len(border.get(id(n), ()))
        elems[root] = elems.get(root, 0.0) + sum(elements_per_call(v, k.plan.sizes) for v in border.get(id(n), ()))
        rule = k.rule(n, "replace")
        if rule is not None and not rule.inputs_from_integer:
            products.add(root)
        if rule is not None and rule.min_macs:
            need[root] = max(need.get(root, 0), rule.min_macs)
            per_elem[root] = max(per_elem.get(root, 0), rule.macs_per_border_element)
            m = k.plan.node_macs.get(n.name)
            if m is None:
                known[root] = False
            else:
                macs[root] = macs.get(root, 0.0) + m
    small = set()
    for i in ids:
        root = find(i)
        cost = need.get(root, 0) * crossings.get(root, 0) + per_elem.get(root, 0) * elems.get(root, 0.0)
        if known.get(root, True) and need.get(root, 0) and macs.get(root, 0.0) < cost:
            small.add(i)
        elif root not in products:
            small.add(i)                # elementwise units only: no products to pay for their Q/DQ
    return small
