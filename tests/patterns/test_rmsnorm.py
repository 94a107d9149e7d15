"""RMSNorm: Mul(x,x)|Pow(x,2) → ReduceMean → Add(ε) → Sqrt → Div | Reciprocal+Mul, optional weight."""
import numpy as np
import pytest

from qcompiler.patterns import explain, find_matches
from tests.patterns.builders import Builder, layernorm, rmsnorm

X = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)


@pytest.mark.parametrize("square", ["mul", "pow"])
@pytest.mark.parametrize("divide", ["div", "recip"])
@pytest.mark.parametrize("weight", [True, False])
def test_forms(square, divide, weight):
    b = Builder()
    b.output(rmsnorm(b, "x", square=square, divide=divide, weight=weight))
    (y,) = b.run({"x": X})
    ref = X / np.sqrt((X ** 2).mean(-1, keepdims=True) + 1e-6) * (np.linspace(0.5, 1.5, 8) if weight else 1)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
    ms = find_matches(b.graph(), "rmsnorm")
    assert [m.pattern for m in ms] == ["rmsnorm_weighted" if weight else "rmsnorm_plain"]
    assert "epsilon" in ms[0].constants and ms[0]["x"].name == "x"


def test_layernorm_tail_is_not_rmsnorm():
    b = Builder()
    b.output(layernorm(b, "x"))
    g = b.graph()
    assert find_matches(g, "rmsnorm") == []
    assert "tail of a LayerNorm" in explain(g, "rmsnorm", "norm")


def test_square_of_other_value_rejected():
    b = Builder()
    b.input("z")
    sq = b.op("Mul", "z", "z", name="sq")
    r = b.op("Sqrt", b.op("Add", b.op("ReduceMean", sq, axes=[-1], keepdims=1), b.const(1e-6)), name="rms")
    b.output(b.op("Div", "x", r, name="norm"))
    g = b.graph()
    assert find_matches(g, "rmsnorm") == []
    assert "'x'" in explain(g, "rmsnorm", "norm")


def test_fanout_rejected():
    b = Builder()
    b.output(rmsnorm(b, "x"))
    b.output("rms_out", [2, 1])
    assert find_matches(b.graph(), "rmsnorm") == []
