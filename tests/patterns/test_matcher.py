"""The DSL and matcher: alternatives, commutation, optional inputs, constant predicates, multi-output binding,
exclusive use, non-overlap, bodies, registry errors, explain."""
import numpy as np
import pytest
from onnx import helper

from qcompiler.errors import PatternError
from qcompiler.onnx_io import model_from_proto
from qcompiler.patterns import Pattern, all_patterns, explain, find_matches, get_pattern
from tests.helpers import make_model, tinfo
from tests.patterns.builders import Builder


class AddRelu(Pattern):
    name = "add_relu"

    def pattern(self, op, a, b):
        return op.Relu(op.Add(a, b, _name="add"), _name="relu")


class SubRelu(Pattern):
    name = "sub_relu"

    def pattern(self, op, a, b):
        return op.Relu(op.Sub(a, b, _name="sub"), _name="relu")


class SplitSum(Pattern):
    """Multi-output: returns the sum and the second half, which may be read outside."""
    name = "split_sum"

    def pattern(self, op, x):
        lo, hi = op.Split(x, op.Optional(op.Var("split")), _outputs=2, _name="split", axis=1)
        return op.Add(op.Relu(lo, _name="relu"), hi, _name="sum"), hi


class SplitSumOneOutput(Pattern):
    name = "split_sum_one"

    def pattern(self, op, x):
        lo, hi = op.Split(x, op.Optional(op.Var("split")), _outputs=2, _name="split", axis=1)
        return op.Add(op.Relu(lo, _name="relu"), hi, _name="sum")


class ScaleBy(Pattern):
    name = "scale_by_vector"

    def pattern(self, op, x):
        return op.node(("Mul", "Div"), x, op.Const(name="s", shape=(8,), pred=lambda a: bool((a > 0).all())),
                       _name="scale")


def test_op_alternatives_and_commutation():
    b = Builder()
    b.input("y")
    b.output(b.op("Relu", b.op("Add", "x", "y", name="add"), name="relu"))
    g = b.graph()
    (m,) = find_matches(g, AddRelu())
    assert m["a"].name == "x" and m["b"].name == "y" and [n.name for n in m.nodes] == ["add", "relu"]
    assert [v.name for v in m.inputs] == ["x", "y"]
    b = Builder()
    b.output(b.op("Mul", "x", b.const(np.full(8, 2.0, np.float32)), name="m"))
    b.output(b.op("Div", b.const(np.full(8, 2.0, np.float32)), "x", name="d"))  # constant first: not x/s
    b.output(b.op("Mul", b.const(np.full(8, -1.0, np.float32)), "x", name="neg"))
    ms = find_matches(b.graph(), ScaleBy())
    assert [m.root.name for m in ms] == ["m"]


def test_constant_shape_predicate():
    b = Builder()
    b.output(b.op("Mul", "x", b.const(np.full(4, 2.0, np.float32)), name="m"), [2, 8])
    g = model_from_proto(b.proto()).graph
    assert find_matches(g, ScaleBy()) == []
    assert "expected shape [8], got [4]" in explain(g, ScaleBy(), "m")


def _split_graph(hi_outside: bool):
    nodes = [helper.make_node("Split", ["x"], ["lo", "hi"], name="split", axis=1),
             helper.make_node("Relu", ["lo"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "hi"], ["s"], name="sum")]
    outs = [tinfo("s", [2, 4])]
    if hi_outside:
        nodes.append(helper.make_node("Neg", ["hi"], ["n"], name="neg"))
        outs.append(tinfo("n", [2, 4]))
    return model_from_proto(make_model(nodes, [tinfo("x", [2, 8])], outs)).graph


def test_multi_output_binding_and_optional_input():
    g = _split_graph(hi_outside=True)
    (m,) = find_matches(g, SplitSum())
    assert [v.name for v in m.outputs] == ["s", "hi"] and m["split"].op_type == "Split"
    assert "split" not in m.bindings or m["split"] is m.get("split")
    # the same structure without declaring `hi` as an output: exclusive use refuses the outside reader
    assert find_matches(g, SplitSumOneOutput()) == []
    assert "neg" in explain(g, SplitSumOneOutput(), "sum")
    assert len(find_matches(_split_graph(hi_outside=False), SplitSumOneOutput())) == 1


def test_non_overlapping_in_graph_order():
    # Relu(Add(Relu(Add(x, y)), z)): two add_relu matches that do not share nodes
    b = Builder()
    b.input("y")
    b.input("z")
    r1 = b.op("Relu", b.op("Add", "x", "y", name="a1"), name="r1")
    b.output(b.op("Relu", b.op("Add", r1, "z", name="a2"), name="r2"))
    ms = find_matches(b.graph(), AddRelu())
    assert [m.root.name for m in ms] == ["r1", "r2"]
    assert not set(ms[0].nodes) & set(ms[1].nodes)


def test_group_prefers_earlier_variant_and_never_overlaps():
    b = Builder()
    b.input("y")
    b.output(b.op("Relu", b.op("Add", "x", "y", name="add"), name="relu"))
    g = b.graph()
    ms = find_matches(g, [SubRelu(), AddRelu()])
    assert [m.pattern for m in ms] == ["add_relu"]
    msg = explain(g, [SubRelu()], "relu")
    assert "step 'sub'" in msg and "expected Sub" in msg and "Add" in msg


def test_matches_inside_if_bodies():
    then_g = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t0"], name="tadd"),
                                helper.make_node("Relu", ["t0"], ["t1"], name="trelu")], "then", [],
                               [tinfo("t1", [2, 8])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e1"], name="eneg")], "else", [],
                               [tinfo("e1", [2, 8])])
    nodes = [helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g)]
    from onnx import TensorProto
    g = model_from_proto(make_model(nodes, [tinfo("x", [2, 8]), tinfo("c", [], TensorProto.BOOL)],
                                    [tinfo("y", [2, 8])])).graph
    ms = find_matches(g, AddRelu())
    assert [m.root.name for m in ms] == ["trelu"] and m_in_body(ms[0])
    assert find_matches(g, AddRelu(), recurse=False) == []


def m_in_body(m):
    return m.root.graph.parent is not None


def test_registry_names_and_unknown_name():
    names = set(all_patterns())
    assert {"layernorm", "gelu", "hardswish", "hardsigmoid_gate", "silu", "rmsnorm", "conv_bn_act",
            "matmul_add"} <= names
    assert [p.name for p in get_pattern("gelu")] == ["gelu_erf", "gelu_tanh"]
    assert [p.name for p in get_pattern("gelu_tanh")] == ["gelu_tanh"]
    with pytest.raises(PatternError, match="unknown pattern 'lyernorm'.*layernorm"):
        find_matches(_split_graph(False), "lyernorm")


def test_explain_unknown_node_and_wrong_root():
    g = _split_graph(False)
    with pytest.raises(PatternError, match="no node named 'nope'"):
        explain(g, "gelu", "nope")
    assert "root step expects Div|Mul" in explain(g, "gelu", "relu")  # Div: jax writes x·Φ·…/2


def test_bad_pattern_definitions():
    class Dangling(Pattern):
        name = "dangling"

        def pattern(self, op, x):
            op.Neg(x)
            return op.Relu(x)

    with pytest.raises(PatternError, match="do not feed"):
        find_matches(_split_graph(False), Dangling())

    class DupNames(Pattern):
        name = "dup"

        def pattern(self, op, x):
            return op.Relu(op.Relu(x, _name="r"), _name="r")

    with pytest.raises(PatternError, match="two pattern nodes"):
        find_matches(_split_graph(False), DupNames())
