"""Scale folding: fold a per-channel scale (and shift) into the op producing a tensor, or a scale into its readers.

Producer fold: `x = P(...)` becomes `P'(...) = x * s (+ t)` along one channel axis of x, for
Conv, ConvTranspose (groups: weight (C_in, C_out/g, k...), the output channel g*C_out/g + j is column j of
block g), Gemm (transB 0/1, bias C broadcast), MatMul with a constant 2-D weight (optionally followed by
Add(bias)), and Mul by a constant (scale only). BatchNorm folding is this fold with s = gamma/sqrt(var+eps),
t = beta - mean*s.

Consumer fold: every reader of x is a linear op (MatMul, Gemm, Conv, ConvTranspose reading x as its data
input); afterwards each computes from x what it computed before from x*s (weight rows times s). SmoothQuant is
`fold_scale_into_producer(x, 1/s)` then `fold_scale_into_consumers(x, s)`.

Field notes §4 (INC SmoothQuant on ViT): the scale was folded into a GELU's scalar 0.5 shared by every GELU.
So: (1) the whole fold is planned first and refused with a reason before anything is written; (2) broadcast
shapes are checked (a scalar may be expanded into a private per-channel copy when the output shape stays the
same); (3) a constant with other readers is never written in place (`Graph.set_constant(..., writer=)` copies
on write; Constant-node outputs are always replaced by a new initializer); (4) constants marked as part of a
recognised structure (the `protected`/`supergroup` annotations, qcompiler/ir/annotations.py, or the `protected` argument) and elementwise
nodes inside a supergroup are never folded into.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

import numpy as np

from qcompiler.ir import Graph, Node, Value
from qcompiler.ir.annotations import annotation
from qcompiler.passmanager import Pass, PassResult, register_pass

LINEAR_PRODUCERS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


@dataclass
class FoldPlan:
    """Everything a fold will write, computed before anything is written (so a refusal changes nothing)."""

    value: Value                                   # the tensor whose meaning changes (producer fold)
    writes: list = field(default_factory=list)     # (node, input index, new array); index may be a new slot
    attrs: list = field(default_factory=list)      # (node, attribute name, new value)
    add_shift: Optional[np.ndarray] = None         # MatMul without bias: insert Add(x, shift) after it


def is_protected(value: Value, protected: Optional[Iterable] = None) -> bool:
    """True if `value` belongs to a recognised structure (a GELU's 0.5, a LayerNorm epsilon) and must not change."""
    if protected and (value in protected or value.name in protected):
        return True
    return _node_in_structure(value) or _node_in_structure(value.producer)


def _node_in_structure(obj) -> bool:
    """A node (or value) that a recognised structure owns: a supergroup member or a protected constant."""
    return bool(annotation(obj, "supergroup") or annotation(obj, "protected"))


def _rank(*values) -> Optional[int]:
    for v in values:
        if v is not None and v.shape is not None:
            return len(v.shape)
    return None


def _float_const(v: Optional[Value]):
    a = None if v is None else v.const_value()
    if a is None or not np.issubdtype(a.dtype, np.floating):
        return None
    return a


def _channels(scale: np.ndarray, c: int) -> Optional[np.ndarray]:
    """`scale` as a length-c float64 vector (a scalar is broadcast), or None if its size does not fit."""
    s = np.asarray(scale, np.float64).reshape(-1)
    if s.size == 1:
        return np.full(c, s[0])
    return s if s.size == c else None


def _neg_axis(axis: int, rank: Optional[int]) -> Optional[int]:
    if axis < 0:
        return axis
    return None if rank is None else axis - rank


def _check_elementwise(const: np.ndarray, new_shape: tuple, x: Value, neg_axis: int, c: int) -> Optional[str]:
    """Reason why a constant of `new_shape` would change the shape of `x` (broadcast check), or None."""
    xs = x.shape
    if xs is None:
        if len(new_shape) > const.ndim:
            return f"rank of '{x.name}' unknown; cannot check that shape {new_shape} broadcasts (run shape-inference)"
        return None
    if len(new_shape) > len(xs):
        return f"folded constant shape {new_shape} has higher rank than '{x.name}' {tuple(xs)}"
    dim = xs[len(xs) + neg_axis] if -neg_axis <= len(xs) else None
    if isinstance(dim, int) and dim != c:
        return f"'{x.name}' has {dim} channels on axis {neg_axis}, scale has {c}"
    for d_new, d_x in zip(reversed(new_shape), reversed(xs)):
        if d_new != 1 and isinstance(d_x, int) and d_x != d_new:
            return f"folded constant shape {new_shape} does not broadcast to '{x.name}' {tuple(xs)}"
    return None


# --- producer fold ----------------------------------------------------------------------------------------
def plan_producer_fold(value: Value, scale, shift=None, axis: int = 1, protected: Optional[Iterable] = None,
                       rank: Optional[int] = None):
    """Plan `value := value * scale + shift` along `axis` inside its producer. Returns (FoldPlan, None) or (None, reason)."""
    p = value.producer
    if p is None:
        return None, f"'{value.name}' has no producer (graph input or initializer)"
    if p.op_type == "Constant" or p.domain not in ("", "ai.onnx"):
        return None, f"producer {p.op_type} '{p.name}' is not Conv/ConvTranspose/Gemm/MatMul/Add/Mul"
    rank = rank if rank is not None else _rank(value)
    plan = FoldPlan(value)
    op = p.op_type
    fn = {"Conv": _plan_conv, "ConvTranspose": _plan_conv_transpose, "Gemm": _plan_gemm, "MatMul": _plan_matmul,
          "Add": _plan_add, "Mul": _plan_mul}.get(op)
    if fn is None:
        return None, f"producer {op} '{p.name}' is not Conv/ConvTranspose/Gemm/MatMul/Add/Mul"
    reason = fn(plan, p, scale, shift, axis, rank, protected)
    if reason:
        return None, reason
    return plan, None


def _weight(p: Node, idx: int, protected, what: str = "weight"):
    w = p.inputs[idx] if idx < len(p.inputs) else None
    arr = _float_const(w)
    if arr is None:
        return None, f"{p.op_type} '{p.name}' {what} is not a float constant"
    if is_protected(w, protected):
        return None, f"{p.op_type} '{p.name}' {what} '{w.name}' is protected (part of a recognised structure)"
    return arr, None


def _bias(p: Node, idx: int, protected):
    b = p.inputs[idx] if idx < len(p.inputs) else None
    if b is None:
        return None, None
    arr = _float_const(b)
    if arr is None:
        return None, f"{p.op_type} '{p.name}' bias is not a float constant"
    if is_protected(b, protected):
        return None, f"{p.op_type} '{p.name}' bias '{b.name}' is protected"
    return arr, None


def _plan_conv(plan, p, scale, shift, axis, rank, protected):
    w, r = _weight(p, 1, protected)
    if r:
        return f"{r}"
    if (axis if axis >= 0 else axis + w.ndim) != 1:
        return f"Conv '{p.name}': scale axis {axis} is not the channel axis 1"
    c = w.shape[0]
    s = _channels(scale, c)
    if s is None:
        return f"Conv '{p.name}' has {c} output channels, scale has {np.size(scale)}"
    b, r = _bias(p, 2, protected)
    if r:
        return r
    plan.writes.append((p, 1, (w * s.reshape((c,) + (1,) * (w.ndim - 1))).astype(w.dtype)))
    _plan_vector_bias(plan, p, 2, b, s, shift, w.dtype)
    return None


def _plan_vector_bias(plan, p, idx, b, s, shift, dtype):
    if b is None and shift is None:
        return
    new = (np.zeros(s.shape) if b is None else b.astype(np.float64) * s)
    if shift is not None:
        new = new + np.asarray(shift, np.float64)
    plan.writes.append((p, idx, new.astype(dtype)))


def _plan_conv_transpose(plan, p, scale, shift, axis, rank, protected):
    w, r = _weight(p, 1, protected)
    if r:
        return r
    if (axis if axis >= 0 else axis + w.ndim) != 1:
        return f"ConvTranspose '{p.name}': scale axis {axis} is not the channel axis 1"
    g = int(p.attr("group", 1))
    cin, cog = w.shape[0], w.shape[1]
    if cin % g:
        return f"ConvTranspose '{p.name}': {cin} input channels not divisible by group {g}"
    c = g * cog
    s = _channels(scale, c)
    if s is None:
        return f"ConvTranspose '{p.name}' has {c} output channels, scale has {np.size(scale)}"
    b, r = _bias(p, 2, protected)
    if r:
        return r
    k = w.shape[2:]
    blocks = w.reshape((g, cin // g, cog) + k) * s.reshape((g, 1, cog) + (1,) * len(k))
    plan.writes.append((p, 1, blocks.reshape(w.shape).astype(w.dtype)))
    _plan_vector_bias(plan, p, 2, b, s, shift, w.dtype)
    return None


def _plan_gemm(plan, p, scale, shift, axis, rank, protected):
    if axis not in (1, -1):
        return f"Gemm '{p.name}': scale axis {axis} is not the output-feature axis 1"
    w, r = _weight(p, 1, protected, "B")
    if r:
        return r
    if w.ndim != 2:
        return f"Gemm '{p.name}' B is not 2-D"
    trans_b = int(p.attr("transB", 0))
    n = w.shape[0] if trans_b else w.shape[1]
    s = _channels(scale, n)
    if s is None:
        return f"Gemm '{p.name}' has {n} outputs, scale has {np.size(scale)}"
    c, r = _bias(p, 2, protected)
    if r:
        return r
    plan.writes.append((p, 1, (w * (s[:, None] if trans_b else s[None, :])).astype(w.dtype)))
    beta = float(p.attr("beta", 1.0))
    if c is None and shift is None:
        return None
    try:
        if c is None:
            new = np.asarray(shift, np.float64)
        else:
            if c.ndim > 2 or (c.ndim >= 1 and c.shape[-1] not in (1, n)):
                return f"Gemm '{p.name}' bias C shape {c.shape} does not broadcast to (M, {n})"
            new = c.astype(np.float64) * s
            if shift is not None:
                new = beta * new + np.asarray(shift, np.float64)
    except ValueError as e:
        return f"Gemm '{p.name}' bias: {e}"
    plan.writes.append((p, 2, new.astype(w.dtype)))
    if (c is None or shift is not None) and beta != 1.0:
        plan.attrs.append((p, "beta", 1.0))
    return None


def _plan_matmul(plan, p, scale, shift, axis, rank, protected):
    w, r = _weight(p, 1, protected)
    if r:
        return r
    if w.ndim != 2:
        return f"MatMul '{p.name}' weight is not a constant 2-D matrix"
    out_rank = rank if rank is not None else (None if _rank(p.inputs[0]) is None else max(_rank(p.inputs[0]), 2))
    if _neg_axis(axis, out_rank) != -1:
        why = "rank of the output unknown" if out_rank is None else f"output rank {out_rank}"
        return f"MatMul '{p.name}': scale axis {axis} is not the last axis ({why})"
    n = w.shape[1]
    s = _channels(scale, n)
    if s is None:
        return f"MatMul '{p.name}' has {n} outputs, scale has {np.size(scale)}"
    plan.writes.append((p, 1, (w * s[None, :]).astype(w.dtype)))
    if shift is not None:
        plan.add_shift = np.asarray(shift, np.float64).astype(w.dtype) * np.ones(n, w.dtype)
    return None


def _const_operand(p: Node):
    """(index of the constant operand, index of the other) of a binary op, or None."""
    a, b = p.inputs[0], p.inputs[1]
    if a is b:
        return None
    if b is not None and b.is_constant():
        return 1, 0
    if a is not None and a.is_constant():
        return 0, 1
    return None


def _elementwise_const(plan, p, scale, axis, rank, protected, shift=None):
    """New value of the constant operand of Add/Mul so that the result is scaled (Mul) or scaled-and-shifted (Add)."""
    if _node_in_structure(p):
        return None, None, f"{p.op_type} '{p.name}' is part of a recognised structure; not folded into"
    ops = _const_operand(p)
    if ops is None:
        return None, None, f"{p.op_type} '{p.name}' has no constant operand"
    ci, xi = ops
    cv = p.inputs[ci]
    c = _float_const(cv)
    if c is None:
        return None, None, f"{p.op_type} '{p.name}' constant '{cv.name}' is not float"
    if is_protected(cv, protected):
        return None, None, f"constant '{cv.name}' of {p.op_type} '{p.name}' is protected (part of a recognised structure)"
    x = p.outputs[0]
    na = _neg_axis(axis, rank if rank is not None else _rank(x))
    if na is None:
        return None, None, f"rank of '{x.name}' unknown; cannot place axis {axis}"
    s = np.asarray(scale, np.float64).reshape(-1)
    n = s.size
    s_b = s.reshape((n,) + (1,) * (-na - 1)) if n > 1 else s.reshape(())
    new = c.astype(np.float64) * s_b
    if shift is not None:
        new = new + np.asarray(shift, np.float64).reshape(s_b.shape if np.size(shift) > 1 else ())
    new = np.asarray(new)
    reason = _check_elementwise(c, new.shape, x, na, n) if n > 1 else None
    if reason:
        return None, None, f"{p.op_type} '{p.name}': {reason}"
    return (ci, xi), new.astype(c.dtype), None


def _plan_mul(plan, p, scale, shift, axis, rank, protected):
    if shift is not None:
        return f"Mul '{p.name}' cannot absorb a shift"
    ops, new, r = _elementwise_const(plan, p, scale, axis, rank, protected)
    if r:
        return r
    plan.writes.append((p, ops[0], new))
    return None


def _plan_add(plan, p, scale, shift, axis, rank, protected):
    """x = Add(L(...), b) with L linear and read only here: x*s + t = L'(...) + (b*s + t)."""
    ops = _const_operand(p)
    if ops is None:
        return f"Add '{p.name}' has no constant operand"
    inner = p.inputs[ops[1]]
    q = inner.producer
    if q is None or q.op_type not in LINEAR_PRODUCERS or q.graph is not p.graph:
        return f"Add '{p.name}' does not follow Conv/ConvTranspose/Gemm/MatMul"
    if len(inner.uses()) != 1:
        return f"'{inner.name}' (between {q.op_type} '{q.name}' and Add '{p.name}') has {len(inner.uses())} uses"
    r = rank if rank is not None else _rank(p.outputs[0], inner)
    sub = FoldPlan(inner)
    fn = {"Conv": _plan_conv, "ConvTranspose": _plan_conv_transpose, "Gemm": _plan_gemm, "MatMul": _plan_matmul}[q.op_type]
    reason = fn(sub, q, scale, None, axis, r, protected)
    if reason:
        return reason
    _, new, reason = _elementwise_const(plan, p, scale, axis, r, protected, shift)
    if reason:
        return reason
    plan.writes.extend(sub.writes)
    plan.attrs.extend(sub.attrs)
    plan.writes.append((p, ops[0], new))
    return None


# --- writing ----------------------------------------------------------------------------------------------
def write_constant_input(node: Node, index: int, array: np.ndarray, hint: str = "") -> Value:
    """Make input `index` of `node` hold `array` without touching what any other reader sees.

    An initializer read only by `node` is written in place; a shared one is copied on write
    (`Graph.set_constant`); a Constant-node output is replaced by a new initializer; an absent optional
    input (a Conv bias) is created.
    """
    g = node.graph
    old = node.inputs[index] if index < len(node.inputs) else None
    if old is not None and old.tensor is not None and not old.is_input:
        return g.set_constant(old, array, writer=node)
    new = g.add_constant(array, old.name if old is not None else (hint or f"{node.name}_in{index}"))
    if old is not None:
        for i, v in enumerate(node.inputs):
            if v is old:
                g.set_input(node, i, new)
        g.drop_if_unused([old])
    elif index < len(node.inputs):
        g.set_input(node, index, new)
    else:
        while len(node.inputs) < index:
            g.append_input(node, None)
        g.append_input(node, new)
    return new


def apply_plan(plan: FoldPlan) -> Value:
    """Commit a plan; returns the value that now holds x*s(+t) (x itself, or the output of an inserted Add)."""
    for node, index, array in plan.writes:
        hint = f"{node.name}.bias" if index == 2 else ""   # AIMET names a created bias <node>.bias
        write_constant_input(node, index, array, hint)
    for node, name, value in plan.attrs:
        node.set_attr(name, value)
    if plan.add_shift is None:
        return plan.value
    x = plan.value
    g = x.graph
    t = g.add_constant(plan.add_shift, f"{x.producer.name}_bias")
    add = g.add_node("Add", [x, t], [f"{x.name}_biased"], name=f"{x.producer.name}_bias_add", after=x.producer)
    return add.outputs[0]


def fold_scale_into_producer(graph: Graph, value: Value, scale, axis: int,
                             protected: Optional[Iterable] = None) -> tuple:
    """Make `value` hold `value * scale` (per channel on `axis`) by rewriting its producer. Returns (ok, reason).

    Every reader of `value` sees the scaled tensor; callers compensate (e.g. `fold_scale_into_consumers`).
    Nothing is written when the fold is refused.
    """
    if value.graph is not graph:
        return False, f"'{value.name}' is not defined in graph '{graph.name}'"
    plan, reason = plan_producer_fold(value, scale, None, axis, protected)
    if plan is None:
        return False, reason
    apply_plan(plan)
    return True, ""


# --- consumer fold ----------------------------------------------------------------------------------------
def plan_consumer_fold(value: Value, scale, axis: int, protected: Optional[Iterable] = None):
    """Plan: each reader of `value` computes from x what it computed from x*scale. Returns (writes, None) or (None, reason)."""
    writes = []
    s_raw = np.asarray(scale, np.float64).reshape(-1)
    rank = _rank(value)
    for use in value.uses():
        if use.is_graph_output:
            return None, f"'{value.name}' is a graph output; its readers cannot absorb the scale"
        n = use.user
        if use.index != 0 or n.op_type not in LINEAR_PRODUCERS or n.domain not in ("", "ai.onnx"):
            return None, f"reader {n.op_type} '{n.name}' (input {use.index}) is not a linear op reading '{value.name}' as data"
        if sum(1 for v in n.inputs if v is value) > 1:
            return None, f"{n.op_type} '{n.name}' reads '{value.name}' twice"
        w, r = _weight(n, 1, protected)
        if r:
            return None, r
        op = n.op_type
        if op == "MatMul":
            if w.ndim != 2:
                return None, f"MatMul '{n.name}' weight is not 2-D"
            if _neg_axis(axis, rank) != -1:
                return None, f"MatMul '{n.name}': axis {axis} of '{value.name}' is not its last axis"
            s = _channels(s_raw, w.shape[0])
            new = None if s is None else w * s[:, None]
        elif op == "Gemm":
            trans_a, trans_b = int(n.attr("transA", 0)), int(n.attr("transB", 0))
            if axis not in ((0, -2) if trans_a else (1, -1)):
                return None, f"Gemm '{n.name}': axis {axis} is not the reduction axis of A"
            k = w.shape[1] if trans_b else w.shape[0]
            s = _channels(s_raw, k)
            new = None if s is None else (w * s[None, :] if trans_b else w * s[:, None])
        elif op == "Conv":
            if (axis if axis >= 0 else axis + w.ndim) != 1:
                return None, f"Conv '{n.name}': axis {axis} is not the channel axis"
            g = int(n.attr("group", 1))
            cout, cig = w.shape[0], w.shape[1]
            s = _channels(s_raw, g * cig)
            kk = w.shape[2:]
            new = None if s is None else (w.reshape((g, cout // g, cig) + kk) *
                                          s.reshape((g, 1, cig) + (1,) * len(kk))).reshape(w.shape)
        else:  # ConvTranspose: weight (C_in, C_out/g, k...)
            if (axis if axis >= 0 else axis + w.ndim) != 1:
                return None, f"ConvTranspose '{n.name}': axis {axis} is not the channel axis"
            s = _channels(s_raw, w.shape[0])
            new = None if s is None else w * s.reshape((-1,) + (1,) * (w.ndim - 1))
        if new is None:
            return None, f"{op} '{n.name}': scale has {s_raw.size} channels, weight {w.shape} does not match"
        writes.append((n, 1, new.astype(w.dtype)))
    if not writes:
        return None, f"'{value.name}' has no readers"
    return writes, None


def fold_scale_into_consumers(graph: Graph, value: Value, scale, axis: int,
                              protected: Optional[Iterable] = None) -> tuple:
    """Fold a per-channel `scale` of `value` (axis `axis`) into the weights of every reader. Returns (ok, reason).

    Afterwards each reader L computes L(x * scale) from x: weight rows (input channels) are multiplied by the
    scale. All readers must be linear ops reading `value` as data; otherwise nothing is written.
    """
    writes, reason = plan_consumer_fold(value, scale, axis, protected)
    if writes is None:
        return False, reason
    for node, index, array in writes:
        write_constant_input(node, index, array)
    return True, ""


# --- the pass ---------------------------------------------------------------------------------------------
def _mul_channel_axis(c: np.ndarray) -> Optional[int]:
    """The (negative) axis along which a constant varies, for a per-channel or scalar Mul; None otherwise."""
    if c.size == 1:
        return -1
    big = [i for i, d in enumerate(c.shape) if d != 1]
    return big[0] - c.ndim if len(big) == 1 else None


@register_pass
class FoldScaleMul(Pass):
    """Remove `Mul(x, c)` (c a per-channel or scalar constant) by folding c into x's producer or into x*c's readers."""

    name = "fold-scale"
    description = "fold Mul-by-constant per-channel scales into the adjacent Conv/Gemm/MatMul weights"
    preserves_semantics = True

    def __init__(self, protected: Optional[Iterable] = None, include_scalars: bool = False):
        self.protected = set(protected or ())
        # NOTE: scalar Muls are usually structure (a GELU's 0.5, attention's 1/sqrt(d)); folding them away
        # would hide the pattern from supergroup recognition, so only per-channel scales fold by default.
        self.include_scalars = include_scalars

    def run(self, model) -> PassResult:
        folded, kept = 0, {}
        for g in model.graphs():
            for mul in g.nodes_by_op("Mul"):
                if mul.graph is not g or mul.domain not in ("", "ai.onnx"):
                    continue
                reason = self._fold_one(g, mul)
                if reason:
                    kept[mul.name] = reason
                else:
                    folded += 1
        return PassResult(folded > 0, {"folded": folded, "kept": len(kept), "kept_reasons": kept})

    def _fold_one(self, g: Graph, mul: Node) -> Optional[str]:
        if _node_in_structure(mul):
            return f"{mul.name}: part of a recognised structure"
        ops = _const_operand(mul)
        if ops is None:
            return f"{mul.name}: no constant operand"
        cv, x, y = mul.inputs[ops[0]], mul.inputs[ops[1]], mul.outputs[0]
        c = _float_const(cv)
        if c is None or is_protected(cv, self.protected):
            return f"{mul.name}: constant '{cv.name}' is not a float or is protected"
        if c.size == 1 and not self.include_scalars:
            return f"{mul.name}: scalar constant '{cv.name}' (structure, not a channel scale)"
        axis = _mul_channel_axis(c)
        if axis is None:
            return f"{mul.name}: constant shape {c.shape} is not per-channel"
        xs = x.shape
        if xs is None or len(xs) < c.ndim or (c.size > 1 and xs[len(xs) + axis] != c.size):
            return f"{mul.name}: cannot prove Mul output shape equals '{x.name}' shape (shape {xs} vs {c.shape})"
        s = c.reshape(-1)
        reason = None
        if len(x.uses()) == 1 and not x.is_output_of_any_graph() and x.graph is g:
            plan, reason = plan_producer_fold(x, s, None, axis, self.protected)
            if plan is not None:
                apply_plan(plan)
                self._bypass(g, mul, x, y)
                return None
        if y.is_output_of_any_graph():
            return f"{mul.name}: {reason or 'producer not foldable'}; output '{y.name}' is a graph output"
        writes, reason2 = plan_consumer_fold(y, s, axis, self.protected)
        if writes is None:
            return f"{mul.name}: producer: {reason}; readers: {reason2}"
        for node, index, array in writes:
            write_constant_input(node, index, array)
        self._bypass(g, mul, x, y)
        return None

    @staticmethod
    def _bypass(g: Graph, mul: Node, x: Value, y: Value) -> None:
        g.substitute(y, x, remove=[mul])
