"""GELU decompositions (exact erf form and tanh approximation), with the 0.5 on either side.

- erf:  0.5 · x · (1 + erf(x / √2)); x/√2 is Div(√2) or Mul(1/√2) (ORT `gelu_fusion.cc` checks the same constants)
- tanh: 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³))); x³ is Pow(x, 3) or Mul(Mul(x, x), x)
The product 0.5·x·g is exported as (x·g)·0.5, x·(g·0.5) or (0.5·x)·g, each with any operand order.
Every constant (0.5, √2, 1, 0.044715, √(2/π), 3) is structural: GELUs often share one 0.5 initializer
(field notes §4), so no pass may fold a scale into it.
"""
from __future__ import annotations

import math

from .pattern import Pattern


def half_times(op, x, gate):
    """0.5 · x · gate in the three association orders exporters produce."""
    half = op.Const(0.5, name="half")
    return op.Or(op.Mul(op.Mul(x, gate, _name="x_times_gate"), half, _name="times_half"),
                 op.Mul(x, op.Mul(gate, half, _name="half_gate"), _name="x_times_half_gate"),
                 op.Mul(op.Mul(x, half, _name="half_x"), gate, _name="half_x_times_gate"))


class GeluErf(Pattern):
    name = "gelu_erf"
    description = "exact GELU: 0.5·x·(1+erf(x/√2))"

    def pattern(self, op, x):
        scaled = op.Or(op.Div(x, op.Const(math.sqrt(2.0), name="sqrt2"), _name="div_sqrt2"),
                       op.Mul(x, op.Const(1 / math.sqrt(2.0), name="inv_sqrt2"), _name="mul_inv_sqrt2"))
        gate = op.Add(op.Erf(scaled, _name="erf"), op.Const(1.0, name="one"), _name="add_one")
        return half_times(op, x, gate)


class GeluTanh(Pattern):
    name = "gelu_tanh"
    description = "tanh-approximated GELU: 0.5·x·(1+tanh(√(2/π)(x+0.044715x³)))"

    def pattern(self, op, x):
        cube = op.Or(op.Pow(x, op.Const(3.0, name="three"), _name="cube"),
                     op.Mul(op.Mul(x, x, _name="x_squared"), x, _name="cube_mul"))
        inner = op.Add(x, op.Mul(cube, op.Const(0.044715, name="coeff"), _name="cubic_term"), _name="inner")
        t = op.Tanh(op.Mul(inner, op.Const(math.sqrt(2 / math.pi), name="sqrt_2_over_pi"), _name="scale"),
                    _name="tanh")
        gate = op.Add(t, op.Const(1.0, name="one"), _name="add_one")
        return half_times(op, x, gate)


GROUPS = {"gelu": [GeluErf(), GeluTanh()]}
