"""LayerNorm decompositions: y = (x − E[x]) / √(Var[x] + ε) · γ + β over the last axis.

Forms exporters emit (ORT `layer_norm_fusion.cc` matches the first two):
- "pow":     ReduceMean → Sub → Pow(2)|Mul(d,d) → ReduceMean → Add(ε) → Sqrt → Div|Reciprocal+Mul [→ Mul(γ) → Add(β)]
- "dupsub":  the same with the Sub duplicated for the Div branch (old PyTorch exports)
- "moments": Var = E[x²] − E[x]², then Sqrt → Reciprocal → Mul(x − E[x], ·)   [→ Mul(γ) → Add(β)]
ε must be a positive scalar constant; both reductions must reduce the same axes and keep dims.
ε (and the exponent 2) are structural: a later pass must not fold into them (field notes §4).
Opset 18 moved ReduceMean's axes to an optional input: both spellings match.
"""
from __future__ import annotations

import numpy as np

from .pattern import Pattern


def _reduce_axes(node):
    """Axes of a Reduce* node from its attribute (opset < 18) or its second input (opset ≥ 18); None = all."""
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        arr = node.inputs[1].const_value()
        return "dynamic" if arr is None else tuple(int(a) for a in np.ravel(arr))
    a = node.attr("axes")
    return None if a is None else tuple(int(v) for v in a)


class LayerNorm(Pattern):
    """One LayerNorm form; `affine` adds the trailing Mul(γ) → Add(β)."""

    description = "decomposed LayerNormalization (mean, variance, epsilon, optional scale and shift)"

    def __init__(self, form: str = "pow", affine: bool = True):
        self.form, self.affine = form, affine
        self.name = f"layernorm_{form}" + ("" if affine else "_noaffine")

    def pattern(self, op, x):
        mean = op.ReduceMean(x, op.Optional(op.Var("axes")), _name="mean")
        centered = op.Sub(x, mean, _name="center")
        if self.form == "moments":
            x_sq = op.Or(op.Mul(x, x, _name="x_squared"), op.Pow(x, op.Const(2.0), _name="x_pow2"))
            mean_sq = op.ReduceMean(x_sq, op.Optional(op.Var("axes_2")), _name="mean_of_squares")
            sq_mean = op.Or(op.Mul(mean, mean, _name="mean_squared"), op.Pow(mean, op.Const(2.0), _name="mean_pow2"))
            var = op.Sub(mean_sq, sq_mean, _name="variance")
            std = op.Sqrt(op.Add(var, op.Scalar("epsilon"), _name="add_epsilon"), _name="std")
            normed = op.Mul(centered, op.Reciprocal(std, _name="inv_std"), _name="normalize")
        else:
            sq = op.Or(op.Pow(centered, op.Const(2.0), _name="square"), op.Mul(centered, centered, _name="square_mul"))
            var = op.ReduceMean(sq, op.Optional(op.Var("axes_2")), _name="variance")
            std = op.Sqrt(op.Add(var, op.Scalar("epsilon"), _name="add_epsilon"), _name="std")
            num = op.Sub(x, mean, _name="center_2") if self.form == "dupsub" else centered
            normed = op.Or(op.Div(num, std, _name="normalize"),
                           op.Mul(num, op.Reciprocal(std, _name="inv_std"), _name="normalize_mul"))
        if not self.affine:
            return normed
        scaled = op.Mul(normed, op.Const(name="gamma", structural=False), _name="scale")
        return op.Add(scaled, op.Const(name="beta", structural=False), _name="shift")

    def check(self, match):
        eps = float(np.ravel(match.const("epsilon"))[0])
        if not eps > 0:
            return self.fail(f"epsilon {eps} is not positive", match["epsilon"])
        first = match["mean"]
        second = match.get("variance") if self.form != "moments" else match["mean_of_squares"]
        axes = [_reduce_axes(n) for n in (first, second)]
        if "dynamic" in axes:
            return self.fail("reduction axes are not constant", first)
        if axes[0] != axes[1]:
            return self.fail(f"mean reduces axes {axes[0]} but variance reduces {axes[1]}", second)
        for n in (first, second):
            if n.attr("keepdims", 1) == 0:
                return self.fail(f"'{n.name}' has keepdims=0; the mean must broadcast back", n)
        return None


FORMS = ("pow", "dupsub", "moments")
GROUPS = {"layernorm": [LayerNorm(f, True) for f in FORMS] + [LayerNorm(f, False) for f in FORMS]}
