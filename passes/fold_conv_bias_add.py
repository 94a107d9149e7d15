"""fold-conv-bias-add: fold Add(Conv(x), per-channel constant) into the Conv's bias input.

PaddlePaddle exports the bias of some Convs (the squeeze-excite Convs of ppocr) as a separate
Add(conv, Reshape(Constant b, [1, C, 1, 1])). Quantized, that Add runs float between a DQ and a Q and
keeps the Conv from an integer kernel's fused bias (FINDINGS §1 rule 3: 18 such Adds in ppocr_cls).

Folded when: the producer is a Conv or ConvTranspose (standard domain) whose weight shape is known; its output
is read only by this Add (once) and is not a graph output; the Add's other operand is a float constant of the
weight's type, directly or through a Reshape/Unsqueeze of constants, whose shape broadcasts per output channel
(numpy rules against the (N, C, spatial...) output: [1, C, 1, 1], [C, 1, 1], [1, C, 1], a scalar or [1]).
A [C] vector against a 4-D output lines up with the last (width) axis, not the channels, so it is not folded;
nor is a full [1, C, H, W] tensor. The existing bias (if any) must be a float [C] constant of this graph; it
is written copy-on-write (`scale_folding.write_constant_input`: a bias shared by two Convs stays right for the
other), and constants marked `protected` are left alone. The Add goes (with the Reshape and constants nothing
else reads); if the Add's output was a graph output, the Conv's output takes its name.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
from qcompiler.passes.scale_folding import is_protected, write_constant_input

from qcompiler.ir import Graph, Node, Value
from qcompiler.passmanager import Pass, PassResult, register_pass

_PRODUCERS = ("Conv", "ConvTranspose")
_MAX_RESHAPE_DIMS = 16


def _ints(v: Optional[Value]) -> Optional[list]:
    a = None if v is None else v.const_value()
    if a is None or a.dtype.kind not in "iu" or a.ndim > 1 or a.size > _MAX_RESHAPE_DIMS:
        return None
    return [int(i) for i in np.ravel(a)]


def _reshaped_shape(node: Node, in_shape: tuple) -> Optional[tuple]:
    """Output shape of a Reshape/Unsqueeze of a constant of `in_shape` (ONNX rules), or None."""
    if node.op_type == "Reshape":
        target = _ints(node.inputs[1] if len(node.inputs) > 1 else None)
        if target is None:
            return None
        allowzero = int(node.attr("allowzero", 0))
        out = []
        for i, d in enumerate(target):
            if d == 0 and not allowzero:
                if i >= len(in_shape):
                    return None
                d = in_shape[i]
            out.append(d)
        size = int(np.prod(in_shape, dtype=np.int64))
        if out.count(-1) > 1 or any(d < -1 for d in out):
            return None
        if -1 in out:
            rest = int(np.prod([d for d in out if d != -1], dtype=np.int64))
            if rest == 0 or size % rest:
                return None
            out[out.index(-1)] = size // rest
        return tuple(out) if int(np.prod(out, dtype=np.int64)) == size else None
    if node.op_type == "Unsqueeze":
        axes = node.attr("axes", None)
        if axes is None:
            axes = _ints(node.inputs[1] if len(node.inputs) > 1 else None)
        if axes is None:
            return None
        r = len(in_shape) + len(axes)
        axes = sorted(a + r if a < 0 else a for a in axes)
        if len(set(axes)) != len(axes) or any(a < 0 or a >= r for a in axes):
            return None
        rest = iter(in_shape)
        return tuple(1 if i in axes else next(rest) for i in range(r))
    return None


def _const_shape(v: Value) -> tuple:
    """Shape of a constant: an initializer's dims (no decoding), else the Constant node's value."""
    if v.tensor is not None:
        return tuple(v.tensor.dims)
    return tuple(v.const_value().shape)


def _bias_operand(add: Node, x: Value) -> Tuple[Optional[Value], Optional[Node], Optional[tuple], Optional[str]]:
    """(constant value, Reshape/Unsqueeze node or None, broadcast shape, None) or (.., reason)."""
    other = add.inputs[1] if add.inputs[0] is x else add.inputs[0]
    if other is None or other is x:
        return None, None, None, "the other operand is the Conv output too"
    if other.is_constant():
        return other, None, _const_shape(other), None
    p = other.producer
    if p is not None and p.op_type in ("Reshape", "Unsqueeze") and p.domain in ("", "ai.onnx") \
            and p.inputs and p.inputs[0] is not None and p.inputs[0].is_constant():
        src = p.inputs[0]
        shape = _reshaped_shape(p, _const_shape(src))
        if shape is None:
            return None, None, None, f"{p.op_type} '{p.name[:80]}' of a constant has an unreadable shape"
        return src, p, shape, None
    return None, None, None, f"operand '{other.name[:80]}' is not a constant (nor a Reshape/Unsqueeze of one)"


def _per_channel(shape: tuple, rank: int, c: int) -> Optional[str]:
    """None if a constant of `shape` broadcast against (N, C, ...) of `rank` varies only along axis 1."""
    if len(shape) > rank:
        return f"shape {list(shape)} has a higher rank than the Conv output ({rank})"
    off = rank - len(shape)
    for i, d in enumerate(shape):
        if d != 1 and not (off + i == 1 and d == c):
            return f"shape {list(shape)} is not per output channel of a rank-{rank} output with {c} channels"
    return None


def fold_one(g: Graph, add: Node) -> Optional[str]:
    """Fold one Add into the Conv before it; None on success, else the reason it stays (nothing written).
    Returns "" for an Add that does not follow a Conv at all (not a candidate)."""
    if add.domain not in ("", "ai.onnx") or len(add.inputs) != 2 or any(v is None for v in add.inputs):
        return ""
    conv = next((v.producer for v in add.inputs if v.producer is not None and v.producer.op_type in _PRODUCERS
                 and v.producer.domain in ("", "ai.onnx") and v.producer.graph is g), None)
    if conv is None:
        return ""
    x = conv.outputs[0]
    if not any(v is x for v in add.inputs):
        return ""
    const, via, shape, why = _bias_operand(add, x)
    if const is None and why.startswith("operand"):
        return ""   # Add(conv, activation): a residual sum, not a bias
    if x.is_output_of_any_graph():
        return f"'{x.name[:80]}' (output of {conv.op_type} '{conv.name[:80]}') is a graph output"
    if len(x.uses()) != 1:
        return f"'{x.name[:80]}' (output of {conv.op_type} '{conv.name[:80]}') has {len(x.uses())} uses"
    w = conv.inputs[1] if len(conv.inputs) > 1 else None
    if w is None or w.shape is None or len(w.shape) < 3 or not all(isinstance(d, int) for d in w.shape):
        return f"{conv.op_type} '{conv.name[:80]}' weight shape is unknown"
    group = int(conv.attr("group", 1))
    c = w.shape[0] if conv.op_type == "Conv" else group * w.shape[1]
    if why:
        return why
    if const.dtype is None or const.dtype != w.dtype or const.dtype not in (1, 10, 11):
        return f"constant '{const.name[:80]}' type {const.dtype} is not the weight's float type {w.dtype}"
    why = _per_channel(shape, len(w.shape), c)
    if why:
        return f"constant '{const.name[:80]}' {why}"
    if is_protected(const):
        return f"constant '{const.name[:80]}' is protected (part of a recognised structure)"
    arr = const.const_value()
    b = conv.inputs[2] if len(conv.inputs) > 2 else None
    bias = None
    if b is not None:
        bias = b.const_value()
        if bias is None or b.graph is not g or bias.dtype != arr.dtype or bias.shape != (c,):
            return f"{conv.op_type} '{conv.name[:80]}' bias is not a float [{c}] constant of this graph"
        if is_protected(b):
            return f"{conv.op_type} '{conv.name[:80]}' bias '{b.name[:80]}' is protected"
    add_c = np.broadcast_to(np.asarray(arr, np.float64).reshape(-1), (c,))
    new = (add_c if bias is None else bias.astype(np.float64) + add_c).astype(arr.dtype)
    write_constant_input(conv, 2, new, f"{conv.name}_bias")
    remove = [add]
    if via is not None and len(via.outputs[0].uses()) == 1 and not via.outputs[0].is_output_of_any_graph():
        remove.append(via)
    g.substitute(add.outputs[0], x, remove=remove)
    return None


@register_pass
class FoldConvBiasAdd(Pass):
    """Fold Add(Conv, per-channel constant) into the Conv's bias (bodies too)."""

    name = "fold-conv-bias-add"
    description = "fold Add(Conv/ConvTranspose, per-channel constant or Reshape of one) into the Conv's bias"
    preserves_semantics = True
    # NOTE: not in DEFAULT_PIPELINE yet: on ppocr_cls with today's placement it runs 1.23x -> 1.09x float but
    # eval agreement goes 0.9925 -> 0.985 (output SQNR 24.7 -> 25.4 dB: boundary samples flip); FINDINGS §1
    # measured 0.9925 with it once quantizers leave float regions (rule 1). `--recipe fold-conv-bias-add`.
    after = "convert-opset"

    def run(self, model) -> PassResult:
        folded, kept = 0, {}
        for g in model.graphs():
            for add in g.nodes_by_op("Add"):
                if add.graph is not g:
                    continue   # removed earlier in this loop
                reason = fold_one(g, add)
                if reason is None:
                    folded += 1
                elif reason:
                    kept[add.name] = reason
        return PassResult(folded > 0, {"folded": folded, "kept": len(kept), "kept_reasons": kept})
