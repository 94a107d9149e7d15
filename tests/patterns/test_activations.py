"""SiLU, HardSwish (Clip bounds as inputs or attributes, Div 6 / Mul 1/6), HardSigmoid gates."""
import numpy as np
import pytest

from qcompiler.patterns import explain, find_matches
from tests.patterns.builders import Builder, hardswish

X = np.linspace(-5, 5, 16, dtype=np.float32).reshape(2, 8)
REF_HS = X * np.clip(X + 3, 0, 6) / 6


@pytest.mark.parametrize("form", ["div", "mul", "gate"])
@pytest.mark.parametrize("as_nodes", [False, True])
def test_hardswish_forms(form, as_nodes):
    b = Builder()
    b.output(hardswish(b, "x", form=form, as_nodes=as_nodes and form == "div"))
    (y,) = b.run({"x": X})
    np.testing.assert_allclose(y, REF_HS, rtol=1e-5, atol=1e-6)
    ms = find_matches(b.graph(), "hardswish")
    assert [m.pattern for m in ms] == ["hardswish_clip"]
    assert {"three", "clip_min", "clip_max"} <= set(ms[0].constants)


def test_hardswish_clip_attributes_opset10():
    b = Builder(opset=10)
    b.output(hardswish(b, "x", clip_inputs=False))
    (y,) = b.run({"x": X})
    np.testing.assert_allclose(y, REF_HS, rtol=1e-5, atol=1e-6)
    assert len(find_matches(b.graph(), "hardswish")) == 1
    b = Builder(opset=10)
    b.output(hardswish(b, "x", clip_inputs=False, hi=5.0))
    g = b.graph()
    assert find_matches(g, "hardswish") == []
    assert "(0, 5)" in explain(g, "hardswish", "div6")


def test_hardswish_wrong_bounds_or_divisor():
    b = Builder()
    b.output(hardswish(b, "x", lo=-1.0))
    g = b.graph()
    assert find_matches(g, "hardswish") == []
    assert "step 'check'" in explain(g, "hardswish", "div6")
    b = Builder()
    a = b.op("Add", "x", b.const(3.0))
    c = b.op("Clip", a, b.const(0.0), b.const(6.0))
    b.output(b.op("Div", b.op("Mul", "x", c), b.const(5.0), name="div5"))
    g = b.graph()
    assert find_matches(g, "hardswish") == []
    assert "div_six" in explain(g, "hardswish", "div5")


def test_hardswish_clip_fanout_rejected():
    b = Builder()
    b.output(hardswish(b, "x"))
    b.output(b.op("Neg", "clip_out", name="other"))
    g = b.graph()
    assert find_matches(g, "hardswish") == []
    assert "other" in explain(g, "hardswish", "div6")


def test_hardswish_as_hardsigmoid():
    b = Builder()
    b.output(b.op("Mul", b.op("HardSigmoid", "x", alpha=1 / 6, beta=0.5), "x"))
    (y,) = b.run({"x": X})
    np.testing.assert_allclose(y, REF_HS, rtol=1e-5, atol=1e-6)
    g = b.graph()
    assert [m.pattern for m in find_matches(g, "hardswish")] == ["hardswish_hardsigmoid"]
    assert find_matches(g, "hardsigmoid_gate") == []  # gating its own input is HardSwish


def test_hardsigmoid_gate():
    b = Builder()
    b.input("feat")
    gate = b.op("HardSigmoid", "x", name="hs", alpha=0.2, beta=0.5)
    b.output(b.op("Mul", "feat", gate, name="se_mul"))
    g = b.graph()
    ms = find_matches(g, "hardsigmoid_gate")
    assert len(ms) == 1 and ms[0]["gated"].name == "feat" and ms[0]["g"].name == "x"
    assert find_matches(g, "hardswish") == []


def test_hardsigmoid_gate_fanout_rejected():
    b = Builder()
    b.input("feat")
    gate = b.op("HardSigmoid", "x", name="hs")
    b.output(b.op("Mul", "feat", gate, name="se_mul"))
    b.output(gate)
    g = b.graph()
    assert find_matches(g, "hardsigmoid_gate") == []
    assert "graph output" in explain(g, "hardsigmoid_gate", "se_mul")


@pytest.mark.parametrize("commute", [False, True])
def test_silu(commute):
    b = Builder()
    s = b.op("Sigmoid", "x")
    b.output(b.op("Mul", s, "x") if commute else b.op("Mul", "x", s))
    (y,) = b.run({"x": X})
    np.testing.assert_allclose(y, X / (1 + np.exp(-X)), rtol=1e-5, atol=1e-6)
    assert len(find_matches(b.graph(), "silu")) == 1


def test_silu_of_other_tensor_rejected():
    b = Builder()
    b.input("z")
    b.output(b.op("Mul", "z", b.op("Sigmoid", "x"), name="m"))
    g = b.graph()
    assert find_matches(g, "silu") == []
    msg = explain(g, "silu", "m")
    assert "'x'" in msg and "elsewhere" in msg
