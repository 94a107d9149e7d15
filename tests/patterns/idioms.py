"""Normalizations and activations as each exporter writes them (tf2onnx, Paddle2ONNX, torch legacy/dynamo,
jax2onnx), built with onnx.helper on a `Builder`. Every builder returns the output name; node names are fixed
so tests can check which nodes a match took."""
from __future__ import annotations

import numpy as np

INV_SQRT2 = 1 / np.sqrt(2.0)


def _axes(b, node_op, axes):
    """(extra inputs, attrs) for a reduction over `axes`: an input from the op's opset that moved it there."""
    moved = {"ReduceSum": 13, "ReduceMean": 18, "ReduceSumSquare": 18}[node_op]
    if b.opset >= moved:
        return [b.const(np.asarray(axes, np.int64))], {}
    return [], {"axes": list(axes)}


def reduce(b, op, v, name, axes=(-1,), keepdims=1):
    extra, attrs = _axes(b, op, axes)
    return b.op(op, v, *extra, name=name, keepdims=keepdims, **attrs)


def mean(b, v, form, tag, n, axes=(-1,), keepdims=1, scale=None):
    """E[v] as 'reducemean', 'sum_mul' (ReduceSum·(1/N)) or 'sum_div' (ReduceSum/N); `scale` overrides 1/N."""
    if form == "reducemean":
        return reduce(b, "ReduceMean", v, tag, axes, keepdims)
    s = reduce(b, "ReduceSum", v, tag + "_sum", axes, keepdims)
    if form == "sum_mul":
        return b.op("Mul", s, b.const(1.0 / n if scale is None else scale), name=tag + "_scale")
    return b.op("Div", s, b.const(float(n) if scale is None else 1.0 / scale), name=tag + "_div")


def mean_sq(b, v, mean_form, square, tag, n, axes=(-1,), keepdims=1, exponent=2.0):
    """E[v²] with the square as 'pow', 'mul' or 'sumsq' (ReduceSumSquare·(1/N))."""
    if square == "sumsq":
        s = reduce(b, "ReduceSumSquare", v, tag + "_sumsq", axes, keepdims)
        return b.op("Mul", s, b.const(1.0 / n), name=tag + "_scale")
    sq = b.op("Pow", v, b.const(exponent), name=tag + "_sq") if square == "pow" else \
        b.op("Mul", v, v, name=tag + "_sq")
    return mean(b, sq, mean_form, tag, n, axes, keepdims)


def broadcast(b, v, how, shape):
    """A broadcast-only shape op between a statistic and its use ('reshape', 'expand', 'unsqueeze' or None)."""
    if how is None:
        return v
    if how == "reshape":
        return b.op("Reshape", v, b.const(np.asarray(shape[:-1] + [1], np.int64)), name=f"bc_reshape_{b._n}")
    if how == "expand":
        return b.op("Expand", v, b.const(np.asarray(shape, np.int64)), name=f"bc_expand_{b._n}")
    if how == "unsqueeze":
        if b.opset >= 13:
            return b.op("Unsqueeze", v, b.const(np.asarray([-1], np.int64)), name=f"bc_unsq_{b._n}")
        return b.op("Unsqueeze", v, name=f"bc_unsq_{b._n}", axes=[-1])
    raise ValueError(how)


def rsqrt(b, ve, form, name="inv"):
    """1/√ve as 'reciprocal' (Sqrt→Reciprocal), 'div_one' (Sqrt→Div(1, ·)) or 'pow' (Pow −0.5)."""
    if form == "pow":
        return b.op("Pow", ve, b.const(-0.5), name=name)
    s = b.op("Sqrt", ve, name="std")
    if form == "reciprocal":
        return b.op("Reciprocal", s, name=name)
    return b.op("Div", b.const(1.0), s, name=name)


def layernorm(b, x, *, mean_form="reducemean", square="pow", variance="centered", clamp=None, inv="div",
              affine="plain", bcast=None, keepdims=1, eps=1e-5, hidden=None, scale=None):
    """LayerNorm over the last axis of b.shape. variance: 'centered' E[(x−μ)²] or 'moments' E[x²]−E[x]²;
    clamp: None, 'max' (Max(·, 0)) or 'relu'; inv: 'div' (d / Sqrt), 'reciprocal', 'div_one' or 'pow';
    affine: 'plain' (·γ+β), 'none', 'flax' ((x−μ)·(r·γ)+β) or 'keras' (x·(r·γ) + (β − μ·r·γ),
    tf2onnx);
    bcast: shape op between each statistic and its use (needs keepdims=0 for 'unsqueeze')."""
    shape = list(b.shape)
    n = hidden or shape[-1]
    mu = mean(b, x, mean_form, "mean", n, keepdims=keepdims, scale=scale)
    mu_b = broadcast(b, mu, bcast, shape)
    if variance == "centered":
        d = b.op("Sub", x, mu_b, name="center")
        var = mean_sq(b, d, mean_form, square, "var", n, keepdims=keepdims)
    else:
        msq = mean_sq(b, x, mean_form, square, "msq", n, keepdims=keepdims)
        var = b.op("Sub", msq, b.op("Mul", mu, mu, name="mean_sq"), name="var_raw")
        if clamp == "max":
            var = b.op("Max", var, b.const(0.0), name="clamp")
        elif clamp == "relu":
            var = b.op("Relu", var, name="clamp")
        d = None
    ve = b.op("Add", var, b.const(eps), name="add_eps")
    gamma = b.const(np.linspace(0.5, 1.5, n).astype(np.float32), "gamma")
    beta = b.const(np.linspace(-0.1, 0.1, n).astype(np.float32), "beta")
    if affine in ("flax", "keras"):
        r = b.op("Mul", broadcast(b, rsqrt(b, ve, "reciprocal" if inv == "div" else inv), bcast, shape), gamma,
                 name="fold")
        if affine == "keras":
            xr = b.op("Mul", x, r, name="x_r")
            return b.op("Add", xr, b.op("Sub", beta, b.op("Mul", mu_b, r, name="mu_r"), name="beta_mu"), name="out")
        if d is None:
            d = b.op("Sub", x, mu_b, name="center")
        return b.op("Add", b.op("Mul", d, r, name="norm"), beta, name="out")
    if d is None:
        d = b.op("Sub", x, mu_b, name="center")
    if inv == "div":
        normed = b.op("Div", d, broadcast(b, b.op("Sqrt", ve, name="std"), bcast, shape), name="norm")
    else:
        normed = b.op("Mul", d, broadcast(b, rsqrt(b, ve, inv), bcast, shape), name="norm")
    if affine == "none":
        return normed
    return b.op("Add", b.op("Mul", normed, gamma, name="scale"), beta, name="out")


def tf2onnx_layernorm(b, x, eps=1e-3):
    """The issue's idiom (a flax/Keras LayerNorm through jax2tf and tf2onnx): ReduceSum·(1/N) means, Mul(x, x),
    Var = Max(E[x²]−E[x]², 0), Reshape/Expand broadcasts, Sqrt+Reciprocal, γ folded before the centring Sub."""
    shape = list(b.shape)
    n = shape[-1]
    s = reduce(b, "ReduceSum", x, "sum_x", keepdims=0)
    mu = b.op("Mul", s, b.const(np.float32(1.0 / n)), name="mean")
    sq = b.op("Mul", x, x, name="x_sq")
    msq = b.op("Mul", reduce(b, "ReduceSum", sq, "sum_sq", keepdims=0), b.const(np.float32(1.0 / n)), name="msq")
    var = b.op("Max", b.op("Sub", msq, b.op("Mul", mu, mu, name="mu_sq"), name="var_raw"), b.const(0.0),
               name="var")
    inv = b.op("Reciprocal", b.op("Sqrt", b.op("Add", var, b.const(eps), name="add_eps"), name="std"), name="inv")
    inv_b = b.op("Reshape", inv, b.const(np.asarray(shape[:-1] + [1], np.int64)), name="inv_reshape")
    r = b.op("Mul", inv_b, b.const(np.linspace(0.5, 1.5, n).astype(np.float32), "gamma"), name="fold")
    mu_b = b.op("Expand", b.op("Reshape", mu, b.const(np.asarray(shape[:-1] + [1], np.int64)), name="mu_reshape"),
                b.const(np.asarray(shape, np.int64)), name="mu_expand")
    shift = b.op("Sub", b.const(np.linspace(-0.1, 0.1, n).astype(np.float32), "beta"),
                 b.op("Mul", mu_b, r, name="mu_r"), name="shift")
    return b.op("Add", b.op("Mul", x, r, name="x_r"), shift, name="out")


def rmsnorm(b, x, *, mean_form="reducemean", square="mul", inv="div", weight=True, bcast=None, eps=1e-6,
            exponent=2.0):
    shape = list(b.shape)
    n = shape[-1]
    ms = mean_sq(b, x, mean_form, square, "ms", n, exponent=exponent)
    ve = b.op("Add", ms, b.const(eps), name="add_eps")
    if inv == "div":
        normed = b.op("Div", x, broadcast(b, b.op("Sqrt", ve, name="rms"), bcast, shape), name="norm")
    else:
        normed = b.op("Mul", x, broadcast(b, rsqrt(b, ve, inv), bcast, shape), name="norm")
    if not weight:
        return normed
    return b.op("Mul", b.const(np.linspace(0.5, 1.5, n).astype(np.float32), "w"), normed, name="out")


def gelu(b, x, form="erf_div", half="mul"):
    """'erf_div' x·(erf(x/√2)+1) then ·0.5 or /2 (jax), 'erf_mul' (x·1/√2), 'tanh_pow', 'tanh_cube' (x·(x·x)),
    'tanh_fast' (√(2/π)·x·(1 + 0.044715·x·x), HF FastGELU)."""
    if form.startswith("erf"):
        s = b.op("Div", x, b.const(np.sqrt(2.0)), name="scale") if form == "erf_div" else \
            b.op("Mul", x, b.const(INV_SQRT2), name="scale")
        g = b.op("Add", b.op("Erf", s, name="erf"), b.const(1.0), name="add1")
    else:
        if form == "tanh_fast":
            inner = b.op("Mul", x, b.op("Add", b.const(1.0), b.op("Mul", b.const(0.044715),
                                                                   b.op("Mul", x, x, name="sq"), name="cubic"),
                                        name="poly"), name="inner")
        else:
            c = b.op("Pow", x, b.const(3.0), name="cube") if form == "tanh_pow" else \
                b.op("Mul", x, b.op("Mul", x, x, name="sq"), name="cube")
            inner = b.op("Add", x, b.op("Mul", b.const(0.044715), c, name="cubic"), name="inner")
        t = b.op("Tanh", b.op("Mul", inner, b.const(np.sqrt(2 / np.pi)), name="scale"), name="tanh")
        g = b.op("Add", t, b.const(1.0), name="add1")
    xg = b.op("Mul", x, g, name="mul_x")
    if half == "div":
        return b.op("Div", xg, b.const(2.0), name="out")
    return b.op("Mul", xg, b.const(0.5), name="out")


def silu(b, x, form="plain", beta=1.0):
    if form == "plain":
        return b.op("Mul", x, b.op("Sigmoid", x, name="sig"), name="out")
    return b.op("Mul", x, b.op("Sigmoid", b.op("Mul", x, b.const(beta), name="beta_x"), name="sig"), name="out")


def hardswish(b, x, relu6="clip", six="div", lo=0.0, hi=6.0, shift=3.0):
    """x·Relu6(x+3)/6 with Relu6 as 'clip', 'minmax' (Min(Max(·, 0), 6)), 'maxmin' or 'relu_min'; six: 'div'
    or 'mul' (·1/6)."""
    a = b.op("Add", x, b.const(shift), name="add3")
    if relu6 == "clip":
        c = b.op("Clip", a, b.const(lo), b.const(hi), name="relu6")
    elif relu6 == "minmax":
        c = b.op("Min", b.op("Max", a, b.const(lo), name="lo"), b.const(hi), name="relu6")
    elif relu6 == "maxmin":
        c = b.op("Max", b.op("Min", a, b.const(hi), name="hi"), b.const(lo), name="relu6")
    else:
        c = b.op("Min", b.op("Relu", a, name="lo"), b.const(hi), name="relu6")
    xc = b.op("Mul", x, c, name="mul_x")
    if six == "div":
        return b.op("Div", xc, b.const(6.0), name="out")
    return b.op("Mul", xc, b.const(1 / 6), name="out")
