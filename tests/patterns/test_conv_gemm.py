"""Conv (+BN) (+Relu/Clip) and MatMul/Gemm + bias Add."""
import numpy as np
import pytest
from onnx import helper

from qcompiler.onnx_io import model_from_proto
from qcompiler.patterns import explain, find_matches
from tests.helpers import make_model, tinfo

R = np.random.default_rng(2)


def _conv_model(bn=True, act="Relu", extra_reader=False):
    from onnx import numpy_helper as nh
    inits = [nh.from_array(R.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1])]
    y = "c"
    if bn:
        for n, v in (("s", 1.0), ("b", 0.0), ("m", 0.0), ("v", 1.0)):
            inits.append(nh.from_array(np.full(4, v, np.float32) + 0.1 * R.random(4).astype(np.float32), n))
        nodes.append(helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["bn"], name="bn"))
        y = "bn"
    if act == "Relu":
        nodes.append(helper.make_node("Relu", [y], ["y"], name="act"))
        y = "y"
    elif act == "Clip":
        inits += [nh.from_array(np.array(0, np.float32), "lo"), nh.from_array(np.array(6, np.float32), "hi")]
        nodes.append(helper.make_node("Clip", [y, "lo", "hi"], ["y"], name="act"))
        y = "y"
    outs = [tinfo(y, [1, 4, 5, 5])]
    if extra_reader:
        nodes.append(helper.make_node("Neg", ["c"], ["spy"], name="spy"))
        outs.append(tinfo("spy", [1, 4, 5, 5]))
    return model_from_proto(make_model(nodes, [tinfo("x", [1, 3, 5, 5])], outs, inits)).graph


@pytest.mark.parametrize("bn,act,variant", [(True, "Relu", "conv_bn_act"), (True, "Clip", "conv_bn_act"),
                                            (False, "Relu", "conv_act"), (True, None, "conv_bn")])
def test_conv_variants(bn, act, variant):
    ms = find_matches(_conv_model(bn, act), "conv_bn_act")
    assert [m.pattern for m in ms] == [variant]
    assert ms[0].nodes[0].op_type == "Conv"


def test_conv_alone_is_not_a_supergroup():
    assert find_matches(_conv_model(False, None), "conv_bn_act") == []


def test_conv_output_read_elsewhere():
    g = _conv_model(True, "Relu", extra_reader=True)
    assert find_matches(g, "conv_bn_act") == []
    assert "spy" in explain(g, "conv_bn_act", "act")


def _linear(kind="matmul", bias_shape=(4,), commute=False, weight_const=True):
    from onnx import numpy_helper as nh
    inits = [nh.from_array(np.ones(bias_shape, np.float32), "b")]
    ins = [tinfo("x", [2, 3])]
    if weight_const:
        inits.append(nh.from_array(R.standard_normal((3, 4)).astype(np.float32), "w"))
    else:
        ins.append(tinfo("w", [3, 4]))
    mm = helper.make_node("MatMul" if kind == "matmul" else "Gemm", ["x", "w"], ["mm"], name="mm")
    add = helper.make_node("Add", ["b", "mm"] if commute else ["mm", "b"], ["y"], name="add")
    return model_from_proto(make_model([mm, add], ins, [tinfo("y", [2, 4])], inits)).graph


@pytest.mark.parametrize("kind", ["matmul", "gemm"])
@pytest.mark.parametrize("commute", [False, True])
def test_linear_matches(kind, commute):
    ms = find_matches(_linear(kind, commute=commute), "matmul_add")
    assert [m.pattern for m in ms] == [f"{kind}_add"]
    assert ms[0]["bias"].name == "b" and ms[0]["weight"].name == "w"
    assert ms[0].constants == {}  # weights and biases are foldable, not structural


def test_linear_bad_bias_or_dynamic_weight():
    g = _linear(bias_shape=(2, 4))
    assert find_matches(g, "matmul_add") == []
    assert "broadcasts" in explain(g, "matmul_add", "add")
    g = _linear(weight_const=False)
    assert find_matches(g, "matmul_add") == []
    assert "not constant" in explain(g, "matmul_add", "add")
