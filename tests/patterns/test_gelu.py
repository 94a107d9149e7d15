"""GELU patterns: erf form in every association/operand order, tanh form, wrong constants, fan-out, explain."""
import math

import numpy as np
import pytest

from qcompiler.patterns import explain, find_matches
from tests.patterns.builders import Builder, gelu_erf, gelu_tanh

X = np.linspace(-3, 3, 16, dtype=np.float32).reshape(2, 8)
ERF = np.vectorize(math.erf)


def _gelu_graph(**kw):
    b = Builder()
    y = gelu_erf(b, "x", **kw)
    b.output(y)
    return b


@pytest.mark.parametrize("order", ["outer", "gate", "first"])
@pytest.mark.parametrize("commute", [False, True])
@pytest.mark.parametrize("use_mul_inv", [False, True])
def test_gelu_erf_forms_match_and_compute_gelu(order, commute, use_mul_inv):
    b = _gelu_graph(order=order, commute=commute, use_mul_inv=use_mul_inv)
    (y,) = b.run({"x": X})
    np.testing.assert_allclose(y, 0.5 * X * (1 + ERF(X / math.sqrt(2))), rtol=1e-5, atol=1e-6)
    g = b.graph()
    ms = find_matches(g, "gelu")
    assert len(ms) == 1 and ms[0].pattern == "gelu_erf"
    m = ms[0]
    assert len(m.nodes) == 5 and [v.name for v in m.outputs] == [g.outputs[0].name]
    assert m["x"] is g.value("x") and m.inputs[0] is g.value("x")
    vals = sorted(round(float(v.const_value()), 4) for v in m.constants.values())
    assert 0.5 in vals and 1.0 in vals  # structural constants recorded for fold refusal


def test_gelu_tanh_forms():
    for cube in ("pow", "mul"):
        b = Builder()
        b.output(gelu_tanh(b, "x", cube=cube))
        (y,) = b.run({"x": X})
        ref = 0.5 * X * (1 + np.tanh(np.sqrt(2 / np.pi) * (X + 0.044715 * X ** 3)))
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
        ms = find_matches(b.graph(), "gelu")
        assert [m.pattern for m in ms] == ["gelu_tanh"]


def test_wrong_half_constant_is_rejected_and_explained():
    b = _gelu_graph(half=0.4)
    g = b.graph()
    assert find_matches(g, "gelu") == []
    msg = explain(g, "gelu", "mul_half")
    assert "gelu_erf" in msg and "0.5" in msg and "0.4" in msg


def test_wrong_sqrt2_and_tanh_coefficient_are_rejected():
    assert find_matches(_gelu_graph(sqrt2=1.5).graph(), "gelu") == []
    b = Builder()
    b.output(gelu_tanh(b, "x", coeff=0.05))
    g = b.graph()
    assert find_matches(g, "gelu") == []
    assert "cubic" in explain(g, "gelu_tanh", "mul_x")


def test_interior_fanout_rejected():
    b = Builder()
    y = gelu_erf(b, "x")
    b.output(y)
    b.output(b.op("Relu", "erf_out", name="spy"))  # an outside reader of the Erf output
    g = b.graph()
    assert find_matches(g, "gelu") == []
    msg = explain(g, "gelu", "mul_half")
    assert "exclusive use" in msg and "spy" in msg


def test_interior_graph_output_rejected():
    b = Builder()
    b.output(gelu_erf(b, "x"))
    b.output("add1_out")
    g = b.graph()
    assert find_matches(g, "gelu") == []
    assert "graph output" in explain(g, "gelu", "mul_half")


def test_shared_half_constant_across_many_gelus():
    b = Builder()
    h = b.const(0.5, "shared_half")
    x = "x"
    for i in range(3):
        s = b.op("Div", x, b.const(math.sqrt(2)))
        g = b.op("Add", b.op("Erf", s), b.const(1.0))
        x = b.op("Mul", b.op("Mul", x, g), h, name=f"gelu{i}")
    b.output(x)
    ms = find_matches(b.graph(), "gelu")
    assert [m.root.name for m in ms] == ["gelu0", "gelu1", "gelu2"]
    assert all(m.constants["half"].name == "shared_half" for m in ms)


def test_constant_nodes_count_as_constants():
    b = Builder()
    s = b.op("Div", "x", b.const(math.sqrt(2), as_node=True))
    g = b.op("Add", b.op("Erf", s), b.const(1.0, as_node=True))
    b.output(b.op("Mul", b.op("Mul", "x", g), b.const(0.5, as_node=True)))
    assert len(find_matches(b.graph(), "gelu_erf")) == 1


def test_structural_constants_lists_shared_half_once_with_all_readers():
    from qcompiler.patterns import structural_constants
    b = Builder()
    h = b.const(0.5, "shared_half")
    x = "x"
    for i in range(2):
        g = b.op("Add", b.op("Erf", b.op("Div", x, b.const(math.sqrt(2)))), b.const(1.0))
        x = b.op("Mul", b.op("Mul", x, g), h, name=f"gelu{i}")
    b.output(x)
    graph = b.graph()
    sc = structural_constants(graph)
    half = graph.value("shared_half")
    assert half in sc and [m.root.name for m in sc[half]] == ["gelu0", "gelu1"]
