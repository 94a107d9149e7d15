"""Pieces shared by the normalization patterns: a mean, a mean of squares and an inverse square root in every
spelling exporters emit, and the checks that make their constants real.

- mean:            ReduceMean(v) | ReduceSum(v)·(1/N) | ReduceSum(v)/N     (jax and tf2onnx write the last two)
- mean of squares: mean(Pow(v, 2) | Mul(v, v)) | ReduceSumSquare(v)·(1/N) | ReduceSumSquare(v)/N
- 1/√(s):          Reciprocal(Sqrt(s)) | Div(1, Sqrt(s)) | Pow(s, −0.5)   (tf2onnx turns Rsqrt into Sqrt+Reciprocal)
Reduction axes are an attribute (ReduceMean before opset 18, ReduceSum before 13) or an optional input.
Statistics reach their use through broadcast-only Reshape/Expand/Unsqueeze (`op.Bcast`).

Each statistic is named by a tag: its reduction node is bound as `tag` (ReduceMean), `tag_sum` (ReduceSum) or
`tag_sumsq` (ReduceSumSquare), and the constant N or 1/N as `<reduction>_n` / `<reduction>_inv_n`;
`check_stats` reads them.
"""
from __future__ import annotations

import numpy as np
from qcompiler.patterns.dsl import BROADCAST_OPS

EPS_MAX = 0.1  # an epsilon above this is a different formula, not a guard against division by zero
REDUCE_OPS = ("ReduceMean", "ReduceSum", "ReduceSumSquare")


def reduce_axes(node):
    """Axes of a Reduce* node from its attribute (opset < 18) or its second input (opset ≥ 18); None = all."""
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        arr = node.inputs[1].const_value()
        return "dynamic" if arr is None else tuple(int(a) for a in np.ravel(arr))
    a = node.attr("axes")
    return None if a is None else tuple(int(v) for v in a)


def _sum_scaled(op, reduced, tag):
    """reduced·(1/N) or reduced/N (`tag` names the reduction), the constant bound as tag_inv_n / tag_n."""
    return op.Or(op.Mul(reduced, op.Scalar(f"{tag}_inv_n"), _name=f"{tag}_scale"),
                 op.Div(reduced, op.Scalar(f"{tag}_n"), _name=f"{tag}_div"))


def mean_of(op, v, tag, name=None):
    """E[v] over some axes, in the three spellings; `name` binds the resulting value (shared statistics)."""
    return op.Or(op.ReduceMean(v, op.Optional(op.Var(f"{tag}_axes")), _name=tag),
                 _sum_scaled(op, op.ReduceSum(v, op.Optional(op.Var(f"{tag}_sum_axes")), _name=f"{tag}_sum"),
                             f"{tag}_sum"),
                 name=name)


def square(op, v, tag):
    """v² as Pow(v, 2) or Mul(v, v)."""
    return op.Or(op.Pow(v, op.Const(2.0, name=f"{tag}_two"), _name=f"{tag}_pow"),
                 op.Mul(v, v, _name=f"{tag}_mul"))


def mean_of_squares(op, v, tag):
    """E[v²]: the mean of a square, or ReduceSumSquare scaled by 1/N."""
    sumsq = op.ReduceSumSquare(v, op.Optional(op.Var(f"{tag}_sumsq_axes")), _name=f"{tag}_sumsq")
    return op.Or(mean_of(op, square(op, v, f"{tag}_sq"), tag), _sum_scaled(op, sumsq, f"{tag}_sumsq"))


def inverse_sqrt(op, s, std):
    """1/√s given the pattern value `std` = Sqrt(s): Reciprocal, Div(1, ·) or Pow(s, −0.5); bound as inv_std."""
    return op.Or(op.Reciprocal(std, _name="inv_std"),
                 op.Div(op.Const(1.0, name="one"), std, _name="inv_std_div"),
                 op.Pow(s, op.Const(-0.5, name="minus_half"), _name="inv_std_pow"))


def reduction(match, tag):
    """The reduction node of statistic `tag` in a match, or None."""
    for suffix in ("", "_sum", "_sumsq"):
        n = match.get(tag + suffix)
        if n is not None and getattr(n, "op_type", None) in REDUCE_OPS:
            return n
    return None


def _reduced_count(node, axes):
    """Elements reduced per output element when the input's dims on `axes` are known ints, else None."""
    shape = node.inputs[0].shape if node.inputs and node.inputs[0] is not None else None
    if shape is None:
        return None
    rank = len(shape)
    picked = range(rank) if axes is None else [a + rank if a < 0 else a for a in axes]
    n = 1
    for a in picked:
        if not 0 <= a < rank or not isinstance(shape[a], int) or shape[a] <= 0:
            return None
        n *= shape[a]
    return n


def check_stats(pattern, match, tags):
    """Common checks of the statistics `tags` (bound in `match`): constant axes, the same axes everywhere,
    kept dims (or a broadcast in the match to put them back), 1/N or N matching the reduced size (or, when the
    size is unknown, N a positive whole number). Returns (axes, failure or None)."""
    axes, first = None, None
    has_broadcast = any(n.op_type in BROADCAST_OPS for n in match.members)
    for tag in tags:
        n = reduction(match, tag)
        if n is None:
            continue
        a = reduce_axes(n)
        if a == "dynamic":
            return None, pattern.fail("reduction axes are not constant", n)
        if a is not None:
            a = tuple(sorted(a))
        if first is None:
            axes, first = a, n
        elif a != axes and not _same_axes(first, axes, n, a):
            return None, pattern.fail(f"'{first.name}' reduces axes {axes} but '{n.name}' reduces {a}", n)
        if n.attr("keepdims", 1) == 0 and not has_broadcast:
            return None, pattern.fail(f"'{n.name}' has keepdims=0 and nothing broadcasts it back", n)
        if n.op_type == "ReduceMean":
            continue
        key = n.op_type == "ReduceSum" and f"{tag}_sum" or f"{tag}_sumsq"
        inv, cnt = match.const(f"{key}_inv_n"), match.const(f"{key}_n")
        c = float(np.ravel(inv if inv is not None else cnt)[0])
        if inv is not None:
            if not c > 0:
                return None, pattern.fail(f"the mean's scale {c:g} is not positive", match[f"{key}_inv_n"])
            c = 1.0 / c
        want = _reduced_count(n, a)
        culprit = match[f"{key}_inv_n"] if inv is not None else match[f"{key}_n"]
        if want is not None:
            if abs(c - want) > 1e-3 * want:
                return None, pattern.fail(f"'{n.name}' sums {want} elements but the mean divides by {c:g}", culprit)
        elif not (c >= 1 and abs(c - round(c)) <= 1e-3 * c):
            return None, pattern.fail(f"the mean divides by {c:g}, not a count of elements", culprit)
    why = _check_broadcasts(pattern, match, axes)
    return axes, why


def _check_broadcasts(pattern, match, axes):
    """Each skipped Reshape/Unsqueeze must leave the statistic with size 1 on the reduced axes, counted from the
    end as broadcasting aligns them against x (a [4,1] mean reshaped to [1,4] would subtract row means from
    columns). Checked where x's rank and the shape op's output shape are known."""
    x = match.get("x")
    xs = x.shape if x is not None else None
    if xs is None:
        return None
    rank = len(xs)
    reduced = set(range(rank)) if axes is None else {a % rank for a in axes if -rank <= a < rank}
    for n in match.members:
        if n.op_type not in ("Reshape", "Unsqueeze") or n.outputs[0] is None or n.inputs[0].is_constant():
            continue  # a reshaped γ or β is a parameter, not a statistic
        out = n.outputs[0].shape
        if out is None or len(out) > rank:
            continue
        for k, d in enumerate(out):
            pos = rank - len(out) + k
            if pos in reduced and d != 1:
                return pattern.fail(f"'{n.name}' gives the statistic shape {list(out)}: dim {pos} is reduced but "
                                    f"has size {d}, so it does not broadcast back over the reduced axes", n)
    return None


def _same_axes(n1, a1, n2, a2) -> bool:
    """Axes written differently (−1 vs rank−1) but equal on inputs of known, equal rank."""
    s1 = n1.inputs[0].shape if n1.inputs[0] is not None else None
    s2 = n2.inputs[0].shape if n2.inputs[0] is not None else None
    if s1 is None or s2 is None or len(s1) != len(s2) or a1 is None or a2 is None:
        return False
    r = len(s1)
    return sorted(x % r for x in a1) == sorted(x % r for x in a2)


def check_epsilon(pattern, match, name="epsilon"):
    """ε is a small positive scalar."""
    eps = float(np.ravel(match.const(name))[0])
    if not eps > 0:
        return pattern.fail(f"epsilon {eps} is not positive", match[name])
    if eps > EPS_MAX:
        return pattern.fail(f"epsilon {eps:g} is not small (> {EPS_MAX:g})", match[name])
    return None
