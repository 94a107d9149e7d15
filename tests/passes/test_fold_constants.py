"""fold-constants: exact folds, and no allocation sized by a hostile constant shape."""
import numpy as np
from onnx import TensorProto, helper

from qcompiler.ir import verify
from qcompiler.onnx_io import model_from_proto
from qcompiler.passmanager import run_pipeline
from qcompiler.passmanager.instrumentation import Verifier
from tests.helpers import make_model, run, tinfo


def test_folds_constant_subexpressions_and_keeps_outputs():
    a = helper.make_tensor("a", TensorProto.FLOAT, [3], [1, 2, 3])
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, 3])
    nodes = [helper.make_node("Mul", ["a", "a"], ["a2"], name="sq"),
             helper.make_node("Reshape", ["a2", "shape"], ["a2r"], name="reshape"),
             helper.make_node("Add", ["x", "a2r"], ["y"], name="add")]
    proto = make_model(nodes, [tinfo("x", [1, 3])], [tinfo("y", [1, 3])], [a, shape])
    m = model_from_proto(proto)
    (_, r), = run_pipeline(m, "fold-constants", [Verifier()])
    verify(m.graph)
    assert r.stats["folded"] == 2 and [n.op_type for n in m.graph] == ["Add"]
    assert set(m.graph.initializers) == {"a2r_folded"}  # a and shape were only read by the folded nodes
    x = np.ones((1, 3), np.float32)
    np.testing.assert_allclose(run(m, {"x": x})[0], [[2, 5, 10]])


def test_huge_constant_of_shape_is_not_evaluated():
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1_000_000, 1_000_000])  # 10^12 elements
    nodes = [helper.make_node("ConstantOfShape", ["shape"], ["big"], name="cos"),
             helper.make_node("Shape", ["big"], ["s"], name="shape_of"),
             helper.make_node("Cast", ["s"], ["y"], name="cast", to=TensorProto.FLOAT)]
    m = model_from_proto(make_model(nodes, [], [tinfo("y", [2])], [shape]))
    (_, r), = run_pipeline(m, "fold-constants")
    assert r.stats["folded"] == 0 and r.stats["skipped"] >= 1
    assert "ConstantOfShape" in {n.op_type for n in m.graph}
