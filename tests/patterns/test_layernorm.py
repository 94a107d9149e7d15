"""LayerNorm decompositions: pow form (single and duplicated Sub, Div or Reciprocal), E[x²]−E[x]² form."""
import numpy as np
import pytest

from qcompiler.patterns import explain, find_matches
from tests.patterns.builders import Builder, layernorm

X = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)


def _ref(x, eps=1e-5):
    g, b = np.linspace(0.5, 1.5, 8), np.linspace(-0.1, 0.1, 8)
    m = x.mean(-1, keepdims=True)
    return (x - m) / np.sqrt(x.var(-1, keepdims=True) + eps) * g + b


@pytest.mark.parametrize("kw,variant", [
    ({}, "layernorm_pow"),
    ({"commute": True}, "layernorm_pow"),
    ({"reciprocal": True}, "layernorm_pow"),
    ({"dup_sub": True}, "layernorm_dupsub"),
    ({"form": "moments"}, "layernorm_moments"),
    ({"form": "moments", "commute": True}, "layernorm_moments"),
])
def test_forms_match_and_compute_layernorm(kw, variant):
    b = Builder()
    b.output(layernorm(b, "x", **kw))
    (y,) = b.run({"x": X})
    np.testing.assert_allclose(y, _ref(X), rtol=1e-4, atol=1e-4)
    ms = find_matches(b.graph(), "layernorm")
    assert [m.pattern for m in ms] == [variant]
    m = ms[0]
    assert m.root.name == "shift" and m.nodes[0].name == "mean"
    assert float(m.const("epsilon")) == pytest.approx(1e-5)
    assert "epsilon" in m.constants and "gamma" not in m.constants


def test_no_affine_variant():
    b = Builder()
    b.output(layernorm(b, "x", affine=False))
    ms = find_matches(b.graph(), "layernorm")
    assert [m.pattern for m in ms] == ["layernorm_pow_noaffine"] and ms[0].root.name == "norm"


def test_epsilon_after_sqrt_is_not_layernorm():
    b = Builder()
    b.output(layernorm(b, "x", eps_after_sqrt=True))
    g = b.graph()
    assert find_matches(g, "layernorm") == []
    msg = explain(g, "layernorm", "shift")
    assert "layernorm_pow" in msg and "step 'std'" in msg


def test_epsilon_must_be_a_positive_scalar():
    b = Builder()
    b.output(layernorm(b, "x", eps=np.full(8, 1e-5, np.float32)))
    g = b.graph()
    assert find_matches(g, "layernorm") == []
    assert "scalar" in explain(g, "layernorm", "shift")
    b = Builder()
    b.output(layernorm(b, "x", eps=-1e-5))
    g = b.graph()
    assert find_matches(g, "layernorm") == []
    assert "not positive" in explain(g, "layernorm", "shift")


def test_mismatched_axes_rejected():
    b = Builder()
    y = layernorm(b, "x")
    b.output(y)
    p = b.proto()
    for n in p.graph.node:
        if n.name == "var":
            n.attribute[0].ints[:] = [0]
    from qcompiler.onnx_io import model_from_proto
    g = model_from_proto(p).graph
    assert find_matches(g, "layernorm") == []
    assert "axes" in explain(g, "layernorm", "shift")


def test_fanout_of_centered_value_rejected():
    b = Builder()
    b.output(layernorm(b, "x"))
    b.output(b.op("Relu", "center_out", name="reader"))
    g = b.graph()
    assert find_matches(g, "layernorm") == []
    assert "reader" in explain(g, "layernorm", "shift")


def test_variance_as_graph_output_rejected():
    b = Builder()
    b.output(layernorm(b, "x"))
    b.output("var_out", [2, 1])
    g = b.graph()
    assert find_matches(g, "layernorm") == []


def test_two_layernorms_in_graph_order():
    b = Builder()
    y = layernorm(b, "x")
    y2 = b.op("Relu", y, name="mid")
    mean = b.op("ReduceMean", y2, axes=[-1], keepdims=1)
    d = b.op("Sub", y2, mean)
    v = b.op("ReduceMean", b.op("Pow", d, b.const(2.0)), axes=[-1], keepdims=1)
    n = b.op("Div", d, b.op("Sqrt", b.op("Add", v, b.const(1e-12))))
    b.output(b.op("Add", b.op("Mul", n, b.const(np.ones(8, np.float32))), b.const(np.zeros(8, np.float32)), name="ln2"))
    ms = find_matches(b.graph(), "layernorm")
    assert [m.root.name for m in ms] == ["shift", "ln2"]
