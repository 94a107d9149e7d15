"""`graph_protos`: a GraphProto and every If/Loop/Scan body below it, once each, a graph before its bodies."""
import onnx
from onnx import TensorProto as T
from onnx import helper as h

from qcompiler.onnx_io.graph_protos import graph_protos


def _body(name, inner=()):
    nodes = [h.make_node("Identity", ["x"], [f"{name}_out"], name=f"{name}_id")] + list(inner)
    return h.make_graph(nodes, name, [], [h.make_tensor_value_info(f"{name}_out", T.FLOAT, [1])])


def test_every_body_once_in_preorder():
    # main: If(then=A (holding If(then=A1, else=A2)), else=B), then a Loop over C; a chain 30 bodies deep
    # (about as deep as protobuf lets bodies nest)
    a = _body("A", [h.make_node("If", ["c"], ["a_if"], then_branch=_body("A1"), else_branch=_body("A2"))])
    main = h.make_graph([h.make_node("If", ["c"], ["y"], then_branch=a, else_branch=_body("B")),
                         h.make_node("Loop", ["n", "c"], ["z"], body=_body("C"))],
                        "main", [], [h.make_tensor_value_info("y", T.FLOAT, [1])])
    # helper.make_node writes attributes sorted by name: else_branch before then_branch
    assert [g.name for g in graph_protos(main)] == ["main", "B", "A", "A2", "A1", "C"]
    deep = _body("d0")
    for i in range(1, 30):
        deep = _body(f"d{i}", [h.make_node("If", ["c"], [f"o{i}"], then_branch=deep, else_branch=_body(f"e{i}"))])
    names = [g.name for g in graph_protos(deep)]
    assert names == [x for i in range(29, 0, -1) for x in (f"d{i}", f"e{i}")] + ["d0"]
    assert [g.name for g in graph_protos(onnx.GraphProto(name="flat"))] == ["flat"]


def test_a_graph_edited_when_handed_over_is_walked_as_edited():
    # a body's nodes are read when the walk reaches it: a body dropped from a node before that is not visited
    main = h.make_graph([h.make_node("If", ["c"], ["y"], then_branch=_body("A"), else_branch=_body("B"))],
                        "main", [], [h.make_tensor_value_info("y", T.FLOAT, [1])])
    seen = []
    for g in graph_protos(main):
        seen.append(g.name)
        if g.name == "main":
            del g.node[0].attribute[0]      # the else branch
    assert seen == ["main", "A"]
