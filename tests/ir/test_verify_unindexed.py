"""The invariant checker on a graph whose networkx index was never built: it does not build one (a quantize run
that never queries the index then never imports networkx, ~0.1 s) and still finds a cycle, from the use lists."""
import numpy as np
from onnx import helper, numpy_helper

from qcompiler.ir.invariants import problems
from qcompiler.onnx_io import model_from_proto
from tests.helpers import make_model, tinfo


def _model():
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
             helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("Add", ["b", "a"], ["y"], name="add")]
    return model_from_proto(make_model(nodes, [tinfo("x", [1, 4])], [tinfo("y", [1, 4])], [w]))


def test_sound_graph_unindexed_and_indexed_agree():
    g = _model().graph
    assert g._index is None
    assert problems(g) == []
    assert g._index is None            # the check did not build the index
    g.index                            # noqa: B018 - build it: the full comparison runs and agrees
    assert problems(g) == []


def test_cycle_found_without_the_index():
    g = _model().graph
    mm = next(n for n in g.nodes if n.name == "mm")
    add = next(n for n in g.nodes if n.name == "add")
    g.set_input(mm, 0, add.outputs[0])   # mm reads what add computes from mm's own result
    g._index = None
    got = problems(g)
    assert any("cycle" in p for p in got), got
    g.index                              # noqa: B018
    assert any("cycle" in p for p in problems(g))
