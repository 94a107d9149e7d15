"""Gated activations: SiLU (x·σ(x)), HardSwish (x·Clip(x+3, 0, 6)/6) and HardSigmoid gates (SE blocks).

HardSwish is exported as x·Clip(x+3,0,6) then Div(6) or Mul(1/6), or x·(Clip(...)/6); PaddlePaddle exports
(ppocr) write Add(+3) → Clip(0,6) → Mul → Div(6). Clip takes min/max as inputs from opset 11 and as
attributes before, so the bounds are read by `clip_bounds` in the check. x·HardSigmoid(x; α=1/6, β=½) is
HardSwish too. A HardSigmoid gate multiplies some other tensor by HardSigmoid(g): squeeze-excite blocks.
"""
from __future__ import annotations

import numpy as np
from qcompiler.patterns.pattern import Pattern

INF = float("inf")


def clip_bounds(node):
    """(min, max) of a Clip from inputs (opset ≥ 11) or attributes (older); None if a bound is not constant."""
    lo, hi = node.attr("min", -INF), node.attr("max", INF)
    for i, default in ((1, lo), (2, hi)):
        v = node.inputs[i] if len(node.inputs) > i else None
        if v is not None:
            arr = v.const_value()
            if arr is None or arr.size != 1:
                return None
            default = float(np.ravel(arr)[0])
        if i == 1:
            lo = default
        else:
            hi = default
    return float(lo), float(hi)


class SiLU(Pattern):
    name = "silu"
    description = "SiLU / Swish: x·sigmoid(x)"

    def pattern(self, op, x):
        # x·Sigmoid(β·x) with β = 1 is SiLU too (Keras/TF swish with a beta, Paddle's swish)
        arg = op.Or(x, op.Mul(x, op.Const(1.0, name="beta"), _name="beta_x"))
        return op.Mul(x, op.Sigmoid(arg, _name="sigmoid"), _name="gate")


class HardSwishClip(Pattern):
    name = "hardswish_clip"
    description = "HardSwish: x·Relu6(x+3)/6, Relu6 as Clip(0, 6), Min/Max with 0 and 6, or Min(Relu, 6)"

    def pattern(self, op, x):
        shifted = op.Add(x, op.Const(3.0, name="three"), _name="add_three")
        zero, six_c = op.Const(0.0, name="relu6_min"), op.Const(6.0, name="relu6_max")
        relu6 = op.Or(op.Clip(shifted, op.Optional(op.Scalar("clip_min")), op.Optional(op.Scalar("clip_max")),
                              _name="relu6"),
                      op.Min(op.Max(shifted, zero, _name="relu6_lo"), six_c, _name="relu6_minmax"),
                      op.Max(op.Min(shifted, six_c, _name="relu6_hi"), zero, _name="relu6_maxmin"),
                      op.Min(op.Relu(shifted, _name="relu6_relu"), six_c, _name="relu6_relu_min"))
        x_relu6 = op.Mul(x, relu6, _name="x_times_relu6")
        return op.Or(op.Div(x_relu6, op.Const(6.0, name="six"), _name="div_six"),
                     op.Mul(x_relu6, op.Const(1 / 6, name="sixth"), _name="mul_sixth"),
                     op.Mul(x, op.Div(relu6, op.Const(6.0, name="six"), _name="gate_div_six"), _name="x_times_gate"),
                     op.Mul(x, op.Mul(relu6, op.Const(1 / 6, name="sixth"), _name="gate_mul_sixth"),
                            _name="x_times_gate_m"))

    def check(self, match):
        clip = match.get("relu6")
        if clip is None:  # Min/Max/Relu spelling: its constants are pinned in the pattern
            return None
        b = clip_bounds(clip)
        if b is None:
            return self.fail("Clip bounds are not constant scalars", clip)
        if abs(b[0]) > 1e-6 or abs(b[1] - 6.0) > 1e-5:
            return self.fail(f"Clip bounds are ({b[0]:g}, {b[1]:g}), HardSwish needs (0, 6)", clip)
        return None


class HardSwishHardSigmoid(Pattern):
    name = "hardswish_hardsigmoid"
    description = "HardSwish: x·HardSigmoid(x; alpha=1/6, beta=0.5)"

    def pattern(self, op, x):
        return op.Mul(x, op.HardSigmoid(x, _name="hardsigmoid"), _name="gate")

    def check(self, match):
        hs = match["hardsigmoid"]
        alpha, beta = hs.attr("alpha", 0.2), hs.attr("beta", 0.5)
        if abs(alpha - 1 / 6) > 1e-4 or abs(beta - 0.5) > 1e-4:
            return self.fail(f"HardSigmoid alpha={alpha:g}, beta={beta:g}; HardSwish needs 1/6, 0.5", hs)
        return None


class HardSigmoidGate(Pattern):
    name = "hardsigmoid_gate"
    description = "HardSigmoid gate: y·HardSigmoid(g) with y ≠ g (squeeze-excite)"

    def pattern(self, op, gated, g):
        return op.Mul(gated, op.HardSigmoid(g, _name="hardsigmoid"), _name="apply_gate")

    def check(self, match):
        if match["gated"] is match["g"]:
            return self.fail("the gate multiplies its own input: that is a HardSwish, not a gate", match["apply_gate"])
        return None


GROUPS = {"silu": [SiLU()], "hardswish": [HardSwishClip(), HardSwishHardSigmoid()],
          "hardsigmoid_gate": [HardSigmoidGate()]}
