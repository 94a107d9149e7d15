"""MatMul/Gemm followed by a bias Add: a linear layer split by the exporter (→ Gemm, or one quantized unit).

Weight and bias must be constants (initializers or Constant nodes); the bias must broadcast along the output
features only (size N or 1), else the Add is a residual or a mask, not a bias.
"""
from __future__ import annotations

from .pattern import Pattern


def _out_features(weight, trans: bool):
    arr = weight.const_value()
    if arr is None or arr.ndim < 1:
        return None
    return arr.shape[0] if trans and arr.ndim == 2 else arr.shape[-1]


class MatMulAdd(Pattern):
    name = "matmul_add"
    description = "MatMul(x, W) + b with constant W and b"

    def pattern(self, op, x):
        mm = op.MatMul(x, op.Const(name="weight", structural=False), _name="matmul")
        return op.Add(mm, op.Const(name="bias", structural=False), _name="add_bias")

    def check(self, match):
        return _check_bias(self, match, _out_features(match["weight"], False))


class GemmAdd(Pattern):
    name = "gemm_add"
    description = "Gemm(x, W[, C]) + b with constant W and b"

    def pattern(self, op, x):
        g = op.Gemm(x, op.Const(name="weight", structural=False), op.Optional(op.Var("c")), _name="gemm")
        return op.Add(g, op.Const(name="bias", structural=False), _name="add_bias")

    def check(self, match):
        return _check_bias(self, match, _out_features(match["weight"], bool(match["gemm"].attr("transB", 0))))


def _check_bias(pat, match, n):
    b = match.const("bias")
    if b.ndim > 1 and any(d != 1 for d in b.shape[:-1]):
        return pat.fail(f"bias shape {list(b.shape)} broadcasts over more than the output features", match["bias"])
    if n is not None and b.size not in (1, n):
        return pat.fail(f"bias has {b.size} elements, the layer has {n} output features", match["bias"])
    return None


GROUPS = {"matmul_add": [MatMulAdd(), GemmAdd()]}
