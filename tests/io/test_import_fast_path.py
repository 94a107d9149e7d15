"""The importer links inputs while it reads nodes, until the first name not yet defined; uses must still come
out in node order, input-slot order, and an unsorted file must still be sorted on import."""
from __future__ import annotations

import numpy as np
from onnx import helper

from qcompiler import model_from_proto, verify
from tests.helpers import make_model, run, tinfo


def test_linking_stops_mid_node_and_resumes_in_order():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="A"),
             helper.make_node("Add", ["a", "c"], ["b"], name="B"),     # 'c' is defined later: linking stops here
             helper.make_node("Neg", ["x"], ["c"], name="C"),
             helper.make_node("Mul", ["a", "b"], ["y"], name="D")]
    proto = make_model(nodes, [tinfo("x", [3])], [tinfo("y", [3])])
    m = model_from_proto(proto)
    g = m.graph
    verify(g)
    name = lambda us: [(u.user.name, u.index) for u in us]  # noqa: E731
    assert name(g.value("x").uses()) == [("A", 0), ("C", 0)]
    assert name(g.value("a").uses()) == [("B", 0), ("D", 0)]
    assert [n.name for n in g.nodes] == ["A", "C", "B", "D"]   # sorted on import
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    np.testing.assert_allclose(run(m, {"x": x})[0], run(proto, {"x": x})[0])
