"""GELU decompositions (exact erf form and tanh approximation), with the 0.5 on either side.

- erf:  0.5 · x · (1 + erf(x / √2)); x/√2 is Div(√2) or Mul(1/√2) (ORT `gelu_fusion.cc` checks the same constants)
- tanh: 0.5 · x · (1 + tanh(√(2/π) · (x + 0.044715 · x³))); x³ is Pow(x, 3) or Mul(Mul(x, x), x)
  or factored: 0.5 · x · (1 + tanh(√(2/π) · x · (1 + 0.044715 · x²)))  (HF FastGELU written by hand)
The product 0.5·x·g is exported as (x·g)·0.5, x·(g·0.5) or (0.5·x)·g, each with any operand order, and with
/2 for ·0.5 (jax: x·(erf(x/√2)+1)/2).
Every constant (0.5, √2, 1, 0.044715, √(2/π), 3) is structural: GELUs often share one 0.5 initializer
(field notes §4), so no pass may fold a scale into it.
"""
from __future__ import annotations

import math

from qcompiler.patterns.pattern import Pattern


def half_times(op, x, gate):
    """0.5 · x · gate in the three association orders exporters produce, with ·0.5 or /2."""
    half = op.Const(0.5, name="half")
    two = op.Const(2.0, name="two")
    xg = op.Mul(x, gate, _name="x_times_gate")
    return op.Or(op.Mul(xg, half, _name="times_half"),
                 op.Mul(x, op.Mul(gate, half, _name="half_gate"), _name="x_times_half_gate"),
                 op.Mul(op.Mul(x, half, _name="half_x"), gate, _name="half_x_times_gate"),
                 op.Div(xg, two, _name="div_two"),
                 op.Mul(x, op.Div(gate, two, _name="gate_div_two"), _name="x_times_gate_div_two"),
                 op.Mul(op.Div(x, two, _name="x_div_two"), gate, _name="x_div_two_times_gate"))


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
    description = "tanh-approximated GELU: 0.5·x·(1+tanh(√(2/π)(x+0.044715x³))), also as x·(1+0.044715x²)"

    def pattern(self, op, x):
        coeff = op.Const(0.044715, name="coeff")
        c = op.Const(math.sqrt(2 / math.pi), name="sqrt_2_over_pi")
        cube = op.Or(op.Pow(x, op.Const(3.0, name="three"), _name="cube"),
                     op.Mul(op.Mul(x, x, _name="x_squared"), x, _name="cube_mul"))
        inner = op.Add(x, op.Mul(cube, coeff, _name="cubic_term"), _name="inner")
        # factored (HF FastGELU): x·(1 + 0.044715·x²), the √(2/π) on either factor
        quad = op.Or(op.Mul(op.Mul(x, x, _name="x_squared_f"), coeff, _name="quad_term"),
                     op.Mul(op.Mul(x, coeff, _name="coeff_x"), x, _name="quad_term_2"))
        poly = op.Add(quad, op.Const(1.0, name="poly_one"), _name="poly")
        arg = op.Or(op.Mul(inner, c, _name="scale"),
                    op.Mul(op.Mul(x, poly, _name="x_poly"), c, _name="scale_f"),
                    op.Mul(op.Mul(x, c, _name="scale_x"), poly, _name="scale_poly"))
        gate = op.Add(op.Tanh(arg, _name="tanh"), op.Const(1.0, name="one"), _name="add_one")
        return half_times(op, x, gate)


GROUPS = {"gelu": [GeluErf(), GeluTanh()]}
