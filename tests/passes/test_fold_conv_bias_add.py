"""fold-conv-bias-add (FINDINGS §1 rule 3): Add(Conv, per-channel constant), including Paddle's
Add(conv, Reshape(Constant b, [1, C, 1, 1])), goes into the Conv's bias; outputs unchanged in onnxruntime;
anything not per-channel, not constant or read elsewhere stays."""
import numpy as np
import pytest
from onnx import helper, numpy_helper

from qcompiler.ir import verify
from qcompiler.onnx_io import model_from_proto
from qcompiler.passmanager import run_pipeline
from qcompiler.passmanager.instrumentation import Verifier
from tests.helpers import run
from tests.patterns.builders import Builder

RNG = np.random.default_rng(3)
C, CIN, HW = 4, 3, 5
F = np.float32
OUT = ["n", "c", "h", "w"]   # rank only


def _conv(b, op="Conv", bias=True, w_name=None, b_name=None, group=1):
    if op == "Conv":
        w = b.const(RNG.normal(size=(C, CIN // group, 3, 3)).astype(F), w_name)
    else:
        w = b.const(RNG.normal(size=(CIN, C // group, 3, 3)).astype(F), w_name)
    ins = ["x", w] + ([b.const(RNG.normal(size=C).astype(F), b_name)] if bias else [])
    return b.op(op, *ins, name="conv", pads=[1, 1, 1, 1], group=group)


def _fold(proto):
    m = model_from_proto(proto)
    (_, r), = run_pipeline(m, "fold-conv-bias-add", [Verifier()])
    verify(m.graph)
    return m, r


def _same(proto, m):
    x = RNG.normal(size=(2, CIN, HW, HW)).astype(F)
    got, want = run(m, {"x": x}), run(proto, {"x": x})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def _paddle_reshape(b, vec, as_node=True, target=(1, C, 1, 1)):
    src = b.const(vec, as_node=as_node)
    return b.op("Reshape", src, b.const(np.array(target, np.int64), as_node=as_node))


def _unsqueeze(b, vec):
    return b.op("Unsqueeze", b.const(vec), b.const(np.array([0, 2, 3], np.int64)))


SPELLINGS = [
    ("1C11", lambda b, v: b.const(v.reshape(1, C, 1, 1))),
    ("C11", lambda b, v: b.const(v.reshape(C, 1, 1))),
    ("C11_node", lambda b, v: b.const(v.reshape(C, 1, 1), as_node=True)),
    ("scalar", lambda b, v: b.const(np.float32(v[0]))),
    ("paddle_reshape", lambda b, v: _paddle_reshape(b, v)),
    ("reshape_minus1", lambda b, v: _paddle_reshape(b, v, as_node=False, target=(1, -1, 1, 1))),
    ("unsqueeze", _unsqueeze),
]


@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("name,spell", SPELLINGS, ids=[s[0] for s in SPELLINGS])
@pytest.mark.parametrize("const_first", [False, True])
def test_per_channel_add_folds_into_bias(name, spell, bias, op, const_first):
    b = Builder(shape=(2, CIN, HW, HW), opset=13)
    y = _conv(b, op, bias)
    c = spell(b, RNG.normal(size=C).astype(F))
    out = b.op("Add", c, y, name="bias_add") if const_first else b.op("Add", y, c, name="bias_add")
    b.output(b.op("Relu", out), shape=None)
    b.outputs[-1] = helper.make_tensor_value_info(b.outputs[-1].name, 1, OUT)
    proto = b.proto()
    m, r = _fold(proto)
    assert r.stats["folded"] == 1, r.stats
    assert [n.op_type for n in m.graph if n.op_type != "Constant"] == [op, "Relu"]
    assert not [n for n in m.graph if n.op_type == "Constant"]   # Paddle's Constant b and shape went too
    assert len(m.graph.nodes[0].inputs) == 3
    _same(proto, m)


def test_add_output_is_graph_output_keeps_its_name():
    b = Builder(shape=(2, CIN, HW, HW), opset=13)
    y = b.op("Add", _conv(b), _paddle_reshape(b, RNG.normal(size=C).astype(F)), name="bias_add")
    b.output(y, shape=None)
    b.outputs[-1] = helper.make_tensor_value_info(y, 1, OUT)
    proto = b.proto()
    m, r = _fold(proto)
    assert r.stats["folded"] == 1 and [n.op_type for n in m.graph] == ["Conv"]
    assert m.graph.outputs[0].name == y
    _same(proto, m)


def test_shared_bias_and_shared_constant_copy_on_write():
    """Two Convs share one bias initializer; two Adds share one constant: each fold writes a private copy."""
    b = Builder(shape=(2, CIN, HW, HW), opset=13)
    w = b.const(RNG.normal(size=(C, CIN, 3, 3)).astype(F), "w")
    bias = b.const(RNG.normal(size=C).astype(F), "shared_bias")
    add_c = b.const(RNG.normal(size=(1, C, 1, 1)).astype(F), "shared_add")
    y1 = b.op("Add", b.op("Conv", "x", w, bias, pads=[1, 1, 1, 1], name="c1"), add_c, name="a1")
    y2 = b.op("Conv", "x", w, bias, pads=[1, 1, 1, 1], name="c2")       # reads the bias, no Add
    y3 = b.op("Add", b.op("Relu", y2), add_c, name="a3")                 # reads the Add constant, not after a Conv
    for y in (y1, y3):
        b.output(y, shape=None)
        b.outputs[-1] = helper.make_tensor_value_info(y, 1, OUT)
    proto = b.proto()
    m, r = _fold(proto)
    assert r.stats["folded"] == 1
    g = m.graph
    assert "shared_bias" in g.initializers and "shared_add" in g.initializers
    orig = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    for name in ("shared_bias", "shared_add"):
        np.testing.assert_array_equal(g.initializers[name].const_value(), orig[name])
    c1 = g.node("c1") if hasattr(g, "node") else [n for n in g if n.name == "c1"][0]
    assert c1.inputs[2].name != "shared_bias"
    _same(proto, m)


def _kept(proto, words):
    m, r = _fold(proto)
    assert r.stats["folded"] == 0 and "Add" in {n.op_type for n in m.graph}, r.stats
    reason = " ".join(r.stats["kept_reasons"].values())
    assert words in reason, reason
    _same(proto, m)


def _one_output(b, y):
    b.output(y, shape=None)
    b.outputs[-1] = helper.make_tensor_value_info(y, 1, OUT)
    return b.proto()


def test_full_tensor_not_folded():
    b = Builder(shape=(2, CIN, HW, HW), opset=13)
    y = b.op("Add", _conv(b), b.const(RNG.normal(size=(1, C, HW, HW)).astype(F)))
    _kept(_one_output(b, y), "not per output channel")


def test_vector_C_lines_up_with_width_not_channels():
    """[C] against (N, C, H, W) broadcasts along W (numpy rules); with W == C it runs, but it is not a bias."""
    b = Builder(shape=(2, CIN, C, C), opset=13)
    y = b.op("Add", _conv(b), b.const(RNG.normal(size=C).astype(F)))
    proto = _one_output(b, y)
    m, r = _fold(proto)
    assert r.stats["folded"] == 0 and "not per output channel" in " ".join(r.stats["kept_reasons"].values())


def test_not_constant_not_folded():
    b = Builder(shape=(2, CIN, HW, HW), opset=13)
    b.input("t", (1, C, 1, 1))
    y = b.op("Add", _conv(b), "t")
    proto = _one_output(b, y)
    m, r = _fold(proto)
    assert r.stats["folded"] == 0 and r.stats["kept"] == 0   # Add(conv, activation) is not a bias candidate
    x = RNG.normal(size=(2, CIN, HW, HW)).astype(F)
    t = RNG.normal(size=(1, C, 1, 1)).astype(F)
    np.testing.assert_allclose(run(m, {"x": x, "t": t})[0], run(proto, {"x": x, "t": t})[0], rtol=1e-6)


def test_conv_output_read_twice_or_graph_output_not_folded():
    b = Builder(shape=(2, CIN, HW, HW), opset=13)
    c = _conv(b)
    y = b.op("Add", c, b.const(RNG.normal(size=(1, C, 1, 1)).astype(F)))
    b.output(b.op("Mul", y, b.op("Relu", c)), shape=None)
    b.outputs[-1] = helper.make_tensor_value_info(b.outputs[-1].name, 1, OUT)
    _kept(b.proto(), "2 uses")
    b = Builder(shape=(2, CIN, HW, HW), opset=13)
    c = _conv(b)
    y = b.op("Add", c, b.const(RNG.normal(size=(1, C, 1, 1)).astype(F)))
    for v in (y, c):
        b.output(v, shape=None)
        b.outputs[-1] = helper.make_tensor_value_info(v, 1, OUT)
    _kept(b.proto(), "graph output")


def test_grouped_conv_transpose_channels():
    b = Builder(shape=(2, CIN + 1, HW, HW), opset=13)
    w = b.const(RNG.normal(size=(CIN + 1, C // 2, 3, 3)).astype(F))
    y = b.op("ConvTranspose", "x", w, group=2, name="ct")
    y = b.op("Add", y, _paddle_reshape(b, RNG.normal(size=C).astype(F)))
    proto = _one_output(b, y)
    m, r = _fold(proto)
    assert r.stats["folded"] == 1 and [n.op_type for n in m.graph] == ["ConvTranspose"]
    x = RNG.normal(size=(2, CIN + 1, HW, HW)).astype(F)
    np.testing.assert_allclose(run(m, {"x": x})[0], run(proto, {"x": x})[0], rtol=1e-5, atol=1e-5)
