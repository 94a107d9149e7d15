"""RMSNorm: y = x / √(mean(x²) + ε) [· w].

The mean of squares and the inverse square root come in every exporter's spelling (patterns/stats.py: x² as
Mul(x, x) or Pow(x, 2) under ReduceMean, ReduceSum·(1/N) or ReduceSum/N, or ReduceSumSquare scaled; 1/√ as
Sqrt→Reciprocal, Sqrt→Div(1, ·) or Pow −0.5; broadcast-only Reshape/Expand/Unsqueeze before the use), and the
division is Div or a Mul by the inverse (LLaMA-style exports, T5's x·rsqrt). The weight multiplies after, on
either side. ε must be a small positive scalar constant and is structural (field notes §4). An input that is
itself x − mean(x) is refused: that is the variance/normalize tail of a LayerNorm, not an RMSNorm.
"""
from __future__ import annotations

from qcompiler.patterns.dsl import BROADCAST_OPS
from qcompiler.patterns.pattern import Pattern
from qcompiler.patterns.stats import (
    check_epsilon,
    check_stats,
    inverse_sqrt,
    mean_of_squares,
)


def _skip_broadcast(v):
    p = v.producer if v is not None else None
    while p is not None and p.op_type in BROADCAST_OPS and p.inputs and p.inputs[0] is not None:
        v = p.inputs[0]
        p = v.producer
    return v


def _is_mean_of(m, x) -> bool:
    """m (behind broadcasts) is ReduceMean(x), ReduceSum(x)·c or ReduceSum(x)/c."""
    p = _skip_broadcast(m).producer if m is not None else None
    if p is None:
        return False
    if p.op_type in ("Mul", "Div"):
        for v in p.inputs[:2]:
            q = v.producer if v is not None else None
            if q is not None and q.op_type == "ReduceSum" and q.inputs[0] is x:
                return True
        return False
    return p.op_type == "ReduceMean" and p.inputs[0] is x


def _not_centered(x):
    """Refuse x − mean(x): normalizing it is the tail of a LayerNorm, not an RMSNorm."""
    p = x.producer
    if p is not None and p.op_type == "Sub" and p.inputs[1] is not None and _is_mean_of(p.inputs[1], p.inputs[0]):
        return f"it is x − mean(x) (from '{p.name}'): this is the tail of a LayerNorm"
    return None


class RMSNorm(Pattern):
    description = "decomposed RMSNorm (mean of squares, epsilon, optional weight)"
    var_checks = {"x": _not_centered}

    def __init__(self, weighted: bool = True):
        self.weighted = weighted
        self.name = "rmsnorm" + ("_weighted" if weighted else "_plain")

    def pattern(self, op, x):
        ms = mean_of_squares(op, x, "mean_square")
        ve = op.Add(ms, op.Scalar("epsilon"), _name="add_epsilon")
        rms = op.Sqrt(ve, _name="rms")
        normed = op.Or(op.Div(x, op.Bcast(rms), _name="normalize"),
                       op.Mul(x, op.Bcast(inverse_sqrt(op, ve, rms)), _name="normalize_mul"))
        if not self.weighted:
            return normed
        return op.Mul(normed, op.Bcast(op.Const(name="weight", structural=False)), _name="apply_weight")

    def check(self, match):
        why = check_epsilon(self, match)
        if why:
            return why
        _, why = check_stats(self, match, ("mean_square",))
        return why


GROUPS = {"rmsnorm": [RMSNorm(True), RMSNorm(False)]}
