import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qcompiler.ir import verify
from qcompiler.ir.names import NameScope
from qcompiler.onnx_io import model_from_proto, model_to_proto
from tests.helpers import make_model, run, tinfo


def _mul_xx_model():
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"], name="mul"),
             helper.make_node("Relu", ["sq"], ["a"], name="r1"),
             helper.make_node("Neg", ["sq"], ["b"], name="n1"),
             helper.make_node("Abs", ["sq"], ["c"], name="a1")]
    return make_model(nodes, [tinfo("x", [2, 3])], [tinfo("sq", [2, 3]), tinfo("a", [2, 3]), tinfo("b", [2, 3]), tinfo("c", [2, 3])])


def test_mul_x_x_keeps_two_edges_and_output_is_extra_use():
    m = model_from_proto(_mul_xx_model())
    g = m.graph
    verify(g)
    x, sq = g.value("x"), g.value("sq")
    assert [u.index for u in x.uses()] == [0, 1]
    assert len(sq.uses()) == 4 and sq.is_graph_output()
    assert len(sq.consumers()) == 3
    mul = g.nodes_by_op("Mul")[0]
    assert g.index.number_of_edges(mul, g.nodes_by_op("Relu")[0]) == 1
    from qcompiler.ir import SOURCE
    assert g.index.number_of_edges(SOURCE, mul) == 2


def test_names_never_confused():
    s = NameScope()
    s.reserve("hidden_output")
    s.reserve("hidden_output_1")
    assert s.fresh("hidden_output") == "hidden_output_2"
    assert s.fresh("hidden_output") == "hidden_output_3"
    assert s.fresh("new") == "new"


def test_insert_after_graph_output_keeps_output_name():
    m = model_from_proto(_mul_xx_model())
    g = m.graph
    sq = g.value("sq")
    node = g.insert_after(sq, "Identity")
    verify(g)
    assert [v.name for v in g.outputs] == ["sq", "a", "b", "c"]
    assert g.outputs[0] is node.outputs[0]
    x = np.random.rand(2, 3).astype(np.float32)
    got = run(m, {"x": x})
    assert np.allclose(got[0], x * x)


def test_copy_on_write_shared_constant():
    half = helper.make_tensor("half", TensorProto.FLOAT, [], [0.5])
    nodes = [helper.make_node("Mul", ["x", "half"], ["a"], name="m1"),
             helper.make_node("Mul", ["a", "half"], ["b"], name="m2")]
    m = model_from_proto(make_model(nodes, [tinfo("x", [3])], [tinfo("b", [3])], [half]))
    g = m.graph
    m2 = [n for n in g if n.name == "m2"][0]
    new = g.set_constant(g.value("half"), np.array(2.0, np.float32), writer=m2)
    verify(g)
    assert new is not g.value("half") and g.value("half").const_value() == 0.5
    x = np.ones(3, np.float32)
    assert np.allclose(run(m, {"x": x})[0], 1.0)


def test_remove_and_replace_uses():
    m = model_from_proto(_mul_xx_model())
    g = m.graph
    r1 = [n for n in g if n.name == "r1"][0]
    g.replace_all_uses(r1.outputs[0], g.value("x"))  # output use untouched
    assert g.value("a").is_graph_output()
    with pytest.raises(ValueError):
        g.remove_node(r1)
    verify(g)


def test_subgraph_capture_edges():
    then_g = helper.make_graph([helper.make_node("Add", ["x", "y"], ["t"], name="add_in_then")], "then", [], [tinfo("t", [2])])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "y"], ["e"], name="sub_in_else")], "else", [], [tinfo("e", [2])])
    nodes = [helper.make_node("Relu", ["x0"], ["x"], name="relu"),
             helper.make_node("If", ["c"], ["o"], then_branch=then_g, else_branch=else_g, name="if")]
    proto = make_model(nodes, [tinfo("x0", [2]), tinfo("y", [2]), tinfo("c", [], TensorProto.BOOL)], [tinfo("o", [2])])
    m = model_from_proto(proto)
    verify(m.graph)
    x = m.graph.value("x")
    assert len(x.uses()) == 2  # one in each branch
    relu, if_node = m.graph.nodes
    assert m.graph.index.number_of_edges(relu, if_node) == 2
    out = model_to_proto(m)
    onnx.checker.check_model(out)
    res = run(out, {"x0": np.array([1, -1], np.float32), "y": np.array([1, 1], np.float32), "c": np.array(True)})
    assert np.allclose(res[0], [2, 1])


def test_self_loop_is_a_cycle():
    from qcompiler.errors import InvalidModelError
    nodes = [helper.make_node("Add", ["x", "a"], ["a"], name="selfloop"),
             helper.make_node("Relu", ["a"], ["y"], name="r")]
    with pytest.raises(InvalidModelError, match="cycle.*selfloop"):
        model_from_proto(make_model(nodes, [tinfo("x", [2])], [tinfo("y", [2])]))


def test_toposort_orders_captures_before_the_body_owner():
    then_g = helper.make_graph([helper.make_node("Neg", ["late"], ["t"], name="neg_in_then")], "then", [], [tinfo("t", [2])])
    else_g = helper.make_graph([helper.make_node("Abs", ["late"], ["e"], name="abs_in_else")], "else", [], [tinfo("e", [2])])
    nodes = [helper.make_node("If", ["c"], ["o"], then_branch=then_g, else_branch=else_g, name="if"),
             helper.make_node("Relu", ["x"], ["late"], name="relu_defined_after")]
    m = model_from_proto(make_model(nodes, [tinfo("x", [2]), tinfo("c", [], TensorProto.BOOL)], [tinfo("o", [2])]))
    assert [n.name for n in m.graph] == ["relu_defined_after", "if"]  # sorted on import
    verify(m.graph)


def test_substitute_keeps_graph_output_name_and_type():
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Neg", ["r"], ["y"], name="neg")]
    m = model_from_proto(make_model(nodes, [tinfo("x", [2, 3])], [tinfo("y", [2, 3])]))
    g = m.graph
    neg = g.nodes_by_op("Neg")[0]
    abs_ = g.add_node("Abs", [g.value("r")], ["a"], after=neg)
    g.substitute(g.value("y"), abs_.outputs[0], remove=[neg])
    verify(g)
    assert [v.name for v in g.outputs] == ["y"] and g.outputs[0] is abs_.outputs[0]
    assert g.outputs[0].shape == (2, 3)
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    assert np.array_equal(run(m, {"x": x})[0], np.abs(np.maximum(x, 0)))
    with pytest.raises(ValueError, match="cannot take over graph output"):
        g.substitute(g.value("y"), g.value("x"), remove=[abs_])  # a graph input cannot be renamed
    verify(g)
