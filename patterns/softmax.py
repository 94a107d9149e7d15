"""Softmax over masked scores: Softmax(scores + mask) or Softmax(Where(keep, scores, −large)).

The additive mask is a large negative number where attention is masked: a constant (a causal mask as an
initializer), or computed from an attention mask the way exporters write it, (1 − m)·(−10000) (BERT through
torch legacy), Where(m, 0, −inf | finfo.min) (torch dynamo, jax2onnx), Cast/Sub/Mul/Expand chains (tf2onnx).
The Where form takes the masked value directly. `check` wants a constant at most −1000 (or −inf) in the mask
or within a few producers of it: an Add of two ordinary tensors before a Softmax (a relative position bias) is
not a mask. The group is registered for `qcompiler match` and configs; it is not a default supergroup (the
masked scores are left float by the calibration rules already, field notes §6).
"""
from __future__ import annotations

import numpy as np
from qcompiler.patterns.pattern import Pattern

LARGE_NEGATIVE = -1e3
MASK_DEPTH = 4  # producers walked up from the mask looking for its large negative constant


def _large_negative(v) -> bool:
    arr = v.const_value() if v is not None else None
    if arr is None or arr.dtype.kind != "f" or arr.size == 0:
        return False
    return bool(np.nanmin(arr) <= LARGE_NEGATIVE)


def _mask_constant(v, depth: int = MASK_DEPTH):
    """The large negative constant the mask `v` is (or is computed from within `depth` producers), or None."""
    frontier = [v]
    for _ in range(depth + 1):
        nxt = []
        for u in frontier:
            if u is None:
                continue
            if u.is_constant():
                if _large_negative(u):
                    return u
                continue
            p = u.producer
            if p is not None:
                nxt.extend(p.inputs)
        frontier = nxt
    return None


class SoftmaxMaskAdd(Pattern):
    name = "softmax_mask_add"
    description = "Softmax(scores + mask) with a large negative additive mask"

    def pattern(self, op, scores, mask):
        return op.Softmax(op.Add(scores, mask, _name="add_mask"), _name="softmax")

    def check(self, match):
        m = match["mask"]  # the matcher tries the Add's operands both ways round
        if _mask_constant(m) is None:
            return self.fail(f"'{m.name}' is not a large negative mask (no constant <= {LARGE_NEGATIVE:g} "
                             f"within {MASK_DEPTH} producers)", m)
        return None


class SoftmaxMaskWhere(Pattern):
    name = "softmax_mask_where"
    description = "Softmax(Where(keep, scores, -large))"

    def pattern(self, op, keep, scores):
        fill = op.Const(name="fill", scalar=None)
        return op.Softmax(op.Or(op.Where(keep, scores, fill, _name="where_mask"),
                                op.Where(keep, fill, scores, _name="where_mask_2")), _name="softmax")

    def check(self, match):
        fill = match["fill"]
        if not _large_negative(fill):
            return self.fail(f"the masked value '{fill.name}' is not a large negative constant", fill)
        return None


GROUPS = {"softmax_mask": [SoftmaxMaskAdd(), SoftmaxMaskWhere()]}
