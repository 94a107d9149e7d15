"""LayerNorm decompositions: y = (x − E[x]) / √(Var[x] + ε) · γ + β over some axes (usually the last).

Forms (ORT `layer_norm_fusion.cc` matches the first two), each in every exporter's spelling of its pieces
(patterns/stats.py: mean = ReduceMean | ReduceSum·(1/N) | ReduceSum/N; square = Pow 2 | Mul(v, v) |
ReduceSumSquare; 1/√ = Sqrt→Reciprocal | Sqrt→Div(1, ·) | Pow −0.5; broadcast-only Reshape/Expand/Unsqueeze
between a statistic and its use; axes as attribute or input; keepdims):
- "pow":     d = x − E[x]; Var = E[d²]; y = d / √(Var + ε) or d · (1/√(Var + ε))  [→ ·γ → +β]
- "dupsub":  the same with the Sub duplicated for the normalizing branch (old PyTorch exports)
- "moments": Var = E[x²] − E[x]², optionally clamped by Max(·, 0) or Relu (flax, jax2onnx), then as "pow"
- "folded":  γ folded into the inverse square root, r = γ/√(Var + ε), with either variance:
             y = (x − E[x])·r + β (flax) or y = x·r + (β − E[x]·r) (tf.nn.batch_normalization, Keras through
             tf2onnx; without β: x·r − E[x]·r)
The affine forms also accept (x − E[x])·(r·γ) + β. ε must be a small positive scalar constant; every reduction
must reduce the same axes; a ReduceSum's 1/N must match the reduced size when it is known. ε, the exponents and
1/N are structural: a later pass must not fold into them (field notes §4).
"""
from __future__ import annotations

from qcompiler.patterns.pattern import Pattern
from qcompiler.patterns.stats import (
    check_epsilon,
    check_stats,
    inverse_sqrt,
    mean_of,
    mean_of_squares,
    reduce_axes,
    reduction,
)


def _centered_variance(op, x, mu):
    d = op.Sub(x, op.Bcast(mu), _name="center")
    return d, mean_of_squares(op, d, "variance")


def _moments_variance(op, x, mu):
    msq = mean_of_squares(op, x, "mean_of_squares")
    sq_mean = op.Or(op.Mul(op.Bcast(mu), op.Bcast(mu), _name="mean_squared"),
                    op.Pow(op.Bcast(mu), op.Const(2.0, name="mean_two"), _name="mean_pow2"))
    var = op.Sub(op.Bcast(msq), sq_mean, _name="moments_sub")
    return op.Or(op.Max(var, op.Const(0.0, name="zero"), _name="clamp"), op.Relu(var, _name="clamp_relu"), var)


class LayerNorm(Pattern):
    """One LayerNorm form; `affine` adds γ and β."""

    description = "decomposed LayerNormalization (mean, variance, epsilon, optional scale and shift)"

    def __init__(self, form: str = "pow", affine: bool = True):
        self.form, self.affine = form, affine
        self.name = f"layernorm_{form}" + ("" if affine else "_noaffine")

    def pattern(self, op, x):
        mu = mean_of(op, x, "mean", name="mu")
        if self.form == "moments":
            var = _moments_variance(op, x, mu)
            d = op.Sub(x, op.Bcast(mu), _name="center")
        elif self.form == "folded":
            d = op.Sub(x, op.Bcast(mu), _name="center")
            var = op.Or(mean_of_squares(op, d, "variance"), _moments_variance(op, x, mu), name="var")
        else:
            d, var = _centered_variance(op, x, mu)
        ve = op.Add(var, op.Scalar("epsilon"), _name="add_epsilon")
        std = op.Sqrt(ve, _name="std")
        inv = inverse_sqrt(op, ve, std)
        num = op.Sub(x, op.Bcast(mu), _name="center_2") if self.form == "dupsub" else d
        if self.form == "folded":
            gamma = op.Bcast(op.Const(name="gamma", structural=False))
            r = op.Mul(op.Bcast(inv), gamma, _name="fold_scale")
            beta = op.Bcast(op.Const(name="beta", structural=False))
            shifted = op.Add(op.Mul(x, op.Bcast(r), _name="scale_x"),
                             op.Sub(beta, op.Mul(op.Bcast(mu), op.Bcast(r), _name="scale_mean"), _name="shift_mean"),
                             _name="shift")
            no_beta = op.Sub(op.Mul(x, op.Bcast(r), _name="scale_x_nb"),
                             op.Mul(op.Bcast(mu), op.Bcast(r), _name="scale_mean_nb"), _name="shift_nb")
            flax = op.Add(op.Mul(d, op.Bcast(r), _name="normalize_folded"), beta, _name="shift_flax")
            return op.Or(shifted, flax, no_beta)
        normed = op.Or(op.Div(num, op.Bcast(std), _name="normalize"),
                       op.Mul(num, op.Bcast(inv), _name="normalize_mul"))
        if not self.affine:
            return normed
        # γ and β may sit behind a Reshape/Unsqueeze of the constant (Paddle2ONNX, tf2onnx without folding)
        scaled = op.Mul(normed, op.Bcast(op.Const(name="gamma", structural=False)), _name="scale")
        return op.Add(scaled, op.Bcast(op.Const(name="beta", structural=False)), _name="shift")

    def check(self, match):
        why = check_epsilon(self, match)
        if why:
            return why
        _, why = check_stats(self, match, ("mean", "variance", "mean_of_squares"))
        return why


def layernorm_axes(match):
    """Axes the LayerNorm of `match` normalizes over (None = all, "dynamic" = not constant)."""
    return reduce_axes(reduction(match, "mean"))


FORMS = ("pow", "dupsub", "moments")
GROUPS = {"layernorm": [LayerNorm(f, True) for f in FORMS] + [LayerNorm("folded", True)]
          + [LayerNorm(f, False) for f in FORMS]}
