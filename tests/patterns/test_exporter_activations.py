"""GELU, SiLU/Swish, HardSwish and Softmax-with-mask in each exporter's idioms; near misses not.
Positive cases check the float function, the nodes taken, and that quantizing leaves no quantizer inside."""
from __future__ import annotations

import math

import numpy as np
import pytest

from qcompiler.patterns import explain, find_matches
from tests.patterns import idioms
from tests.patterns.builders import Builder
from tests.patterns.test_exporter_idioms import SHAPE, _match_one, _quantize_check, _samples

ERF = np.vectorize(math.erf)


def _gelu(x):
    return 0.5 * x * (1 + ERF(x / math.sqrt(2)))


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def _hardswish(x):
    return x * np.clip(x + 3, 0, 6) / 6


GELU_CASES = [("erf_div", "mul", "gelu_erf"), ("erf_div", "div", "gelu_erf"), ("erf_mul", "div", "gelu_erf"),
              ("tanh_pow", "div", "gelu_tanh"), ("tanh_cube", "mul", "gelu_tanh"), ("tanh_fast", "mul", "gelu_tanh"),
              ("tanh_fast", "div", "gelu_tanh")]


@pytest.mark.parametrize("form,half,variant", GELU_CASES)
def test_gelu_idiom_matches_and_quantizes(form, half, variant):
    b = Builder(SHAPE, opset=13)
    b.output(idioms.gelu(b, "x", form, half))
    x = _samples(1)[0]["x"]
    (y,) = b.run({"x": x})
    ref = _gelu(x) if form.startswith("erf") else _gelu_tanh(x)
    np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4)
    g, m = _match_one(b, "gelu")
    assert m.pattern == variant and m.root.name == "out" and len(m.nodes) == len(g.nodes)
    assert "half" in m.constants or "two" in m.constants
    _quantize_check(b.proto(), m)


@pytest.mark.parametrize("build,why", [
    (lambda b: b.op("Mul", b.op("Mul", "x", b.op("Add", b.op("Erf", b.op("Div", "x", b.const(1.5))), b.const(1.0))),
                    b.const(0.5), name="bad"), "expected 1.41421"),
    (lambda b: b.op("Div", b.op("Mul", "x", b.op("Add", b.op("Erf", b.op("Div", "x", b.const(math.sqrt(2)))),
                                                  b.const(1.0))), b.const(3.0), name="bad"), "expected 2"),
    (lambda b: b.op("Mul", b.op("Mul", "x", b.op("Add", b.op("Tanh", b.op("Mul", b.const(math.sqrt(2 / math.pi)), b.op(
        "Add", "x", b.op("Mul", b.op("Pow", "x", b.const(2.0)), b.const(0.044715))))), b.const(1.0))), b.const(0.5),
        name="bad"), "expected 3"),
])
def test_gelu_wrong_constant_refused(build, why):
    b = Builder(SHAPE, opset=13)
    out = build(b)
    b.output(out)
    g = b.graph()
    assert not [m for m in find_matches(g, "gelu") if m.root.name == "bad"]
    assert why in explain(g, "gelu", "bad")


def test_gelu_escaping_erf_refused():
    b = Builder(SHAPE, opset=13)
    b.output(idioms.gelu(b, "x", "erf_div", "div"))
    b.output("erf_out")
    g = b.graph()
    assert find_matches(g, "gelu") == []
    assert "graph output" in explain(g, "gelu", "out")


# --------------------------------------------------------------------------------------------------- SiLU
@pytest.mark.parametrize("form", ["plain", "beta"])
def test_silu_idiom_matches_and_quantizes(form):
    b = Builder(SHAPE, opset=13)
    b.output(idioms.silu(b, "x", form))
    x = _samples(1)[0]["x"]
    np.testing.assert_allclose(b.run({"x": x})[0], x / (1 + np.exp(-x)), rtol=1e-5, atol=1e-5)
    g, m = _match_one(b, "silu")
    assert len(m.nodes) == len(g.nodes)
    _quantize_check(b.proto(), m)


def test_swish_with_beta_not_one_is_not_silu():
    b = Builder(SHAPE, opset=13)
    b.output(idioms.silu(b, "x", "beta", beta=1.702))  # x·σ(1.702x): the sigmoid GELU approximation
    g = b.graph()
    assert find_matches(g, "silu") == []
    assert "expected 1" in explain(g, "silu", "out")


# ---------------------------------------------------------------------------------------------- HardSwish
@pytest.mark.parametrize("relu6,six", [("clip", "div"), ("clip", "mul"), ("minmax", "div"), ("maxmin", "mul"),
                                       ("relu_min", "div")])
def test_hardswish_idiom_matches_and_quantizes(relu6, six):
    b = Builder(SHAPE, opset=13)
    b.output(idioms.hardswish(b, "x", relu6, six))
    x = 3 * _samples(1)[0]["x"]
    np.testing.assert_allclose(b.run({"x": x})[0], _hardswish(x), rtol=1e-5, atol=1e-5)
    g, m = _match_one(b, "hardswish")
    assert m.pattern == "hardswish_clip" and len(m.nodes) == len(g.nodes)
    _quantize_check(b.proto(), m)


@pytest.mark.parametrize("kw,why", [
    ({"relu6": "minmax", "hi": 4.0}, "expected 6"), ({"relu6": "clip", "hi": 8.0}, "HardSwish needs (0, 6)"),
    ({"relu6": "relu_min", "shift": 2.0}, "expected 3"),
])
def test_hardswish_near_miss_refused(kw, why):
    b = Builder(SHAPE, opset=13)
    b.output(idioms.hardswish(b, "x", **kw))
    g = b.graph()
    assert find_matches(g, "hardswish") == []
    assert why in explain(g, "hardswish", "out")


# ------------------------------------------------------------------------------------- Softmax with a mask
def _attention_scores(b, mask_form):
    s = b.op("MatMul", "x", b.const(np.random.default_rng(0).normal(0, 0.3, (16, 16)).astype(np.float32)),
             name="scores")
    if mask_form == "const":
        causal = np.triu(np.full((4, 16), -1e9, np.float32), 1)
        return b.op("Softmax", b.op("Add", s, b.const(causal), name="add_mask"), name="out", axis=-1)
    if mask_form == "hf":  # (1 − m)·(−10000) from an input mask
        m = b.input("m")
        add = b.op("Mul", b.op("Sub", b.const(1.0), m, name="inv_m"), b.const(-10000.0), name="mask")
        return b.op("Softmax", b.op("Add", add, s, name="add_mask"), name="out", axis=-1)
    if mask_form == "where":
        m = b.op("Cast", b.input("m"), to=9, name="keep")
        return b.op("Softmax", b.op("Where", m, s, b.const(-np.inf), name="add_mask"), name="out", axis=-1)
    # an ordinary bias before the Softmax (relative positions): not a mask
    return b.op("Softmax", b.op("Add", s, b.const(np.full((4, 16), 0.5, np.float32)), name="add_mask"),
                name="out", axis=-1)


@pytest.mark.parametrize("mask_form,variant", [("const", "softmax_mask_add"), ("hf", "softmax_mask_add"),
                                               ("where", "softmax_mask_where")])
def test_softmax_with_mask_matches(mask_form, variant):
    b = Builder(SHAPE, opset=13)
    b.output(_attention_scores(b, mask_form))
    ms = find_matches(b.graph(), "softmax_mask")
    assert [(m.pattern, m.root.name) for m in ms] == [(variant, "out")]
    assert {n.name for n in ms[0].nodes} == {"add_mask", "out"}


def test_softmax_after_an_ordinary_bias_is_not_masked():
    b = Builder(SHAPE, opset=13)
    b.output(_attention_scores(b, "bias"))
    g = b.graph()
    assert find_matches(g, "softmax_mask") == []
    assert "not a large negative mask" in explain(g, "softmax_mask", "out")
