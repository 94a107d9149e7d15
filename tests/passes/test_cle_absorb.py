"""cle inside `quantize`: high-bias absorption from calibration statistics (exact on the
calibration data, only into a Conv that does not pad), no equalisation for per-channel weights, and a scale
clamped so the activation between a pair never widens: on a model where plain equalisation widens that
activation, cle must not lower W8A8 output SQNR (per-tensor or per-channel weights)."""
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

from qcompiler.ir import verify
from qcompiler.onnx_io import model_from_proto, model_to_proto
from qcompiler.passmanager import get_pass
from qcompiler.quant.core.context import QuantSettings
from tests.helpers import run, sqnr_db
from tests.patterns.builders import Builder

F = np.float32
SHAPE = (1, 3, 8, 8)


def _model(rng, pad2=0, bias_a=None, row_a=None, col_b=None):
    """x -> Conv a (8, 3x3) -> Relu -> Conv b (4, 1x1 or 3x3 padded)."""
    b = Builder(shape=SHAPE, opset=17)
    wa = rng.normal(size=(8, 3, 3, 3)).astype(F)
    if row_a is not None:
        wa *= np.asarray(row_a, F).reshape(-1, 1, 1, 1)
    ba = rng.normal(size=8).astype(F) if bias_a is None else np.asarray(bias_a, F)
    y = b.op("Conv", "x", b.const(wa, "wa"), b.const(ba, "ba"), name="a", pads=[1, 1, 1, 1])
    y = b.op("Relu", y, name="relu")
    k = 3 if pad2 else 1
    wb = rng.normal(size=(4, 8, k, k)).astype(F)
    if col_b is not None:
        wb *= np.asarray(col_b, F).reshape(1, -1, 1, 1)
    b.output(b.op("Conv", y, b.const(wb, "wb"), name="b", pads=[pad2] * 4), shape=(1, 4, 8, 8))
    return b.proto()


def _samples(rng, n=16):
    return [{"x": rng.uniform(-1, 1, size=SHAPE).astype(F)} for _ in range(n)]


def _cle(proto, samples, per_channel):
    m = model_from_proto(proto)
    ctx = SimpleNamespace(settings=QuantSettings(per_channel=per_channel), samples=samples, profile=None, notes=[])
    r = get_pass("cle").apply(m, ctx)
    verify(m.graph)
    return m, r, ctx


def _biases(m):
    return {n.name: (n.inputs[2].const_value() if len(n.inputs) > 2 and n.inputs[2] is not None else None)
            for n in m.graph if n.op_type == "Conv"}


HIGH = [12, 0, 9, 0, 0, 15, 0, 0]   # channels 0, 2, 5 never reach 0 on inputs in [-1, 1]


@pytest.mark.parametrize("per_channel", [True, False])
def test_high_bias_absorbed_exactly_on_calibration_data(per_channel):
    rng = np.random.default_rng(0)
    proto = _model(rng, bias_a=HIGH, row_a=[0.2] * 8)
    samples = _samples(rng)
    m, r, ctx = _cle(proto, samples, per_channel)
    assert r.stats["absorbed"] == {"a": 3}, r.stats
    assert r.stats["equalized"] == 0 or not per_channel, r.stats
    if per_channel:
        assert "per-channel" in r.stats["not_equalized"]["a"]
    assert any("high biases absorbed" in n for n in ctx.notes)
    b = _biases(m)
    assert b["a"][[0, 2, 5]].max() < 12 and b["b"] is not None   # b had no bias: created
    q = model_to_proto(m)
    for feed in samples:   # exact where x >= c: every calibration sample
        got, want = run(q, feed)[0], run(proto, feed)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_no_absorption_into_padded_conv_or_without_data():
    rng = np.random.default_rng(1)
    proto = _model(rng, pad2=1, bias_a=HIGH, row_a=[0.2] * 8)
    m, r, _ = _cle(proto, _samples(rng), True)
    assert r.stats["absorbed"] == {} and "pads" in r.stats["not_absorbed"]["a"], r.stats
    m = model_from_proto(proto)
    r = get_pass("cle").apply(m, None)   # `qcompiler run`: data-free
    assert r.stats["absorbed"] == {} and "no calibration" in r.stats["not_absorbed"]["a"], r.stats


def _widening(rng):
    """Conv a's channel 0 has tiny weights and a bias of 6: plain equalisation divides it by s_0 = sqrt(r1 / r2)
    ~ 0.05, and the activation between the pair (per-tensor grid) grows ~10x while no weight grid gains."""
    row = [0.002] + [1.0] * 7
    return _model(rng, pad2=1, bias_a=[6, 0, 0, 0, 0, 0, 0, 0], row_a=row)


def _quant_sqnr(proto, calib, test, per_channel, recipe):
    from qcompiler.quant import quantize
    res = quantize(proto, calib, per_channel=per_channel, recipe=recipe, min_sqnr=float("-inf"))
    q = model_to_proto(res.model)
    ref = np.concatenate([run(proto, f)[0] for f in test])
    return sqnr_db(ref, np.concatenate([run(q, f)[0] for f in test]))


@pytest.mark.parametrize("per_channel", [True, False])
def test_cle_never_lowers_w8a8_sqnr_where_equalisation_widens_activation(per_channel):
    rng = np.random.default_rng(2)
    proto = _widening(rng)
    calib, test = _samples(rng, 16), _samples(rng, 8)
    plain = _quant_sqnr(proto, calib, test, per_channel, None)
    cle = _quant_sqnr(proto, calib, test, per_channel, ["cle"])
    # the model is a real widening case: data-free equalisation (the old behaviour) then W8A8 is worse
    m = model_from_proto(proto)
    get_pass("cle").apply(m, None)
    old = _quant_sqnr(model_to_proto(m), calib, test, per_channel, None)
    assert old < plain - 1, (old, plain)
    assert cle >= plain - 0.05, (plain, cle, old)
