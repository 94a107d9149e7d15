"""MatMul/Gemm followed by a bias Add: a linear layer split by the exporter (→ Gemm, or one quantized unit).

Weight and bias must be constants (initializers or Constant nodes); the bias must broadcast along the output
features only (size N or 1), else the Add is a residual or a mask, not a bias.
"""
from __future__ import annotations

from qcompiler.patterns.pattern import Pattern


def _const_shape(value):
    """Dims of a constant without decoding it when it is an initializer."""
    if value.tensor is not None:
        return tuple(value.tensor.dims)
    arr = value.const_value()
    return None if arr is None else arr.shape


def _out_features(weight, trans: bool):
    shape = _const_shape(weight)
    if not shape:
        return None
    return shape[0] if trans and len(shape) == 2 else shape[-1]


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
    shape = _const_shape(match["bias"])
    size = 1
    for d in shape:
        size *= d
    if len(shape) > 1 and any(d != 1 for d in shape[:-1]):
        return pat.fail(f"bias shape {list(shape)} broadcasts over more than the output features", match["bias"])
    if n is not None and size not in (1, n):
        return pat.fail(f"bias has {size} elements, the layer has {n} output features", match["bias"])
    return None


GROUPS = {"matmul_add": [MatMulAdd(), GemmAdd()]}
