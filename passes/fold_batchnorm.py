"""Fold inference-mode BatchNormalization into the Conv, ConvTranspose, Gemm or MatMul(+Add) that feeds it.

BN(x) = (x - mean) / sqrt(var + eps) * gamma + beta = x * s + t, with s = gamma / sqrt(var + eps) and
t = beta - mean * s, per channel on axis 1. The fold itself is `scale_folding.plan_producer_fold(x, s, t)`, which
writes weights copy-on-write (field notes §4): Conv weights shared by two Convs, or BN statistics shared by two
BNs, stay correct for every other reader. A BN that cannot be folded stays, and the stats say why, so the
quantize config can keep it float.

Conditions: the producer's output is read only by the BN (not twice, not a graph output); the BN has one output
(training-mode outputs present -> kept); gamma/beta/mean/var are constants (initializers or Constant nodes).
If the BN output is a graph output, the folded producer's output takes over its name.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from qcompiler.passes.scale_folding import _rank, apply_plan, plan_producer_fold

from qcompiler.ir import Graph, Node
from qcompiler.passmanager import Pass, PassResult, register_pass

_PRODUCERS = ("Conv", "ConvTranspose", "Gemm", "MatMul", "Add")


def _bn_affine(bn: Node):
    """(s, t) of the BN as float64 vectors, or (None, reason)."""
    arrays = []
    for i, what in ((1, "scale"), (2, "B"), (3, "mean"), (4, "var")):
        v = bn.inputs[i] if i < len(bn.inputs) else None
        a = None if v is None else v.const_value()
        if a is None:
            return None, f"{bn.name}: {what} '{v.name if v is not None else ''}' is not a constant"
        if not np.issubdtype(a.dtype, np.floating):
            return None, f"{bn.name}: {what} '{v.name}' is not float"
        arrays.append(np.asarray(a, np.float64).reshape(-1) if a.ndim <= 1 else None)
    if any(a is None for a in arrays) or len({a.size for a in arrays}) != 1:
        return None, f"{bn.name}: parameters are not 1-D vectors of one length"
    gamma, beta, mean, var = arrays
    s = gamma / np.sqrt(var + float(bn.attr("epsilon", 1e-5)))
    return (s, beta - mean * s), None


def _why_not(bn: Node, g: Graph) -> Optional[str]:
    """Reason this BN cannot be folded regardless of its producer's weights, or None."""
    if any(v is not None for v in bn.outputs[1:]) or int(bn.attr("training_mode", 0)):
        return f"{bn.name}: training-mode outputs (running mean/var) present"
    if int(bn.attr("spatial", 1)) == 0:
        return f"{bn.name}: spatial=0 (per-element statistics)"
    x = bn.inputs[0]
    p = x.producer
    if p is None or x.graph is not g:
        return f"{bn.name}: input '{x.name}' is a graph input, initializer or outer-scope value"
    if p.op_type not in _PRODUCERS or p.domain not in ("", "ai.onnx"):
        return f"{bn.name}: producer {p.op_type} '{p.name}' is not Conv/ConvTranspose/Gemm/MatMul"
    if x.is_output_of_any_graph():
        return f"{bn.name}: '{x.name}' (output of {p.op_type} '{p.name}') is a graph output"
    if len(x.uses()) != 1:
        return f"{bn.name}: '{x.name}' (output of {p.op_type} '{p.name}') has {len(x.uses())} uses; folding would change the others"
    return None


def fold_one(g: Graph, bn: Node) -> Optional[str]:
    """Fold one BN into its producer; returns None on success, else the reason it stays (nothing written)."""
    reason = _why_not(bn, g)
    if reason:
        return reason
    st, reason = _bn_affine(bn)
    if reason:
        return reason
    s, t = st
    x, y = bn.inputs[0], bn.outputs[0]
    rank = _rank(x, y)
    plan, reason = plan_producer_fold(x, s, t, axis=1, rank=rank)
    if plan is None:
        return f"{bn.name}: {reason}"
    new = apply_plan(plan)
    g.substitute(y, new, remove=[bn])  # BN parameters nothing else reads go with it
    return None


@register_pass
class FoldBatchNorm(Pass):
    """Fold inference BatchNormalization into the preceding Conv/ConvTranspose/Gemm/MatMul (bodies too)."""

    name = "fold-batchnorm"
    description = "fold BatchNormalization into the preceding Conv/ConvTranspose/Gemm/MatMul weights and bias"
    preserves_semantics = True

    def run(self, model) -> PassResult:
        folded, kept = 0, {}
        for g in model.graphs():
            for bn in g.nodes_by_op("BatchNormalization"):
                if bn.domain not in ("", "ai.onnx"):
                    continue
                reason = fold_one(g, bn)
                if reason:
                    kept[bn.name] = reason
                else:
                    folded += 1
        return PassResult(folded > 0, {"folded": folded, "kept": len(kept), "kept_reasons": kept})
