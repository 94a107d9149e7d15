"""The IR's graph queries (topological order, reachability, the outputs a value reaches) read the networkx index;
the index stays unbuilt until one of them (or the checker) asks, and the answers are the same whether the index
was built before the graph changed (kept in step) or after (built from the use lists)."""
import pytest
from onnx import TensorProto, helper

from qcompiler.errors import InvalidModelError
from qcompiler.ir import verify
from qcompiler.onnx_io import model_from_proto, model_to_proto
from tests.helpers import make_model, tinfo


def _branchy():
    """x -> a(Relu) -> b(Neg) -> y1 ; a -> c(Abs) -> y2 ; x -> d(Sigmoid) -> If(cond) whose then-branch reads b
    (a capture) -> y3; y1 is also output 3 again."""
    then_g = helper.make_graph([helper.make_node("Identity", ["b"], ["t"], name="then_id")], "then", [],
                               [tinfo("t", [2])])
    else_g = helper.make_graph([helper.make_node("Identity", ["d"], ["e"], name="else_id")], "else", [],
                               [tinfo("e", [2])])
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="a"),
             helper.make_node("Neg", ["a"], ["b"], name="b"),
             helper.make_node("Abs", ["a"], ["c"], name="c"),
             helper.make_node("Sigmoid", ["x"], ["d"], name="d"),
             helper.make_node("If", ["cond"], ["y3"], then_branch=then_g, else_branch=else_g, name="if")]
    proto = make_model(nodes, [tinfo("x", [2]), tinfo("cond", [], TensorProto.BOOL)],
                       [tinfo("b", [2]), tinfo("c", [2]), tinfo("y3", [2]), tinfo("b", [2])])
    return model_from_proto(proto)


def _by_name(g):
    return {n.name: n for n in g.nodes}


def _names(nodes):
    return [n.name for n in nodes]


def test_import_and_export_leave_the_index_unbuilt_and_a_query_builds_it():
    m = _branchy()
    assert m.graph._index is None
    model_to_proto(m)
    assert m.graph._index is None
    assert _names(m.graph.topological_nodes()) == _names(m.graph.nodes)
    assert m.graph._index is not None


def test_reachability_sees_through_captures_into_bodies():
    m = _branchy()
    g = m.graph
    n = _by_name(g)
    assert _names(g.reachable_from(n["a"])) == ["b", "c", "if"]     # b is read inside the If's then-branch
    assert _names(g.reachable_from(n["c"])) == []
    assert _names(g.upstream_of(n["if"])) == ["a", "b", "d"]
    then_id = g.nodes_by_op("If")[0].subgraphs()[0].nodes[0]
    assert _names(g.upstream_of(then_id)) == ["a", "b", "d"]         # a body node answers for its owner
    assert g.has_path(n["a"], n["if"]) and not g.has_path(n["c"], n["if"]) and g.has_path(n["c"], n["c"])


def test_outputs_reached_names_each_output_once_in_output_order():
    m = _branchy()
    g = m.graph
    out = lambda v: [o.name for o in g.downstream_outputs(g.value(v))]  # noqa: E731
    assert out("x") == ["b", "c", "y3"]      # 'b' stands at positions 0 and 3: named once
    assert out("a") == ["b", "c", "y3"]
    assert out("c") == ["c"]
    assert out("d") == ["y3"]                # through the else-branch's capture
    both = g.outputs_reached([g.value("c"), g.value("d")])
    assert [o.name for o in both[g.value("c")]] == ["c"] and [o.name for o in both[g.value("d")]] == ["y3"]


def test_topological_nodes_orders_without_reordering_and_filters_by_op_type():
    m = _branchy()
    g = m.graph
    n = _by_name(g)
    # make the node list unsorted through the mutation API: 'c' now reads 'd', which stands after it
    g.set_input(n["c"], 0, g.value("d"))
    before = _names(g.nodes)
    order = _names(g.topological_nodes())
    assert _names(g.nodes) == before                      # a query, not a reorder
    assert order.index("d") < order.index("c") and order.index("a") < order.index("b")
    assert _names(g.topological_nodes(["Abs", "Relu"])) == ["a", "c"]


@pytest.mark.parametrize("index_first", [False, True])
def test_answers_agree_whether_the_index_was_kept_in_step_or_built_after(index_first):
    m = _branchy()
    g = m.graph
    if index_first:
        g.topological_nodes()          # index built now, kept in step by the mutations below
    n = _by_name(g)
    relu = g.insert_after(g.value("c"), "Relu", name="late_relu")
    g.set_input(n["b"], 0, g.value("d"))
    verify(g)
    got = (_names(g.topological_nodes()), _names(g.reachable_from(n["d"])),
           [o.name for o in g.downstream_outputs(g.value("a"))], _names(g.upstream_of(relu)))
    g._index = None                     # the same queries on an index built from the use lists
    again = (_names(g.topological_nodes()), _names(g.reachable_from(n["d"])),
             [o.name for o in g.downstream_outputs(g.value("a"))], _names(g.upstream_of(relu)))
    assert got == again
    assert got[2] == ["c"]              # 'a' now feeds only Abs -> late_relu -> output 'c'


def test_a_cycle_made_through_the_mutation_api_is_named():
    m = _branchy()
    g = m.graph
    n = _by_name(g)
    g.set_input(n["a"], 0, g.value("b"))      # a -> b -> a
    with pytest.raises(InvalidModelError, match="graph .* has a cycle"):
        g.topological_nodes()
    with pytest.raises(InvalidModelError, match="cycle"):
        g.downstream_outputs(g.value("a"))


def test_a_node_of_another_graph_is_refused():
    a, b = _branchy(), _branchy()
    with pytest.raises(ValueError, match="not in graph"):
        a.graph.reachable_from(b.graph.nodes[0])
