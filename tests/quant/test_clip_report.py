"""What a clipping scheme may clip, and the report's view of it: values that reach a graph output keep their
min/max under every scheme; `calibrate.clipped_fractions` / `clip_warnings` name values whose grid leaves out
more than `observers.CLIP_WARN_FRACTION` of their observed range."""
import numpy as np
import pytest
from onnx import helper, numpy_helper

from qcompiler.onnx_io import model_from_proto
from qcompiler.quant.calibration.calibrate import calibrate, clip_warnings, clipped_fractions, output_adjacent
from qcompiler.quant.core.encoding import compute_encoding
from qcompiler.quant.calibration.observers import CLIP_WARN_FRACTION
from tests.helpers import make_model, tinfo


def _model():
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((32, 4)).astype(np.float32) * 0.2, "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["logits"], name="mm2"),
             helper.make_node("Softmax", ["logits"], ["probs"], name="softmax", axis=-1)]
    return model_from_proto(make_model(nodes, [tinfo("x", [1, 16])], [tinfo("probs", [1, 4])], [w1, w2]))


def _samples(n=400):
    rng = np.random.default_rng(1)
    return [{"x": rng.laplace(size=(1, 16)).astype(np.float32)} for _ in range(n)]


def test_output_adjacent_follows_softmax_back_to_the_logits():
    assert output_adjacent(_model()) == {"probs", "logits"}


@pytest.mark.parametrize("scheme", ["percentile", "entropy", "mse", "tf_enhanced"])
def test_logits_keep_their_extremes_and_inner_values_may_clip(scheme):
    model = _model()
    cal = calibrate(model, _samples(), scheme=scheme, observer_opts={"percentile": 99.0} if scheme == "percentile"
                    else None)
    logits = cal.observers["logits"]
    assert logits.keep_extremes and logits.range() == (logits.min, logits.max)
    if scheme == "percentile":       # an inner ReLU output loses its top 1%
        r = cal.observers["r"]
        assert r.range()[1] < r.max


def test_clipped_fractions_and_warnings():
    model = _model()
    cal = calibrate(model, _samples(), scheme="percentile", observer_opts={"percentile": 90.0})
    acts = {}
    for name, obs in cal.observers.items():
        lo, hi = obs.range()
        acts[name] = compute_encoding(lo, hi, bits=8, symmetric=False)
    fr = clipped_fractions(cal, acts)
    assert fr["logits"] == 0.0 and fr["probs"] == 0.0
    r = cal.observers["r"]
    want = (r.max - r.range()[1]) / (r.max - r.min)
    assert fr["r"] == pytest.approx(want, abs=0.01) and fr["r"] > CLIP_WARN_FRACTION
    lines = clip_warnings(fr)
    assert len(lines) == sum(f > CLIP_WARN_FRACTION for f in fr.values()) and "'r'" in lines[0]
    assert all("\n" not in ln and "% of the observed range" in ln for ln in lines)
    assert clip_warnings(fr, limit=1.0) == []
    # min_max clips nothing
    cal = calibrate(model, _samples(50), scheme="min_max")
    acts = {n: compute_encoding(*o.range(), bits=8, symmetric=False) for n, o in cal.observers.items()}
    assert max(clipped_fractions(cal, acts).values()) < 0.01


def test_quantize_report_lists_clipped_values_and_warns_over_the_limit(tiny, monkeypatch):
    from qcompiler.quant.calibration import observers
    from qcompiler.quant.api import quantize
    m, c = str(tiny / "tiny_cnn.onnx"), str(tiny / "tiny_cnn_calib.npz")
    plain = quantize(m, c, scheme="min_max")
    assert plain.report["clipped"] == {} and not [w for w in plain.report["warnings"] if w["kind"] == "activation"]
    clipped = quantize(m, c, scheme="mse")
    assert clipped.report["clipped"] and all(0 < f <= 1 for f in clipped.report["clipped"].values())
    import qcompiler.quant.api as api   # the report's check reads the limit where api imported it
    monkeypatch.setattr(api, "CLIP_WARN_FRACTION", min(clipped.report["clipped"].values()) / 2)
    warned = quantize(m, c, scheme="mse")
    acts = [w for w in warned.report["warnings"] if w["kind"] == "activation"]
    assert {w["value"] for w in acts} == set(warned.report["clipped"])
    assert all("outside its mse grid" in w["problem"] for w in acts)
