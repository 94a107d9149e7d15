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


def test_imported_nodes_and_values_have_every_slot_set():
    """The importer builds nodes without Node.__init__: every slot must still be set, to what __init__ sets
    unless the file says otherwise, and the model must survive a pass and run."""
    from qcompiler.ir.node import Node
    from qcompiler.ir.value import Value
    from qcompiler.passmanager import run_pipeline

    nodes = [helper.make_node("Relu", ["x"], ["a"], name="A"),
             helper.make_node("Add", ["a", "x"], ["b"], name="A"),          # duplicate node name: renamed
             helper.make_node("Neg", ["c"], ["y"], doc_string="neg"),      # forward reference, unnamed
             helper.make_node("LeakyRelu", ["b"], ["c"], alpha=0.25)]
    proto = make_model(nodes, [tinfo("x", [3])], [tinfo("y", [3])])
    m = model_from_proto(proto)
    fresh = Node("Relu")
    for n in m.graph.nodes:
        for slot in Node.__slots__:
            getattr(n, slot)   # AttributeError if the importer left it unset
        assert n.meta is None and n.graph is m.graph and n.overload == fresh.overload
    for v in m.graph._values.values():
        for slot in Value.__slots__:
            getattr(v, slot)
        if v.producer is not None:
            assert v.producer.outputs[v.index] is v
    assert len({n.name for n in m.graph.nodes if n.name}) == 2
    assert next(n for n in m.graph.nodes if n.op_type == "Neg").doc_string == "neg"
    assert next(n for n in m.graph.nodes if n.op_type == "LeakyRelu").attrs["alpha"].value == 0.25
    run_pipeline(m, "canonicalize")
    verify(m.graph)
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    b = np.maximum(x, 0) + x   # onnxruntime refuses the file itself (two nodes named 'A'): numpy is the reference
    np.testing.assert_allclose(run(m, {"x": x})[0], -np.where(b >= 0, b, 0.25 * b), rtol=1e-6)
