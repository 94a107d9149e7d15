import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from qcompiler.ir import verify
from qcompiler.onnx_io import model_from_proto, model_to_proto
from qcompiler.passes.scale_folding import FoldScaleMul, fold_scale_into_consumers, fold_scale_into_producer
from tests.helpers import make_model, run, tinfo

RNG = np.random.default_rng(1)
T, D, H = 8, 16, 64  # tokens, model width, MLP width (ViT uses 3072)


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr, np.float32), name)


def _vit_mlp_blocks(n_blocks=3):
    """n ViT MLP blocks: MatMul -> Add -> GELU(erf) -> MatMul -> Add, every GELU reading one shared 0.5."""
    nodes, inits = [], [_init("half", 0.5), _init("one", 1.0), _init("sqrt2", np.sqrt(2.0))]
    x = "x"
    for b in range(n_blocks):
        p = f"b{b}"
        inits += [_init(f"{p}_w1", RNG.normal(size=(D, H)) / 4), _init(f"{p}_b1", RNG.normal(size=H) / 4),
                  _init(f"{p}_w2", RNG.normal(size=(H, D)) / 8), _init(f"{p}_b2", RNG.normal(size=D) / 4)]
        nodes += [helper.make_node("MatMul", [x, f"{p}_w1"], [f"{p}_mm1"], name=f"{p}_fc1"),
                  helper.make_node("Add", [f"{p}_mm1", f"{p}_b1"], [f"{p}_h"], name=f"{p}_fc1_bias"),
                  helper.make_node("Div", [f"{p}_h", "sqrt2"], [f"{p}_d"], name=f"{p}_gelu_div"),
                  helper.make_node("Erf", [f"{p}_d"], [f"{p}_e"], name=f"{p}_gelu_erf"),
                  helper.make_node("Add", [f"{p}_e", "one"], [f"{p}_e1"], name=f"{p}_gelu_add"),
                  helper.make_node("Mul", [f"{p}_h", f"{p}_e1"], [f"{p}_t"], name=f"{p}_gelu_mul"),
                  helper.make_node("Mul", [f"{p}_t", "half"], [f"{p}_g"], name=f"{p}_gelu_half"),
                  helper.make_node("MatMul", [f"{p}_g", f"{p}_w2"], [f"{p}_mm2"], name=f"{p}_fc2"),
                  helper.make_node("Add", [f"{p}_mm2", f"{p}_b2"], [f"{p}_y"], name=f"{p}_fc2_bias")]
        x = f"{p}_y"
    proto = make_model(nodes, [tinfo("x", [1, T, D])], [tinfo(x, [1, T, D])], inits)
    return onnx.shape_inference.infer_shapes(proto)


def _compare(proto, m, feeds, rtol=1e-4, atol=1e-5):
    verify(m.graph)
    out = model_to_proto(m)
    onnx.checker.check_model(out)
    for a, b in zip(run(proto, feeds), run(out, feeds)):
        np.testing.assert_allclose(b, a, rtol=rtol, atol=atol)
    return out


def test_smoothquant_fold_into_shared_gelu_half_copies_on_write():
    proto = _vit_mlp_blocks()
    m = model_from_proto(proto)
    g = m.graph
    s = RNG.uniform(0.5, 2.0, H)
    x = g.value("b1_g")
    ok, reason = fold_scale_into_producer(g, x, 1.0 / s, axis=-1)
    assert ok, reason
    ok, reason = fold_scale_into_consumers(g, x, s, axis=-1)
    assert ok, reason
    half = g.value("half")
    assert half.const_value().shape == () and float(half.const_value()) == 0.5
    readers = sorted(n.name for n in half.consumers())
    assert readers == ["b0_gelu_half", "b2_gelu_half"]  # the other GELUs are untouched
    mul = [n for n in g if n.name == "b1_gelu_half"][0]
    assert mul.inputs[1].const_value().shape == (H,)
    feeds = {"x": RNG.normal(size=(1, T, D)).astype(np.float32)}
    ref = run(proto, feeds)[0]
    got = run(_compare(proto, m, feeds), feeds)[0]
    rel = np.max(np.abs(got - ref)) / np.max(np.abs(ref))
    assert rel < 1e-5, rel


@pytest.mark.parametrize("how", ["argument", "meta"])
def test_protected_gelu_half_is_refused_and_nothing_written(how):
    proto = _vit_mlp_blocks()
    m = model_from_proto(proto)
    g = m.graph
    protected = None
    if how == "argument":
        protected = {"half"}
    else:
        g.value("half").meta = {"supergroup": "gelu"}
    ok, reason = fold_scale_into_producer(g, g.value("b1_g"), np.full(H, 0.5), axis=-1, protected=protected)
    assert not ok and "protected" in reason and "half" in reason
    assert len(g.value("half").consumers()) == 3
    out = _compare(proto, m, {"x": RNG.normal(size=(1, T, D)).astype(np.float32)}, rtol=0, atol=0)
    assert len(out.graph.initializer) == len(proto.graph.initializer)


def test_broadcast_unknown_rank_is_refused():
    proto = _vit_mlp_blocks()
    del proto.graph.value_info[:]  # no shapes: a scalar cannot be proven to expand safely
    m = model_from_proto(proto)
    ok, reason = fold_scale_into_producer(m.graph, m.graph.value("b0_g"), np.full(H, 2.0), axis=-1)
    assert not ok and "unknown" in reason


def test_wrong_channel_count_is_refused():
    m = model_from_proto(_vit_mlp_blocks())
    g = m.graph
    ok, reason = fold_scale_into_producer(g, g.value("b0_g"), np.full(H // 2, 2.0), axis=-1)
    assert not ok and "channels" in reason
    ok, reason = fold_scale_into_consumers(g, g.value("b0_g"), np.full(H // 2, 2.0), axis=-1)
    assert not ok
    ok, reason = fold_scale_into_producer(g, g.value("b0_h"), np.full(H, 2.0), axis=1)
    assert not ok and "axis" in reason
    verify(g)


def test_consumers_not_all_linear_is_refused():
    m = model_from_proto(_vit_mlp_blocks())
    g = m.graph
    ok, reason = fold_scale_into_consumers(g, g.value("b0_h"), np.full(H, 2.0), axis=-1)  # read by Div and Mul
    assert not ok and "not a linear op" in reason
    ok, reason = fold_scale_into_consumers(g, g.value("b2_y"), np.full(D, 2.0), axis=-1)
    assert not ok and "graph output" in reason


def test_producer_matmul_add_and_consumer_matmul():
    proto = _vit_mlp_blocks(1)
    m = model_from_proto(proto)
    g = m.graph
    s = RNG.uniform(0.5, 2.0, D)
    y = g.value("b0_y")
    # b0_y is a graph output, so scaling it changes the output: check the scaled result, not equality
    ok, reason = fold_scale_into_producer(g, y, s, axis=-1)
    assert ok, reason
    verify(g)
    feeds = {"x": RNG.normal(size=(1, T, D)).astype(np.float32)}
    np.testing.assert_allclose(run(m, feeds)[0], run(proto, feeds)[0] * s.astype(np.float32), rtol=1e-4, atol=1e-5)


def _conv_chain():
    inits = [_init("w1", RNG.normal(size=(6, 3, 3, 3))), _init("b1", RNG.normal(size=6)),
             _init("w3", RNG.normal(size=(4, 3, 1, 1))), _init("gt", RNG.normal(size=(6, 5))),
             _init("sc", RNG.uniform(0.5, 2, (1, 6, 1, 1)))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("Conv", ["x", "w1"], ["c2"], pads=[1, 1, 1, 1], name="conv2_shares_w1"),
             helper.make_node("Mul", ["c1", "sc"], ["m1"], name="scale1"),
             helper.make_node("Relu", ["m1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w3"], ["y1"], group=2, name="gconv"),
             helper.make_node("Add", ["c2", "c2"], ["y2"], name="add")]
    return make_model(nodes, [tinfo("x", [1, 3, 5, 5])], [tinfo("y1", [1, 4, 5, 5]), tinfo("y2", [1, 6, 5, 5])], inits)


def test_fold_scale_pass_into_conv_with_shared_weight():
    proto = onnx.shape_inference.infer_shapes(_conv_chain())
    m = model_from_proto(proto)
    r = FoldScaleMul().run(m)
    assert r.stats["folded"] == 1 and not m.graph.nodes_by_op("Mul"), r.stats
    conv1, conv2 = m.graph.nodes_by_op("Conv")[:2]
    assert conv2.inputs[1].name == "w1" and conv1.inputs[1] is not conv2.inputs[1]  # copy on write
    _compare(proto, m, {"x": RNG.normal(size=(1, 3, 5, 5)).astype(np.float32)})


def test_consumer_fold_into_grouped_conv_and_gemm():
    inits = [_init("w", RNG.normal(size=(4, 3, 1, 1))), _init("gb", RNG.normal(size=(5, 6))),
             _init("gc", RNG.normal(size=(6, 5)))]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w"], ["y1"], group=2, name="gconv"),
             helper.make_node("Relu", ["v"], ["rv"], name="relu2"),
             helper.make_node("Gemm", ["rv", "gb"], ["y2"], transB=1, name="gemm_tb"),
             helper.make_node("Gemm", ["rv", "gc"], ["y3"], name="gemm")]
    proto = onnx.shape_inference.infer_shapes(make_model(
        nodes, [tinfo("x", [1, 6, 3, 3]), tinfo("v", [2, 6])],
        [tinfo("y1", [1, 4, 3, 3]), tinfo("y2", [2, 5]), tinfo("y3", [2, 5])], inits))
    m = model_from_proto(proto)
    g = m.graph
    s1, s2 = RNG.uniform(0.5, 2, 6), RNG.uniform(0.5, 2, 6)
    ok, reason = fold_scale_into_consumers(g, g.value("r"), s1, axis=1)
    assert ok, reason
    ok, reason = fold_scale_into_consumers(g, g.value("rv"), s2, axis=-1)
    assert ok, reason
    verify(g)
    feeds = {"x": RNG.normal(size=(1, 6, 3, 3)).astype(np.float32), "v": RNG.normal(size=(2, 6)).astype(np.float32)}
    ref = run(proto, {"x": feeds["x"] * s1.reshape(1, 6, 1, 1).astype(np.float32),
                      "v": feeds["v"] * s2.astype(np.float32)})
    for a, b in zip(ref, run(m, feeds)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


def test_fold_scale_pass_leaves_gelu_scalars_alone():
    proto = _vit_mlp_blocks()
    m = model_from_proto(proto)
    r = FoldScaleMul().run(m)
    assert r.stats["folded"] == 0 and len(m.graph.nodes_by_op("Mul")) == 6, r.stats
    assert all("scalar" in why or "no constant" in why for why in r.stats["kept_reasons"].values())
    _compare(proto, m, {"x": RNG.normal(size=(1, T, D)).astype(np.float32)}, rtol=0, atol=0)
