"""canonicalize's dead-code elimination (one reverse sweep with a worklist) reaches the same fixed point as
rescanning: dead chains, chains listed out of order, and producers that only a dead If's body read."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from qcompiler import model_from_proto, verify
from qcompiler.passmanager import run_pipeline
from tests.helpers import make_model, run, tinfo


def _canon(proto):
    m = model_from_proto(proto)
    results = run_pipeline(m, "canonicalize")
    verify(m.graph)
    return m, results[0][1].stats


def test_dead_chain_goes_and_live_path_runs_the_same():
    nodes = [helper.make_node("Relu", ["x"], ["live"], name="live"),
             helper.make_node("Neg", ["x"], ["d1"], name="d1"),
             helper.make_node("Abs", ["d1"], ["d2"], name="d2"),
             helper.make_node("Exp", ["d2"], ["d3"], name="d3")]
    proto = make_model(nodes, [tinfo("x", [2, 3])], [tinfo("live", [2, 3])])
    m, stats = _canon(proto)
    assert [n.name for n in m.graph.nodes] == ["live"]
    assert stats["dead_nodes_removed"] == 3
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(run(m, {"x": x})[0], run(proto, {"x": x})[0])


def test_dead_chain_listed_consumers_first():
    # producers after consumers in the node list: the importer sorts, DCE must still remove the whole chain
    nodes = [helper.make_node("Exp", ["d2"], ["d3"], name="d3"),
             helper.make_node("Abs", ["d1"], ["d2"], name="d2"),
             helper.make_node("Neg", ["x"], ["d1"], name="d1"),
             helper.make_node("Relu", ["x"], ["y"], name="live")]
    m, stats = _canon(make_model(nodes, [tinfo("x", [2])], [tinfo("y", [2])]))
    assert [n.name for n in m.graph.nodes] == ["live"]
    assert stats["dead_nodes_removed"] == 3


def test_producer_read_only_by_a_dead_if_body_goes_too():
    then_g = helper.make_graph([helper.make_node("Neg", ["captured"], ["t"], name="then_neg")], "then", [],
                               [tinfo("t", [2])])
    else_g = helper.make_graph([helper.make_node("Abs", ["captured"], ["e"], name="else_abs")], "else", [],
                               [tinfo("e", [2])])
    nodes = [helper.make_node("Exp", ["x"], ["captured"], name="producer"),
             helper.make_node("Constant", [], ["c"], name="cond",
                              value=helper.make_tensor("cv", TensorProto.BOOL, [], [True])),
             helper.make_node("If", ["c"], ["dead_if_out"], name="dead_if", then_branch=then_g, else_branch=else_g),
             helper.make_node("Relu", ["x"], ["y"], name="live")]
    m, stats = _canon(make_model(nodes, [tinfo("x", [2])], [tinfo("y", [2])]))
    assert [n.name for n in m.graph.nodes] == ["live"]
    assert stats["dead_nodes_removed"] == 3
    assert m.graph.value("captured") is None
