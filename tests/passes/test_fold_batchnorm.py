import os

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from qcompiler.ir import verify
from qcompiler.onnx_io import load_model, model_from_proto, model_to_proto
from qcompiler.passes.fold_batchnorm import FoldBatchNorm
from tests.helpers import make_model, run, tinfo

RNG = np.random.default_rng(0)
from tests.corpus import CORPUS


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr, np.float32), name)


def _const_node(name, arr):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(arr, np.float32), name),
                            name=f"c_{name}")


def _bn_params(prefix, c):
    return [_init(f"{prefix}_g", RNG.uniform(0.5, 2, c)), _init(f"{prefix}_b", RNG.normal(size=c)),
            _init(f"{prefix}_m", RNG.normal(size=c)), _init(f"{prefix}_v", RNG.uniform(0.1, 3, c))]


def _bn(prefix, x, y, name=None, eps=1e-3):
    return helper.make_node("BatchNormalization", [x, f"{prefix}_g", f"{prefix}_b", f"{prefix}_m", f"{prefix}_v"],
                            [y], epsilon=eps, name=name or prefix)


def _fold_and_check(proto, feeds, expect_folded, expect_kept=0):
    """Run the pass, verify the IR, export, check the model, and compare to the original in onnxruntime."""
    m = model_from_proto(proto)
    r = FoldBatchNorm().run(m)
    verify(m.graph)
    out = model_to_proto(m)
    onnx.checker.check_model(out)
    ref, got = run(proto, feeds), run(out, feeds)
    for a, b in zip(ref, got):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
    assert r.stats["folded"] == expect_folded, r.stats
    assert r.stats["kept"] == expect_kept, r.stats
    assert len(m.graph.nodes_by_op("BatchNormalization")) == expect_kept
    return m, r, out


def _x(*shape):
    return RNG.normal(size=shape).astype(np.float32)


def test_conv_bn_relu_without_bias_gets_bias():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"), _bn("bn", "c", "b"),
             helper.make_node("Relu", ["b"], ["y"], name="relu")]
    p = make_model(nodes, [tinfo("x", [1, 3, 6, 6])], [tinfo("y", [1, 4, 6, 6])],
                   [_init("w", RNG.normal(size=(4, 3, 3, 3)))] + _bn_params("bn", 4))
    m, _, out = _fold_and_check(p, {"x": _x(1, 3, 6, 6)}, 1)
    conv = m.graph.nodes_by_op("Conv")[0]
    assert len(conv.inputs) == 3 and conv.inputs[2].const_value().shape == (4,)
    assert {i.name for i in out.graph.initializer} == {"w", conv.inputs[2].name}  # BN params dropped


def test_constant_node_weights_and_params():
    c = 4
    nodes = [_const_node("w", RNG.normal(size=(c, 2, 3, 3))), _const_node("cb", RNG.normal(size=c)),
             _const_node("bn_g", RNG.uniform(0.5, 2, c)), _const_node("bn_b", RNG.normal(size=c)),
             _const_node("bn_m", RNG.normal(size=c)), _const_node("bn_v", RNG.uniform(0.1, 2, c)),
             helper.make_node("Conv", ["x", "w", "cb"], ["c"], name="conv"), _bn("bn", "c", "y")]
    p = make_model(nodes, [tinfo("x", [2, 2, 5, 5])], [tinfo("y", [2, c, 3, 3])])
    m, _, _ = _fold_and_check(p, {"x": _x(2, 2, 5, 5)}, 1)
    assert m.graph.nodes_by_op("Constant") == []  # orphaned Constant nodes removed


def test_fan_out_from_inside_is_kept_with_reason():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), _bn("bn", "c", "b"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"), helper.make_node("Add", ["b", "r"], ["y"])]
    p = make_model(nodes, [tinfo("x", [1, 3, 4, 4])], [tinfo("y", [1, 4, 4, 4])],
                   [_init("w", RNG.normal(size=(4, 3, 1, 1)))] + _bn_params("bn", 4))
    _, r, _ = _fold_and_check(p, {"x": _x(1, 3, 4, 4)}, 0, 1)
    assert "2 uses" in r.stats["kept_reasons"]["bn"]


def test_producer_not_linear_is_kept_with_reason():
    nodes = [helper.make_node("Relu", ["x"], ["c"], name="relu"), _bn("bn_3", "c", "y")]
    p = make_model(nodes, [tinfo("x", [1, 4, 4, 4])], [tinfo("y", [1, 4, 4, 4])], _bn_params("bn_3", 4))
    _, r, _ = _fold_and_check(p, {"x": _x(1, 4, 4, 4)}, 0, 1)
    assert r.stats["kept_reasons"]["bn_3"] == "bn_3: producer Relu 'relu' is not Conv/ConvTranspose/Gemm/MatMul"


def test_training_mode_outputs_are_kept():
    bn = helper.make_node("BatchNormalization", ["c", "bn_g", "bn_b", "bn_m", "bn_v"], ["y", "rm", "rv"],
                          training_mode=1, name="bn")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), bn]
    p = make_model(nodes, [tinfo("x", [2, 3, 4, 4])], [tinfo("y", [2, 4, 4, 4])],
                   [_init("w", RNG.normal(size=(4, 3, 1, 1)))] + _bn_params("bn", 4), opset=15)
    m = model_from_proto(p)
    r = FoldBatchNorm().run(m)
    verify(m.graph)
    assert r.stats["folded"] == 0 and "training-mode" in r.stats["kept_reasons"]["bn"]


def test_shared_conv_weight_is_copied_on_write():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c1"], name="conv1"), _bn("bn", "c1", "y1"),
             helper.make_node("Conv", ["x", "w"], ["y2"], name="conv2")]
    p = make_model(nodes, [tinfo("x", [1, 3, 4, 4])], [tinfo("y1", [1, 4, 4, 4]), tinfo("y2", [1, 4, 4, 4])],
                   [_init("w", RNG.normal(size=(4, 3, 1, 1)))] + _bn_params("bn", 4))
    m, _, _ = _fold_and_check(p, {"x": _x(1, 3, 4, 4)}, 1)
    conv1, conv2 = m.graph.nodes_by_op("Conv")
    assert conv2.inputs[1].name == "w" and conv1.inputs[1] is not conv2.inputs[1]
    np.testing.assert_array_equal(conv2.inputs[1].const_value(), numpy_helper.to_array(p.graph.initializer[0]))


def test_bn_statistics_shared_by_two_convs():
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1"), _bn("bn", "c1", "y1", name="bn1"),
             helper.make_node("Conv", ["x", "w2", "cb2"], ["c2"], name="conv2"), _bn("bn", "c2", "y2", name="bn2")]
    p = make_model(nodes, [tinfo("x", [1, 3, 4, 4])], [tinfo("y1", [1, 4, 4, 4]), tinfo("y2", [1, 4, 4, 4])],
                   [_init("w1", RNG.normal(size=(4, 3, 1, 1))), _init("w2", RNG.normal(size=(4, 3, 1, 1))),
                    _init("cb2", RNG.normal(size=4))] + _bn_params("bn", 4))
    m, _, out = _fold_and_check(p, {"x": _x(1, 3, 4, 4)}, 2)
    assert [o.name for o in out.graph.output] == ["y1", "y2"]  # BN outputs were graph outputs: names kept


def test_shared_weight_and_shared_stats_both_folded():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c1"], name="conv1"), _bn("bn", "c1", "y1", name="bn1"),
             helper.make_node("Conv", ["x", "w"], ["c2"], name="conv2"), _bn("bn", "c2", "y2", name="bn2")]
    p = make_model(nodes, [tinfo("x", [1, 3, 4, 4])], [tinfo("y1", [1, 4, 4, 4]), tinfo("y2", [1, 4, 4, 4])],
                   [_init("w", RNG.normal(size=(4, 3, 1, 1)))] + _bn_params("bn", 4))
    _fold_and_check(p, {"x": _x(1, 3, 4, 4)}, 2)


@pytest.mark.parametrize("group", [1, 2, 4])
def test_grouped_conv_transpose(group):
    cin, cout = 4, 6 if group != 4 else 8
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["c"], group=group, strides=[2, 2], name="deconv"),
             _bn("bn", "c", "y")]
    p = make_model(nodes, [tinfo("x", [1, cin, 3, 3])], [tinfo("y", [1, cout, 7, 7])],
                   [_init("w", RNG.normal(size=(cin, cout // group, 3, 3)))] + _bn_params("bn", cout))
    _fold_and_check(p, {"x": _x(1, cin, 3, 3)}, 1)


def test_grouped_conv_depthwise():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], group=4, name="dw"), _bn("bn", "c", "y")]
    p = make_model(nodes, [tinfo("x", [1, 4, 5, 5])], [tinfo("y", [1, 4, 3, 3])],
                   [_init("w", RNG.normal(size=(4, 1, 3, 3)))] + _bn_params("bn", 4))
    _fold_and_check(p, {"x": _x(1, 4, 5, 5)}, 1)


def test_producer_output_is_graph_output_is_kept():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), _bn("bn", "c", "y")]
    p = make_model(nodes, [tinfo("x", [1, 3, 4, 4])], [tinfo("c", [1, 4, 4, 4]), tinfo("y", [1, 4, 4, 4])],
                   [_init("w", RNG.normal(size=(4, 3, 1, 1)))] + _bn_params("bn", 4))
    _, r, _ = _fold_and_check(p, {"x": _x(1, 3, 4, 4)}, 0, 1)
    assert "graph output" in r.stats["kept_reasons"]["bn"]


def test_bn_output_graph_output_keeps_name_and_other_readers():
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"), _bn("bn", "c", "y"),
             helper.make_node("Relu", ["y"], ["z"], name="relu")]
    p = make_model(nodes, [tinfo("x", [1, 3, 4, 4])], [tinfo("y", [1, 4, 4, 4]), tinfo("z", [1, 4, 4, 4])],
                   [_init("w", RNG.normal(size=(4, 3, 1, 1)))] + _bn_params("bn", 4))
    m, _, out = _fold_and_check(p, {"x": _x(1, 3, 4, 4)}, 1)
    assert [o.name for o in out.graph.output] == ["y", "z"]
    assert m.graph.nodes_by_op("Conv")[0].outputs[0].name == "y"


@pytest.mark.parametrize("trans_b,with_c,beta", [(0, False, 1.0), (1, True, 1.0), (1, True, 0.5), (0, False, 2.0)])
def test_gemm(trans_b, with_c, beta):
    w = RNG.normal(size=(5, 6) if trans_b else (6, 5))
    inits = [_init("w", w)] + _bn_params("bn", 5) + ([_init("cc", RNG.normal(size=5))] if with_c else [])
    nodes = [helper.make_node("Gemm", ["x", "w"] + (["cc"] if with_c else []), ["g"], transB=trans_b, beta=beta,
                              alpha=0.7, name="gemm"), _bn("bn", "g", "y")]
    p = make_model(nodes, [tinfo("x", [3, 6])], [tinfo("y", [3, 5])], inits)
    _fold_and_check(p, {"x": _x(3, 6)}, 1)


@pytest.mark.parametrize("with_add", [False, True])
def test_matmul_rank2(with_add):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm")]
    inits = [_init("w", RNG.normal(size=(6, 5)))] + _bn_params("bn", 5)
    if with_add:
        nodes.append(helper.make_node("Add", ["mm", "bias"], ["a"], name="add"))
        inits.append(_init("bias", RNG.normal(size=5)))
    nodes.append(_bn("bn", "a" if with_add else "mm", "y"))
    p = make_model(nodes, [tinfo("x", [3, 6])], [tinfo("y", [3, 5])], inits)
    m, _, _ = _fold_and_check(p, {"x": _x(3, 6)}, 1)
    assert len(m.graph.nodes_by_op("Add")) == 1


def test_matmul_rank3_is_kept():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"), _bn("bn", "mm", "y")]
    p = make_model(nodes, [tinfo("x", [2, 5, 6])], [tinfo("y", [2, 5, 5])],
                   [_init("w", RNG.normal(size=(6, 5)))] + _bn_params("bn", 5))
    _, r, _ = _fold_and_check(p, {"x": _x(2, 5, 6)}, 0, 1)
    assert "not the last axis" in r.stats["kept_reasons"]["bn"]


def test_bn_inside_if_body():
    then_nodes = [helper.make_node("Conv", ["x", "w"], ["tc"], name="t_conv"), _bn("bn", "tc", "t_out", name="t_bn")]
    then_g = helper.make_graph(then_nodes, "then", [], [tinfo("t_out", [1, 3, 4, 4])])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e_out"], name="e_id")], "else", [],
                               [tinfo("e_out", [1, 3, 4, 4])])
    nodes = [helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g, name="if")]
    p = make_model(nodes, [tinfo("x", [1, 3, 4, 4]), tinfo("cond", [], onnx.TensorProto.BOOL)], [tinfo("y", [1, 3, 4, 4])],
                   [_init("w", RNG.normal(size=(3, 3, 1, 1)))] + _bn_params("bn", 3))
    _fold_and_check(p, {"x": _x(1, 3, 4, 4), "cond": np.array(True)}, 1)


def _corpus_model(name):
    path = os.path.join(CORPUS, name, "model.onnx")
    if not os.path.exists(path):
        pytest.skip(f"corpus model {name} absent")
    return path


@pytest.mark.parametrize("name,pipeline,n_bn", [("digits_cnn", [], 8), ("ppocr_cls", ["ctoi"], 35),
                                                  ("ppocr_cls", [], 35)])
def test_corpus_all_batchnorms_folded(name, pipeline, n_bn):
    path = _corpus_model(name)
    m = load_model(path)
    if pipeline:
        from qcompiler.passes.constant_weights import ConstantToInitializer
        ConstantToInitializer().run(m)
        verify(m.graph)
    r = FoldBatchNorm().run(m)
    verify(m.graph)
    assert r.stats["folded"] == n_bn and r.stats["kept"] == 0, r.stats
    data = np.load(os.path.join(CORPUS, name, "calib.npz"))
    ref_proto, out = onnx.load(path), model_to_proto(m)
    for i in range(0, data[list(data.keys())[0]].shape[0], 8):
        feeds = {k: data[k][i] for k in data.keys()}
        for a, b in zip(run(ref_proto, feeds), run(out, feeds)):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
