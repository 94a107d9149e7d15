"""Widening weighs what it costs (placement/widening.py): on ort_cpu a value widened to 16 bits turns its Conv
reader float (no 16-bit integer kernel), so a value whose 8-bit grid is still fair keeps 8 bits when that reader
is heavy, and is widened as before when the reader is light or the user asked for accuracy."""
from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from qcompiler.onnx_io import model_to_proto
from qcompiler.quant.api import quantize
from qcompiler.quant.runtime.kernels import kernel_report
from qcompiler.sqnr import sqnr_db
from tests.helpers import make_model, run, tinfo

F = np.float32


def _bn_then_conv(cout, hw, spike=17.0, head=(1, 8), seed=0):
    """x -> BatchNormalization (unfused: nothing before it to fold into) -> Conv 3x3 -> Relu -> Conv head -> y.
    The input is normal with one value of +-`spike` per sample, so the BatchNorm output's 8-bit min/max grid
    gives about 20 log10(440 / spike) dB: ~28 dB at 17, ~20 dB at 45."""
    rng = np.random.default_rng(seed)
    k, n = head
    c = 16
    inits = [numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(F), "g"),
             numpy_helper.from_array((rng.normal(size=c) * 0.1).astype(F), "b"),
             numpy_helper.from_array((rng.normal(size=c) * 0.1).astype(F), "mu"),
             numpy_helper.from_array(rng.uniform(0.5, 2.0, c).astype(F), "var"),
             numpy_helper.from_array((rng.normal(size=(cout, c, 3, 3)) / np.sqrt(9 * c)).astype(F), "w1"),
             numpy_helper.from_array((rng.normal(size=(n, cout, k, k)) / np.sqrt(cout * k * k)).astype(F), "w2")]
    nodes = [helper.make_node("BatchNormalization", ["x", "g", "b", "mu", "var"], ["bn"], name="bn"),
             helper.make_node("Conv", ["bn", "w1"], ["c1"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
             helper.make_node("Conv", ["r1", "w2"], ["y"], name="head", pads=[k // 2] * 4)]
    m = make_model(nodes, [tinfo("x", [1, c, hw, hw])], [tinfo("y", [1, n, hw, hw])], inits, opset=13)

    def sample():
        x = rng.normal(size=(1, c, hw, hw)).astype(F)
        x.flat[rng.integers(x.size)] = spike * rng.choice([-1.0, 1.0])
        return {"x": x}
    return m, [sample() for _ in range(8)]


def _conv_row(res):
    return {n.node: n for n in kernel_report(res.model).nodes}["conv"]


def test_a_heavy_conv_keeps_its_integer_kernel_behind_a_fair_8bit_value():
    m, cal = _bn_then_conv(cout=64, hw=32)
    acc = quantize(m, cal, optimize="accuracy")
    assert acc.plan.spec("bn").bits == 16 and acc.plan.spec("bn").widened   # widened when accuracy is asked
    assert not _conv_row(acc).integer
    res = quantize(m, cal)
    spec = res.plan.spec("bn")
    assert spec.bits == 8 and not spec.keep_float and "kept 8-bit" in spec.source, spec
    assert "Conv 'conv'" in spec.source and _conv_row(res).integer, _conv_row(res)
    q = model_to_proto(res.model)
    worst = min(sqnr_db(run(m, f)[0], run(q, f)[0]) for f in cal)
    assert worst >= 25, worst


def test_a_large_gain_or_a_light_reader_still_gets_the_wide_grid_or_float():
    for kw in ({"spike": 45.0},                             # 8 bits give ~20 dB: too much to give up
               {"head": (3, 64)}):                          # the 3x3 head holds most of the compute
        m, cal = _bn_then_conv(cout=64 if "spike" in kw else 16, hw=32 if "spike" in kw else 16, **kw)
        spec = quantize(m, cal).plan.spec("bn")
        assert spec.keep_float or spec.bits == 16, (kw, spec)
        assert "kept 8-bit" not in spec.source
