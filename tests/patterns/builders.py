"""Small onnx.helper graph builders for pattern tests: one op per call, fresh names, scalar constants."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qcompiler.onnx_io import model_from_proto
from tests.helpers import make_model, run, tinfo


class Builder:
    """`b.op("Mul", x, b.const(0.5))` appends a node and returns its output name."""

    def __init__(self, shape=(2, 8), opset=17):
        self.shape, self.opset = list(shape), opset
        self.nodes, self.inits, self.outputs = [], [], []
        self.inputs = [tinfo("x", self.shape)]
        self._n = 0

    def const(self, value, name=None, as_node=False):
        arr = np.asarray(value, dtype=np.float32) if not isinstance(value, np.ndarray) else value
        self._n += 1
        name = name or f"c{self._n}"
        if as_node:
            self.nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(arr, name)))
        else:
            self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def input(self, name, shape=None):
        self.inputs.append(tinfo(name, list(shape or self.shape)))
        return name

    def op(self, op_type, *inputs, name=None, n_out=1, **attrs):
        self._n += 1
        name = name or f"{op_type.lower()}_{self._n}"
        outs = [f"{name}_out{i}" if n_out > 1 else f"{name}_out" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def output(self, name, shape=None):
        self.outputs.append(tinfo(name, list(shape or self.shape)))
        return name

    def proto(self):
        return make_model(self.nodes, self.inputs, self.outputs, self.inits, opset=self.opset)

    def graph(self):
        p = self.proto()
        onnx.checker.check_model(p, full_check=True)
        return model_from_proto(p).graph

    def run(self, feeds):
        return run(self.proto(), feeds)


def layernorm(b, x, eps=1e-5, form="pow", affine=True, dup_sub=False, reciprocal=False, commute=False,
              eps_after_sqrt=False, hidden=8):
    """y = LN(x) written as an exporter would; returns (output, named nodes dict)."""
    mean = b.op("ReduceMean", x, axes=[-1], keepdims=1, name="mean")
    if form == "moments":
        sq = b.op("Mul", x, x, name="x_sq")
        msq = b.op("ReduceMean", sq, axes=[-1], keepdims=1, name="mean_sq")
        m2 = b.op("Mul", mean, mean, name="mean_mean")
        var = b.op("Sub", msq, m2, name="var")
        ve = b.op("Add", b.const(eps), var, name="add_eps") if commute else b.op("Add", var, b.const(eps), name="add_eps")
        inv = b.op("Reciprocal", b.op("Sqrt", ve, name="sqrt"), name="inv")
        d = b.op("Sub", x, mean, name="center")
        n = b.op("Mul", inv, d, name="norm") if commute else b.op("Mul", d, inv, name="norm")
    else:
        d = b.op("Sub", x, mean, name="center")
        sq = b.op("Pow", d, b.const(2.0), name="pow")
        var = b.op("ReduceMean", sq, axes=[-1], keepdims=1, name="var")
        if eps_after_sqrt:
            s = b.op("Add", b.op("Sqrt", var, name="sqrt"), b.const(eps), name="add_eps")
        else:
            ve = b.op("Add", b.const(eps), var, name="add_eps") if commute else b.op("Add", var, b.const(eps), name="add_eps")
            s = b.op("Sqrt", ve, name="sqrt")
        num = b.op("Sub", x, mean, name="center2") if dup_sub else d
        if reciprocal:
            n = b.op("Mul", num, b.op("Reciprocal", s, name="inv"), name="norm")
        else:
            n = b.op("Div", num, s, name="norm")
    if not affine:
        return n
    gamma = b.const(np.linspace(0.5, 1.5, hidden).astype(np.float32), "gamma")
    beta = b.const(np.linspace(-0.1, 0.1, hidden).astype(np.float32), "beta")
    y = b.op("Mul", gamma, n, name="scale") if commute else b.op("Mul", n, gamma, name="scale")
    return b.op("Add", beta, y, name="shift") if commute else b.op("Add", y, beta, name="shift")


def gelu_erf(b, x, half=0.5, order="outer", use_mul_inv=False, commute=False, sqrt2=np.sqrt(2.0)):
    """0.5·x·(1+erf(x/√2)) with the 0.5 applied 'outer' ((x·g)·0.5), 'gate' (x·(g·0.5)) or 'first' ((0.5·x)·g)."""
    if use_mul_inv:
        s = b.op("Mul", x, b.const(1 / sqrt2), name="scale")
    else:
        s = b.op("Div", x, b.const(sqrt2), name="scale")
    e = b.op("Erf", s, name="erf")
    g = b.op("Add", b.const(1.0), e, name="add1") if commute else b.op("Add", e, b.const(1.0), name="add1")
    h = b.const(half)
    if order == "outer":
        m = b.op("Mul", g, x, name="mul_x") if commute else b.op("Mul", x, g, name="mul_x")
        return b.op("Mul", h, m, name="mul_half") if commute else b.op("Mul", m, h, name="mul_half")
    if order == "gate":
        gh = b.op("Mul", g, h, name="mul_half")
        return b.op("Mul", gh, x, name="mul_x") if commute else b.op("Mul", x, gh, name="mul_x")
    hx = b.op("Mul", h, x, name="mul_half")
    return b.op("Mul", g, hx, name="mul_x") if commute else b.op("Mul", hx, g, name="mul_x")


def gelu_tanh(b, x, coeff=0.044715, cube="pow"):
    c = b.op("Pow", x, b.const(3.0), name="cube") if cube == "pow" else \
        b.op("Mul", b.op("Mul", x, x, name="sq"), x, name="cube")
    inner = b.op("Add", x, b.op("Mul", c, b.const(coeff), name="cubic"), name="inner")
    t = b.op("Tanh", b.op("Mul", b.const(np.sqrt(2 / np.pi)), inner, name="scale"), name="tanh")
    g = b.op("Add", t, b.const(1.0), name="add1")
    return b.op("Mul", b.op("Mul", x, b.const(0.5), name="mul_half"), g, name="mul_x")


def rmsnorm(b, x, eps=1e-6, square="mul", divide="div", weight=True, hidden=8):
    sq = b.op("Mul", x, x, name="sq") if square == "mul" else b.op("Pow", x, b.const(2.0), name="sq")
    ms = b.op("ReduceMean", sq, axes=[-1], keepdims=1, name="ms")
    r = b.op("Sqrt", b.op("Add", ms, b.const(eps), name="add_eps"), name="rms")
    n = b.op("Div", x, r, name="norm") if divide == "div" else b.op("Mul", b.op("Reciprocal", r, name="inv"), x, name="norm")
    if weight:
        return b.op("Mul", b.const(np.linspace(0.5, 1.5, hidden).astype(np.float32), "w"), n, name="apply_w")
    return n


def hardswish(b, x, form="div", clip_inputs=True, lo=0.0, hi=6.0, as_nodes=False):
    a = b.op("Add", x, b.const(3.0, as_node=as_nodes), name="add3")
    if clip_inputs:
        c = b.op("Clip", a, b.const(lo, as_node=as_nodes), b.const(hi, as_node=as_nodes), name="clip")
    else:
        c = b.op("Clip", a, name="clip", min=lo, max=hi)
    if form == "div":
        return b.op("Div", b.op("Mul", x, c, name="mul_x"), b.const(6.0, as_node=as_nodes), name="div6")
    if form == "mul":
        return b.op("Mul", b.op("Mul", c, x, name="mul_x"), b.const(1 / 6), name="div6")
    return b.op("Mul", x, b.op("Div", c, b.const(6.0), name="div6"), name="mul_x")
