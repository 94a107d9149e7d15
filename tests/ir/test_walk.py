"""`walk_up`: the one walk from seed values up through their producers that the quantizer's rules share
(calibration's output-adjacent values, widening's Sin/Cos angles and Softmax scores)."""
import numpy as np
from onnx import helper

from qcompiler.ir import Graph, verify, walk_up
from qcompiler.onnx_io import model_from_proto
from qcompiler.quant.calibration.calibrate import output_adjacent
from tests.helpers import make_model, tinfo


def _all_inputs(v):
    return list(v.producer.inputs) if v.producer is not None else []


def test_a_diamond_is_walked_once_and_the_step_decides_where_to_stop():
    g = Graph()
    x = g.add_input("x")
    a = g.add_node("Relu", [x], ["a"]).outputs[0]
    b = g.add_node("Neg", [a], ["b"]).outputs[0]
    c = g.add_node("Abs", [a], ["c"]).outputs[0]
    y = g.add_node("Add", [b, c], ["y"]).outputs[0]
    g.add_output(y)
    verify(g)
    got = walk_up([y], _all_inputs)
    assert [v.name for v in got] == ["y", "c", "a", "x", "b"]   # depth first, last input first, each once
    assert all(got.count(v) == 1 for v in got)
    assert [v.name for v in walk_up([y], lambda v: [])] == ["y"]
    not_through_neg = walk_up([y], lambda v: [] if v.producer is not None and v.producer.op_type == "Neg"
                              else _all_inputs(v))
    assert {v.name for v in not_through_neg} == {"y", "b", "c", "a", "x"}   # a is still reached through Abs
    only_through_add = walk_up([y], lambda v: _all_inputs(v) if v.producer is not None and v.producer.op_type == "Add"
                               else [])
    assert {v.name for v in only_through_add} == {"y", "b", "c"}


def test_absent_inputs_and_seeds_are_skipped_and_repeated_seeds_kept_once():
    g = Graph()
    x = g.add_input("x")
    w = g.add_constant(np.ones((2, 2), np.float32), "w")
    y = g.add_node("Conv", [x, w, None], ["y"]).outputs[0]    # no bias
    got = walk_up([None, y, y, None], _all_inputs)
    assert [v.name for v in got] == ["y", "w", "x"]
    assert walk_up([], _all_inputs) == []


def test_a_chain_far_deeper_than_the_recursion_limit():
    g = Graph()
    v = x = g.add_input("x")
    for _ in range(5000):
        v = g.add_node("Relu", [v]).outputs[0]
    got = walk_up([v], _all_inputs)
    assert len(got) == 5001 and got[-1] is x


def test_output_adjacent_uses_the_walk_and_stops_at_an_op_that_changes_the_order():
    nodes = [helper.make_node("MatMul", ["x", "x"], ["mm"], name="mm"),
             helper.make_node("Relu", ["mm"], ["r"], name="r"),
             helper.make_node("Reshape", ["r", "shape"], ["logits"], name="reshape"),
             helper.make_node("Softmax", ["logits"], ["probs"], name="softmax")]
    shape = helper.make_tensor("shape", 7, [2], [2, 2])
    m = model_from_proto(make_model(nodes, [tinfo("x", [2, 2])], [tinfo("probs", [2, 2]), tinfo("r", [2, 2])],
                                    [shape]))
    # Softmax and Reshape (first input only: not the shape) keep the order; Relu does not
    assert output_adjacent(m) == {"probs", "logits", "r"}
