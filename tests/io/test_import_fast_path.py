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


def _main_and_body_names():
    """A main graph with initializers 'w', 'k', 'n' and node outputs 'a', 'b' (two outputs, one left empty); its
    Loop body defines 'a' and 'n' again (shadowing, legal ONNX) and reads the main graph's 'w'."""
    from onnx import TensorProto as TP
    from onnx import numpy_helper

    body = helper.make_graph(
        [helper.make_node("Add", ["xb", "w"], ["a"], name="body_add"),     # shadows the main graph's 'a'
         helper.make_node("Neg", ["a"], ["n"], name="body_neg"),           # shadows the initializer 'n'
         helper.make_node("Identity", ["c"], ["c2"], name="body_cond")],
        "body", [tinfo("i", [], TP.INT64), tinfo("c", [], TP.BOOL), tinfo("xb", [3])],
        [tinfo("c2", [], TP.BOOL), tinfo("n", [3])])
    nodes = [helper.make_node("Add", ["x", "w"], ["a"], name="add"),
             helper.make_node("Dropout", ["a"], ["b", ""], name="drop"),   # two outputs, the second omitted
             helper.make_node("Loop", ["n", "", "a"], ["y"], body=body, name="loop")]
    inits = [numpy_helper.from_array(np.array([0.5, -1.0, 2.0], np.float32), "w"),
             numpy_helper.from_array(np.array([3], np.int64), "k"),
             numpy_helper.from_array(np.array(2, np.int64), "n")]
    return make_model(nodes, [tinfo("x", [3])], [tinfo("y", [3]), tinfo("b", [3])], inits)


def test_main_graph_names_are_reserved_for_bodies_and_fresh_names():
    """The main graph's value names are reserved model-wide after its nodes are read: a body that reuses one
    gets a new name, a name asked for later is new too, and the exported model runs."""
    proto = _main_and_body_names()
    m = model_from_proto(proto)
    g = m.graph
    verify(g)
    main_names = set(g._values)
    assert {"x", "w", "k", "n", "a", "b", "y"} <= main_names
    body = g.nodes_by_op("Loop")[0].attr("body")
    body_names = {v.name for v in body._values.values()}
    assert not body_names & main_names, "a body value took a main-graph name"
    assert main_names | body_names <= g.names._used
    assert g.names.fresh("a") not in main_names | body_names
    drop = g.nodes_by_op("Dropout")[0]
    assert [v.name if v else None for v in drop.outputs] == ["b", None]
    assert g.value("b").producer is drop and g.value("b").index == 0
    # onnxruntime refuses the file itself (a body node output repeats an outer one: not SSA); the export renames
    # it. Two trips of xb -> -(xb + w) from a = x + w give x + w again; Dropout passes a through.
    x = np.array([1.0, 2.0, 3.0], np.float32)
    w = np.array([0.5, -1.0, 2.0], np.float32)
    y, b = run(m, {"x": x})
    np.testing.assert_allclose(y, x + w, rtol=1e-6)
    np.testing.assert_allclose(b, x + w, rtol=1e-6)


def test_main_graph_output_named_like_an_initializer_is_refused():
    """In the main graph a node output that repeats an initializer's (or a graph input's) name is a duplicate."""
    import pytest

    from qcompiler.errors import InvalidModelError

    proto = _main_and_body_names()
    proto.graph.node[0].output[0] = "k"   # the Add now writes the initializer 'k'
    with pytest.raises(InvalidModelError, match="'k' is already defined"):
        model_from_proto(proto)
    proto = _main_and_body_names()
    proto.graph.node[0].output[0] = "x"   # ... or the graph input 'x'
    with pytest.raises(InvalidModelError, match="'x' is already defined"):
        model_from_proto(proto)
