"""RMSNorm: y = x / √(mean(x²) + ε) [· w].

x² is Mul(x, x) or Pow(x, 2); the division is Div or Reciprocal then Mul (LLaMA-style exports).
ε must be a positive scalar constant and is structural (field notes §4). An input that is itself
x − ReduceMean(x) is refused: that is the variance/normalize tail of a LayerNorm, not an RMSNorm.
"""
from __future__ import annotations

import numpy as np

from .layernorm import _reduce_axes
from .pattern import Pattern


def _not_centered(x):
    """Refuse x − ReduceMean(x): normalizing it is the tail of a LayerNorm, not an RMSNorm."""
    p = x.producer
    if p is not None and p.op_type == "Sub" and p.inputs[1] is not None:
        m = p.inputs[1].producer
        if m is not None and m.op_type == "ReduceMean" and m.inputs[0] is p.inputs[0]:
            return f"it is x − mean(x) (from '{p.name}'): this is the tail of a LayerNorm"
    return None


class RMSNorm(Pattern):
    description = "decomposed RMSNorm (mean of squares, epsilon, optional weight)"
    var_checks = {"x": _not_centered}

    def __init__(self, weighted: bool = True):
        self.weighted = weighted
        self.name = "rmsnorm" + ("_weighted" if weighted else "_plain")

    def pattern(self, op, x):
        sq = op.Or(op.Mul(x, x, _name="square_mul"), op.Pow(x, op.Const(2.0), _name="square"))
        ms = op.ReduceMean(sq, op.Optional(op.Var("axes")), _name="mean_square")
        rms = op.Sqrt(op.Add(ms, op.Scalar("epsilon"), _name="add_epsilon"), _name="rms")
        normed = op.Or(op.Div(x, rms, _name="normalize"),
                       op.Mul(x, op.Reciprocal(rms, _name="inv_rms"), _name="normalize_mul"))
        if not self.weighted:
            return normed
        return op.Mul(normed, op.Const(name="weight", structural=False), _name="apply_weight")

    def check(self, match):
        eps = float(np.ravel(match.const("epsilon"))[0])
        if not eps > 0:
            return self.fail(f"epsilon {eps} is not positive", match["epsilon"])
        mean = match["mean_square"]
        if _reduce_axes(mean) == "dynamic":
            return self.fail("reduction axes are not constant", mean)
        if mean.attr("keepdims", 1) == 0:
            return self.fail(f"'{mean.name}' has keepdims=0", mean)
        return None


GROUPS = {"rmsnorm": [RMSNorm(True), RMSNorm(False)]}
