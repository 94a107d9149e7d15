import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qcompiler.ir import verify
from qcompiler.onnx_io import load_model, model_from_proto, model_to_proto
from qcompiler.passes.constant_weights import ConstantToInitializer
from tests.helpers import make_model, run, tinfo
from tests.corpus import CORPUS


def _run_pass(proto):
    m = model_from_proto(proto)
    r = ConstantToInitializer().run(m)
    verify(m.graph)
    out = model_to_proto(m)
    onnx.checker.check_model(out)
    return m, r, out


def test_all_dense_forms_become_initializers_with_same_names():
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    nodes = [helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w), name="cw"),
             helper.make_node("Constant", [], ["f"], value_float=2.5, name="cf"),
             helper.make_node("Constant", [], ["fs"], value_floats=[1.0, 2.0], name="cfs"),
             helper.make_node("Constant", [], ["i"], value_int=3, name="ci"),
             helper.make_node("Constant", [], ["is_"], value_ints=[3, 1], name="cis"),
             helper.make_node("Constant", [], ["s"], value_strings=["a"], name="cs"),
             helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
             helper.make_node("Mul", ["mm", "f"], ["m1"], name="m1"),
             helper.make_node("Reshape", ["m1", "is_"], ["r"], name="r"),
             helper.make_node("Mul", ["r", "fs"], ["m2"], name="m2"),
             helper.make_node("Cast", ["i"], ["ic"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Add", ["m2", "ic"], ["y"], name="add")]
    proto = make_model(nodes, [tinfo("x", [1, 2])], [tinfo("y", [3, 2]), tinfo("s", [1], TensorProto.STRING)])
    m, r, out = _run_pass(proto)
    assert r.stats["converted"] == 5 and r.stats["kept"] == 1, r.stats
    assert "graph output" in r.stats["kept_reasons"]["cs"]
    assert sorted(i.name for i in out.graph.initializer) == ["f", "fs", "i", "is_", "w"]
    assert [n.op_type for n in out.graph.node].count("Constant") == 1
    assert m.graph.value("i").const_value().dtype == np.int64
    x = np.array([[1.0, -2.0]], np.float32)
    ref, got = run(proto, {"x": x}), run(out, {"x": x})
    np.testing.assert_array_equal(ref[0], got[0])


def test_string_constant_is_kept():
    nodes = [helper.make_node("Constant", [], ["s"], value_strings=["a", "b"], name="cs"),
             helper.make_node("Identity", ["s"], ["y"], name="id")]
    proto = make_model(nodes, [], [tinfo("y", [2], TensorProto.STRING)])
    _, r, out = _run_pass(proto)
    assert r.stats["converted"] == 0 and "value_strings" in r.stats["kept_reasons"]["cs"]


def test_body_constant_becomes_body_initializer():
    then_g = helper.make_graph([helper.make_node("Constant", [], ["k"], value_float=3.0, name="then_k"),
                                helper.make_node("Mul", ["x", "k"], ["t"], name="then_mul")],
                               "then", [], [tinfo("t", [2])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"], name="else_neg")], "else", [], [tinfo("e", [2])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="if")]
    proto = make_model(nodes, [tinfo("x", [2]), tinfo("c", [], TensorProto.BOOL)], [tinfo("y", [2])])
    m, r, out = _run_pass(proto)
    assert r.stats["converted"] == 1
    body = out.graph.node[0].attribute[0].g if out.graph.node[0].attribute[0].name == "then_branch" else out.graph.node[0].attribute[1].g
    assert [i.name for i in body.initializer] == ["k"] and not out.graph.initializer
    x = np.array([1.0, -2.0], np.float32)
    np.testing.assert_array_equal(run(out, {"x": x, "c": np.array(True)})[0], x * 3)


def test_ppocr_cls_corpus():
    path = os.path.join(CORPUS, "ppocr_cls", "model.onnx")
    if not os.path.exists(path):
        pytest.skip("corpus model ppocr_cls absent")
    m = load_model(path)
    r = ConstantToInitializer().run(m)
    verify(m.graph)
    assert r.stats["converted"] == 308 and not m.graph.nodes_by_op("Constant")
    data = np.load(os.path.join(CORPUS, "ppocr_cls", "calib.npz"))
    feeds = {"x": data["x"][0]}
    np.testing.assert_array_equal(run(onnx.load(path), feeds)[0], run(model_to_proto(m), feeds)[0])
