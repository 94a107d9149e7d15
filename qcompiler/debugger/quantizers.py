"""The quantizers of a QDQ model, read from its ONNX graph and matched to the float model's values.

A quantizer is what a plan turns into the graph (qcompiler/quant/core/qdq.py), or what another tool wrote:
- an activation Q→DQ pair (its Q reads a computed value or a graph input; the Cast route of float16 values
  is seen through);
- a weight: a DequantizeLinear of a stored integer initializer, a weight stored on its grid in float
  (`<name>_dequantized_prefolded`, qdq._write_on_grid), or a weight-only operator (com.microsoft MatMulNBits,
  GatherBlockQuantized: narrow_float_weights, write_weights) whose float counterpart is a MatMul or Gather with
  a constant weight, found through its output's name (`<float output>_q`).
Each is matched to a value of the float model by name: the value the pair reads, else the value its readers read
(a graph output keeps its name on the DQ), else without a `_fused` suffix (supergroups.py names a fused op's
output so). Only the main graph is read: a pair inside an If/Loop/Scan body is not listed (the bodies' values
cannot be graph outputs of a session).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
from onnx import TensorProto, numpy_helper

from qcompiler.quant.core.nbits import dequantize_reference

# integer range of each zero-point element type (the grid's bit width and signedness)
INT_RANGES = {TensorProto.INT8: (-128, 127), TensorProto.UINT8: (0, 255), TensorProto.INT16: (-32768, 32767),
              TensorProto.UINT16: (0, 65535), TensorProto.INT4: (-8, 7), TensorProto.UINT4: (0, 15),
              TensorProto.INT32: (-2 ** 31, 2 ** 31 - 1)}
BITS = {TensorProto.INT8: 8, TensorProto.UINT8: 8, TensorProto.INT16: 16, TensorProto.UINT16: 16,
        TensorProto.INT4: 4, TensorProto.UINT4: 4, TensorProto.INT32: 32}
PREFOLDED = re.compile(r"^(.*)_dequantized(?:_\d+)?_prefolded$")
STORED = re.compile(r"^(.*)_quantized(?:_\d+)?$")       # a weight's stored integers (qdq.apply_plan)


def _weight_base(name: str) -> str:
    m = STORED.match(name)
    return m.group(1) if m else name


FUSED_SUFFIX = "_fused"


@dataclass
class Quantizer:
    """One quantizer of the QDQ model: where it sits (node indices of the main graph) and its grid."""

    kind: str                   # "activation" or "weight"
    name: str                   # the float model's value (or weight) name; the QDQ model's when unmatched
    matched: bool               # a float counterpart was found
    node: str                   # activation: the node producing the value; weight: the node reading it
    op_type: str
    order: int                  # position in the main graph's node list (topological in a valid model)
    x: str                      # activation: the value Q reads; weight: the stored initializer
    out: str                    # the value its readers read (the DQ's output)
    q_index: Optional[int] = None
    dq_index: Optional[int] = None
    scale: Optional[np.ndarray] = None
    zero_point: Optional[np.ndarray] = None
    zp_type: int = TensorProto.UINT8
    axis: int = 1
    block_size: int = 0
    prefolded: bool = False
    op: str = ""                # a weight-only operator's op type (MatMulNBits, GatherBlockQuantized), else ""
    path: tuple = ()            # inside a body: ((node index, attribute, graph index), ...) from the main graph
    extra: dict = field(default_factory=dict)

    @property
    def bits(self) -> Optional[int]:
        if self.op:
            return self.extra.get("bits")
        return None if self.prefolded else BITS.get(self.zp_type)


class GraphIndex:
    """Producers, readers and constants of one GraphProto, by value name."""

    def __init__(self, graph):
        self.graph = graph
        self.nodes = list(graph.node)
        self.producer: Dict[str, int] = {}
        self.readers: Dict[str, list] = {}
        for i, n in enumerate(self.nodes):
            for o in n.output:
                if o:
                    self.producer[o] = i
            for s, x in enumerate(n.input):
                if x:
                    self.readers.setdefault(x, []).append((i, s))
        self.inits = {t.name: t for t in graph.initializer}
        self.outputs = {o.name for o in graph.output}
        self.inputs = {i.name for i in graph.input} - set(self.inits)

    def const(self, name: str) -> Optional[np.ndarray]:
        t = self.inits.get(name)
        if t is not None:
            return numpy_helper.to_array(t)
        i = self.producer.get(name)
        if i is not None and self.nodes[i].op_type == "Constant":
            for a in self.nodes[i].attribute:
                if a.name == "value":
                    return numpy_helper.to_array(a.t)
        return None

    def const_type(self, name: str) -> Optional[int]:
        t = self.inits.get(name)
        if t is not None:
            return t.data_type
        i = self.producer.get(name)
        if i is not None and self.nodes[i].op_type == "Constant":
            for a in self.nodes[i].attribute:
                if a.name == "value":
                    return a.t.data_type
        return None

    def is_const(self, name: str) -> bool:
        return name in self.inits or (name in self.producer and self.nodes[self.producer[name]].op_type == "Constant")


def _attr(node, name: str, default):
    for a in node.attribute:
        if a.name == name:
            return a.i
    return default


def _grid(idx: GraphIndex, node, z: Quantizer) -> None:
    z.scale = idx.const(node.input[1]) if len(node.input) > 1 else None
    zp = node.input[2] if len(node.input) > 2 and node.input[2] else ""
    z.zero_point = idx.const(zp) if zp else None
    z.zp_type = (idx.const_type(zp) if zp else None) or TensorProto.UINT8
    z.axis = _attr(node, "axis", 1)
    z.block_size = _attr(node, "block_size", 0)


def _match(names, float_names: set) -> Optional[str]:
    for n in names:
        if n in float_names:
            return n
    for n in names:
        if n.endswith(FUSED_SUFFIX) and n[:-len(FUSED_SUFFIX)] in float_names:
            return n[:-len(FUSED_SUFFIX)]
    return None


WEIGHT_ONLY_OPS = {"MatMulNBits": ("MatMul", 1), "GatherBlockQuantized": ("Gather", 0)}   # float op, weight slot


def _weight_only(idx: GraphIndex, fidx: GraphIndex, i: int, n) -> Optional[Quantizer]:
    out = n.output[0]
    fout = out[:-2] if out.endswith("_q") else out
    fp = fidx.producer.get(fout)
    fop, slot = WEIGHT_ONLY_OPS[n.op_type]
    f = fidx.nodes[fp] if fp is not None else None
    if f is None or f.op_type != fop or len(f.input) <= slot or f.input[slot] not in fidx.inits:
        return None
    attrs = {a.name: a.i for a in n.attribute}
    nbits = n.op_type == "MatMulNBits"       # inputs A, B, ...; GatherBlockQuantized: data, indices, ...
    z = Quantizer("weight", f.input[slot], True, f.name, fop, i, n.input[1] if nbits else n.input[0], out,
                  dq_index=i, op=n.op_type, extra=dict(attrs, reads=n.input[0] if nbits else n.input[1]))
    z.extra["scales"], z.extra["zero_points"] = n.input[2], (n.input[3] if len(n.input) > 3 else "")
    return z


def find_quantizers(idx: GraphIndex, fidx: GraphIndex) -> List[Quantizer]:
    """Every activation pair and weight quantizer of the main graph, in graph order, matched against the float
    model's graph `fidx` (its computed values, inputs and initializers)."""
    float_names = set(fidx.producer) | fidx.inputs
    float_weights = set(fidx.inits)
    captured = _captured_dequantizers(idx.graph)
    found: List[Quantizer] = []
    for i, n in enumerate(idx.nodes):
        if n.op_type in WEIGHT_ONLY_OPS and n.domain == "com.microsoft":
            z = _weight_only(idx, fidx, i, n)
            if z is not None:
                found.append(z)
            continue
        if n.op_type == "QuantizeLinear" and n.input and not idx.is_const(n.input[0]):
            readers = idx.readers.get(n.output[0], [])
            if not readers and n.output[0] in captured:
                # read only by bodies, each through its own DQ (qdq.local_dequantizers)
                x = n.input[0]
                p = idx.producer.get(x)
                src = idx.nodes[p] if p is not None else None
                hit = _match([x], float_names)
                z = Quantizer("activation", hit or x, hit is not None, src.name if src is not None else "",
                              src.op_type if src is not None else "input", i, x, "", q_index=i)
                z.extra["sites"] = captured[n.output[0]]
                _grid(idx, n, z)
                found.append(z)
                continue
            if len(readers) != 1 or n.output[0] in idx.outputs:
                continue
            dq = idx.nodes[readers[0][0]]
            if dq.op_type != "DequantizeLinear":
                continue
            x, out = n.input[0], dq.output[0]
            names = [x, out]
            p = idx.producer.get(x)
            if p is not None and idx.nodes[p].op_type == "Cast":     # Cast -> Q -> DQ -> Cast (qdq.float_route)
                names.append(idx.nodes[p].input[0])
            rd = idx.readers.get(out, [])
            if len(rd) == 1 and idx.nodes[rd[0][0]].op_type == "Cast":
                names.append(idx.nodes[rd[0][0]].output[0])
            hit = _match(names, float_names)
            src = idx.nodes[p] if p is not None else None
            if src is not None and src.op_type == "Cast" and idx.producer.get(src.input[0]) is not None:
                src = idx.nodes[idx.producer[src.input[0]]]
            z = Quantizer("activation", hit or x, hit is not None, src.name if src is not None else "",
                          src.op_type if src is not None else "input", i, x, out, q_index=i, dq_index=readers[0][0])
            _grid(idx, n, z)
            found.append(z)
        elif n.op_type == "DequantizeLinear" and n.input and idx.is_const(n.input[0]):
            rd = idx.readers.get(n.output[0], [])
            user = idx.nodes[rd[0][0]] if rd else None
            if user is not None and user.op_type == "Cast" and idx.readers.get(user.output[0]):
                user = idx.nodes[idx.readers[user.output[0]][0][0]]
            base = _weight_base(n.input[0])
            hit = _match([base, n.output[0]], float_weights)
            z = Quantizer("weight", hit or base, hit is not None, user.name if user is not None else "",
                          user.op_type if user is not None else "", i, n.input[0], n.output[0], dq_index=i)
            _grid(idx, n, z)
            found.append(z)
    for name in idx.inits:
        m = PREFOLDED.match(name)
        if not m:
            continue
        rd = idx.readers.get(name, [])
        user = idx.nodes[rd[0][0]] if rd else None
        hit = _match([m.group(1)], float_weights)
        found.append(Quantizer("weight", hit or m.group(1), hit is not None, user.name if user is not None else "",
                               user.op_type if user is not None else "", rd[0][0] if rd else len(idx.nodes),
                               name, name, prefolded=True))
    found.sort(key=lambda z: z.order)
    return found


def _broadcast(p: np.ndarray, axis: int, ndim: int, block: int = 0, shape=None) -> np.ndarray:
    p = np.asarray(p)
    if p.size == 1 and not block:
        return p.reshape(())
    axis = axis % ndim
    if block and shape is not None:
        p = np.repeat(p, block, axis=axis)
        p = np.take(p, np.arange(shape[axis]), axis=axis)
        return p
    s = [1] * ndim
    s[axis] = p.size
    return p.reshape(s)


def fake_quantize(z: Quantizer, x: np.ndarray) -> np.ndarray:
    """x through this quantizer's Q and DQ, as onnxruntime computes them: x / scale in float32, rounded half
    to even, plus the zero point, saturated to the grid, then (q − zero point) · scale."""
    x = np.asarray(x, np.float32)
    s = _broadcast(np.asarray(z.scale, np.float32), z.axis, x.ndim, z.block_size, x.shape)
    zp = _broadcast(np.asarray(z.zero_point if z.zero_point is not None else 0, np.float32), z.axis, x.ndim,
                    z.block_size, x.shape)
    lo, hi = INT_RANGES.get(z.zp_type, (0, 255))
    with np.errstate(all="ignore"):
        q = np.clip(np.rint(x / s) + zp, lo, hi)
        return ((q - zp) * s).astype(np.float32)


def dequantize_weight(idx: GraphIndex, z: Quantizer) -> Optional[np.ndarray]:
    """The float values a weight quantizer gives its readers (a MatMulNBits weight as the float MatMul's B)."""
    q = numpy_helper.to_array(z.extra["const"]) if "const" in z.extra else idx.const(z.x)
    if q is None:
        return None
    if z.op:
        scales = idx.const(z.extra["scales"])
        zps = idx.const(z.extra["zero_points"]) if z.extra["zero_points"] else None
        bits, block = z.extra.get("bits", 4), z.extra.get("block_size", 32)
        if scales is None:
            return None
        if z.op == "MatMulNBits":
            return dequantize_reference(q, scales, zps, z.extra["K"], bits, block).T
        rows, nb = np.asarray(scales).shape[0], np.asarray(scales).reshape(np.asarray(scales).shape[0], -1).shape[1]
        if np.asarray(q).size != rows * nb * block * bits // 8:
            return None
        return dequantize_reference(np.asarray(q).reshape(rows, nb, -1), scales, zps, nb * block, bits, block)
    if z.prefolded:
        return np.asarray(q, np.float32)
    q = np.asarray(q).astype(np.float64)
    s = _broadcast(np.asarray(z.scale, np.float64), z.axis, q.ndim, z.block_size, q.shape)
    zp = _broadcast(np.asarray(z.zero_point if z.zero_point is not None else 0).astype(np.float64), z.axis,
                    q.ndim, z.block_size, q.shape)
    return ((q - zp) * s).astype(np.float32)


WIDE_TYPES = {True: (TensorProto.INT16, np.int16), False: (TensorProto.UINT16, np.uint16)}


def wide_grid(z: Quantizer):
    """(scale, zero point) of the 16-bit grid over the same range as an activation's 8-bit one: a symmetric
    grid stays symmetric (int16, zero point 0), an asymmetric one spans the same [min, max] in uint16."""
    s = np.asarray(z.scale, np.float64)
    zp = np.asarray(z.zero_point if z.zero_point is not None else 0, np.float64)
    lo, hi = INT_RANGES.get(z.zp_type, (0, 255))
    signed = lo < 0
    if signed and not np.any(zp):
        scale = s * hi / 32767.0
        return scale.astype(np.float32), np.zeros(np.shape(zp), np.int16)
    vmin, vmax = (lo - zp) * s, (hi - zp) * s
    scale = np.maximum((vmax - vmin) / 65535.0, np.finfo(np.float32).tiny)
    z16 = np.clip(np.rint(-vmin / scale), 0, 65535)
    return scale.astype(np.float32), z16.astype(np.uint16)


def _bodies(graph, path=()):
    """(path, GraphProto) of every If/Loop/Scan body below `graph`, depth first."""
    for i, n in enumerate(graph.node):
        for a in n.attribute:
            gs = [a.g] if a.type == a.GRAPH else list(a.graphs) if a.type == a.GRAPHS else []
            for j, g in enumerate(gs):
                p = path + ((i, a.name, j),)
                yield p, g
                yield from _bodies(g, p)


def _captured_dequantizers(graph) -> Dict[str, list]:
    """Outer value -> [(path, DQ index, DQ output)] of the DequantizeLinear nodes in bodies that read it."""
    out: Dict[str, list] = {}
    for path, g in _bodies(graph):
        local = {o for n in g.node for o in n.output} | {t.name for t in g.initializer} | {i.name for i in g.input}
        for i, n in enumerate(g.node):
            if n.op_type == "DequantizeLinear" and n.input and n.input[0] not in local:
                out.setdefault(n.input[0], []).append((path, i, n.output[0]))
    return out


def body_at(graph, path):
    """The body GraphProto at `path` (see Quantizer.path) below `graph`."""
    for i, name, j in path:
        a = next(a for a in graph.node[i].attribute if a.name == name)
        graph = a.g if a.type == a.GRAPH else a.graphs[j]
    return graph


def _body_weight(bidx: GraphIndex, outer: dict, path, i: int, n, float_weights: set) -> Optional[Quantizer]:
    """A weight's DequantizeLinear inside a body (its stored integers in the body or captured from outside)."""
    rd = bidx.readers.get(n.output[0], [])
    user = bidx.nodes[rd[0][0]] if rd else None
    base = _weight_base(n.input[0])
    hit = _match([base], float_weights)
    z = Quantizer("weight", hit or base, hit is not None, user.name if user is not None else "",
                  user.op_type if user is not None else "", path[0][0], n.input[0], n.output[0], dq_index=i,
                  path=path)
    scope = _Scope(bidx, outer)
    z.extra["const"] = scope.consts[n.input[0]]
    _grid(scope, n, z)
    return z


class _Scope:
    """A body's constants with the main graph's behind them (a body reads outer initializers by name)."""

    def __init__(self, bidx: GraphIndex, outer: dict):
        self.bidx = bidx
        self.consts = dict(outer)
        self.consts.update(bidx.inits)

    def const(self, name: str):
        t = self.consts.get(name)
        return numpy_helper.to_array(t) if t is not None else self.bidx.const(name)

    def const_type(self, name: str):
        t = self.consts.get(name)
        return t.data_type if t is not None else self.bidx.const_type(name)


def body_quantizers(graph, float_weights: set = frozenset()) -> List[Quantizer]:
    """The activation Q→DQ pairs inside If/Loop/Scan bodies whose Q reads a value the body computes. A body's
    values cannot be outputs of a session, so they have no float twin here (`matched` False): only their cost
    to the outputs is measured (switches reach into bodies: a body reads outer values by name)."""
    found = []
    outer = {t.name: t for t in graph.initializer}
    for path, g in _bodies(graph):
        bidx = GraphIndex(g)
        for i, n in enumerate(bidx.nodes):
            if n.op_type == "DequantizeLinear" and n.input and (n.input[0] in bidx.inits or n.input[0] in outer):
                z = _body_weight(bidx, outer, path, i, n, float_weights)
                if z is not None:
                    found.append(z)
                continue
            if n.op_type != "QuantizeLinear" or not n.input or n.input[0] not in bidx.producer:
                continue
            readers = bidx.readers.get(n.output[0], [])
            if len(readers) != 1 or bidx.nodes[readers[0][0]].op_type != "DequantizeLinear":
                continue
            src = bidx.nodes[bidx.producer[n.input[0]]]
            dq = bidx.nodes[readers[0][0]]
            # a body output keeps its name on the DQ (the IR's insert_after)
            name = dq.output[0] if dq.output[0] in bidx.outputs else n.input[0]
            z = Quantizer("activation", name, False, src.name, src.op_type, path[0][0], n.input[0],
                          dq.output[0], q_index=i, dq_index=readers[0][0], path=path)
            z.extra["body_outputs"] = bidx.outputs
            found.append(z)
    return found
