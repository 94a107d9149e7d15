"""fuse-hardswish (FINDINGS §1 rule 2): exporter spellings of x·Relu6(x+3)/6 and x·HardSigmoid(x)
become one HardSwish op at opset >= 14; outputs unchanged in onnxruntime; refusals leave the graph alone."""
import numpy as np
import onnx
import pytest
from onnx import version_converter

from qcompiler.ir import verify
from qcompiler.onnx_io import model_from_proto
from qcompiler.passmanager import run_pipeline
from qcompiler.passmanager.instrumentation import Verifier
from tests.helpers import run
from tests.patterns import idioms
from tests.patterns.builders import Builder, hardswish

RNG = np.random.default_rng(13)
SHAPE = (2, 4, 3, 3)


def _x():
    return (RNG.normal(size=SHAPE) * 4).astype(np.float32)   # covers x < -3, -3..3 and x > 3


def _fuse(proto):
    m = model_from_proto(proto)
    (_, r), = run_pipeline(m, "fuse-hardswish", [Verifier()])
    verify(m.graph)
    return m, r


def _same(proto, m, atol=1e-6):
    x = _x()
    np.testing.assert_allclose(run(m, {"x": x})[0], run(proto, {"x": x})[0], rtol=1e-5, atol=atol)


SPELLINGS = [
    ("paddle_div", lambda b: hardswish(b, "x", form="div")),
    ("mul_sixth", lambda b: hardswish(b, "x", form="mul")),
    ("gate_div", lambda b: hardswish(b, "x", form="gate")),
    ("const_nodes", lambda b: hardswish(b, "x", form="div", as_nodes=True)),
    ("minmax", lambda b: idioms.hardswish(b, "x", relu6="minmax")),
    ("maxmin_mul", lambda b: idioms.hardswish(b, "x", relu6="maxmin", six="mul")),
    ("relu_min", lambda b: idioms.hardswish(b, "x", relu6="relu_min")),
    ("hardsigmoid", lambda b: b.op("Mul", "x", b.op("HardSigmoid", "x", alpha=1 / 6, beta=0.5), name="gate")),
    ("hardsigmoid_rev", lambda b: b.op("Mul", b.op("HardSigmoid", "x", alpha=1 / 6, beta=0.5), "x")),
]


@pytest.mark.parametrize("opset", [14, 21])
@pytest.mark.parametrize("name,spell", SPELLINGS, ids=[s[0] for s in SPELLINGS])
def test_spellings_fuse_to_one_hardswish(name, spell, opset):
    b = Builder(shape=SHAPE, opset=opset)
    b.output(spell(b))
    proto = b.proto()
    m, r = _fuse(proto)
    assert r.stats["fused"] == 1, r.stats
    assert [n.op_type for n in m.graph] == ["HardSwish"]
    assert not m.graph.initializers    # the structure's own constants went with it
    assert [v.name for v in m.graph.outputs] == [o.name for o in proto.graph.output]
    _same(proto, m)


def test_clip_attributes_opset10_fused_after_conversion_and_kept_before():
    b = Builder(shape=SHAPE, opset=10)
    b.output(hardswish(b, "x", clip_inputs=False))
    proto = b.proto()
    m, r = _fuse(proto)
    assert r.stats["fused"] == 0 and "opset 10 < 14" in r.stats["reason"]
    assert "Clip" in {n.op_type for n in m.graph}
    conv = version_converter.convert_version(proto, 14)   # what convert-opset does
    m2, r2 = _fuse(conv)
    assert r2.stats["fused"] == 1 and [n.op_type for n in m2.graph] == ["HardSwish"]
    _same(proto, m2)


def test_opset13_kept():
    b = Builder(shape=SHAPE, opset=13)
    b.output(hardswish(b, "x"))
    m, r = _fuse(b.proto())
    assert not r.modified and r.stats["kept"] == 1 and "opset 13 < 14" in r.stats["reason"]


@pytest.mark.parametrize("shift,div_op,div,what", [(3.0, "Mul", 0.1667, "sixth"), (3.001, "Div", 6.0, "three"),
                                                    (3.0, "Div", 6.002, "six")])
def test_constants_checked_to_1e6(shift, div_op, div, what):
    """The pattern recognises at rtol 1e-3; the rewrite needs the numbers exact."""
    b = Builder(shape=SHAPE, opset=14)
    c = b.op("Clip", b.op("Add", "x", b.const(shift)), b.const(0.0), b.const(6.0))
    b.output(b.op(div_op, b.op("Mul", "x", c), b.const(div)))
    proto = b.proto()
    m, r = _fuse(proto)
    assert r.stats["fused"] == 0 and r.stats["kept"] == 1, r.stats
    assert what in next(iter(r.stats["kept_reasons"].values()))
    assert "HardSwish" not in {n.op_type for n in m.graph}
    _same(proto, m)


def test_hardsigmoid_alpha_off_by_1e4_kept():
    b = Builder(shape=SHAPE, opset=14)
    b.output(b.op("Mul", "x", b.op("HardSigmoid", "x", alpha=1 / 6 + 2e-5, beta=0.5)))
    m, r = _fuse(b.proto())
    assert r.stats["fused"] == 0 and "alpha" in next(iter(r.stats["kept_reasons"].values()))


def test_interior_read_outside_or_graph_output_not_fused():
    for tap in ("reader", "output"):
        b = Builder(shape=SHAPE, opset=14)
        y = hardswish(b, "x")
        b.output(y)
        if tap == "reader":
            b.output(b.op("Neg", "clip_out"))
        else:
            b.output("clip_out")
        proto = b.proto()
        m, r = _fuse(proto)
        assert r.stats["fused"] == 0 and "HardSwish" not in {n.op_type for n in m.graph}, tap
        _same(proto, m)


def test_final_output_read_elsewhere_keeps_name_and_shared_constant_stays():
    b = Builder(shape=SHAPE, opset=14)
    three = b.const(3.0, "three")
    a = b.op("Add", "x", three, name="add3")
    y = b.op("Div", b.op("Mul", "x", b.op("Clip", a, b.const(0.0), b.const(6.0))), b.const(6.0), name="div6")
    b.output(y)
    b.output(b.op("Add", y, three, name="other"))     # reads the final output and the shared 3
    proto = b.proto()
    m, r = _fuse(proto)
    assert r.stats["fused"] == 1
    assert sorted(n.op_type for n in m.graph) == ["Add", "HardSwish"]
    assert "three" in m.graph.initializers
    assert m.graph.outputs[0].name == y and m.graph.outputs[0].producer.op_type == "HardSwish"
    _same(proto, m)


def test_rank_widening_constant_not_fused():
    b = Builder(shape=(2, 4), opset=14)
    a = b.op("Add", "x", b.const(np.full((1, 1, 1), 3.0, np.float32)))
    y = b.op("Div", b.op("Mul", "x", b.op("Clip", a, b.const(0.0), b.const(6.0))), b.const(6.0))
    b.output(y, shape=(1, 2, 4))
    m, r = _fuse(b.proto())
    assert r.stats["fused"] == 0 and "higher rank" in next(iter(r.stats["kept_reasons"].values()))


def test_conv_then_hardswish_chain_fuses_each():
    b = Builder(shape=SHAPE, opset=14)
    y = "x"
    for i in range(3):
        w = b.const((RNG.normal(size=(4, 4, 1, 1)) * 0.5).astype(np.float32), f"w{i}")
        y = b.op("Conv", y, w, name=f"conv{i}")
        c = b.op("Clip", b.op("Add", y, b.const(3.0)), b.const(0.0), b.const(6.0))
        y = b.op("Div", b.op("Mul", y, c), b.const(6.0)) if i % 2 else b.op("Mul", b.op("Mul", c, y), b.const(1 / 6))
    b.output(y)
    proto = b.proto()
    m, r = _fuse(proto)
    assert r.stats["fused"] == 3
    assert [n.op_type for n in m.graph] == ["Conv", "HardSwish"] * 3
    _same(proto, m, atol=1e-5)
