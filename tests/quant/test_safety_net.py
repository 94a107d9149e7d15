"""the safety net finds the activation quantizers that break the output (a LayerNorm the patterns
do not recognise, written as E[x²]−E[x]² in tf2onnx's idiom, on inputs with a large mean: catastrophic
cancellation in 8 bits) and widens them to 16 bits or keeps them float until the output SQNR reaches the floor."""
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from qcompiler.cli import main
from qcompiler.errors import ArgumentError
from qcompiler.quant import quantize
from qcompiler.quant.core.switches import DEFAULT_MIN_SQNR_DB, check_min_sqnr

OFF = float("-inf")   # min_sqnr=-inf: no floor, the net never runs


def ln_moments_model(d=64, mean=100.0, n=32):
    """Relu -> LayerNorm as tf2onnx writes it (ReduceSum·1/N, Mul(x, x), E[x²]−E[x]², Max(0, ·), Sqrt+Reciprocal,
    γ folded before the centring Sub) -> MatMul; inputs of mean `mean` and std 1 (the variance cancels)."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(np.float32(1.0 / d), "invn"), nh.from_array(np.float32(1e-5), "eps"),
             nh.from_array(np.float32(0.0), "zero"), nh.from_array(np.array([-1], np.int64), "axes"),
             nh.from_array((rng.standard_normal((d, 8)) * 0.3).astype(np.float32), "w2"),
             nh.from_array(np.full(d, 1.5, np.float32), "gamma"), nh.from_array(np.full(d, 0.1, np.float32), "beta")]
    mk = h.make_node
    nodes = [mk("Relu", ["x"], ["a"], name="act"),
             mk("ReduceSum", ["a", "axes"], ["s1"], keepdims=1, name="sum1"),
             mk("Mul", ["s1", "invn"], ["mu"], name="mean"),
             mk("Mul", ["a", "a"], ["a2"], name="sq"),
             mk("ReduceSum", ["a2", "axes"], ["s2"], keepdims=1, name="sum2"),
             mk("Mul", ["s2", "invn"], ["ex2"], name="mean2"),
             mk("Mul", ["mu", "mu"], ["mu2"], name="musq"),
             mk("Sub", ["ex2", "mu2"], ["var0"], name="var"),
             mk("Max", ["var0", "zero"], ["var"], name="clamp"),
             mk("Add", ["var", "eps"], ["ve"], name="addeps"),
             mk("Sqrt", ["ve"], ["sd"], name="sqrt"),
             mk("Reciprocal", ["sd"], ["rs"], name="recip"),
             mk("Mul", ["rs", "gamma"], ["rg"], name="gammafold"),
             mk("Mul", ["a", "rg"], ["ar"], name="scale_x"),
             mk("Mul", ["mu", "rg"], ["mr"], name="scale_mu"),
             mk("Sub", ["ar", "mr"], ["c"], name="center"),
             mk("Add", ["c", "beta"], ["nrm"], name="shift"),
             mk("MatMul", ["nrm", "w2"], ["y"], name="mm2")]
    g = h.make_graph(nodes, "ln_tf2onnx", [h.make_tensor_value_info("x", T.FLOAT, [1, d])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 8])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 8
    x = (rng.standard_normal((n, 1, d)) + mean).astype(np.float32)
    return m, x


def small_conv_model():
    rng = np.random.default_rng(1)
    w = nh.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32), "w")
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             h.make_node("Relu", ["c"], ["y"], name="relu")]
    g = h.make_graph(nodes, "conv", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
                     [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 8, 8])], [w])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 8
    return m, rng.standard_normal((16, 1, 3, 8, 8)).astype(np.float32)


@pytest.fixture()
def ln_files(tmp_path):
    m, x = ln_moments_model()
    mp, dp, cp = tmp_path / "ln.onnx", tmp_path / "calib.npz", tmp_path / "cfg.yaml"
    onnx.save(m, str(mp))
    np.savez(str(dp), x=x)
    cp.write_text("supergroups: false\n")   # unrecognised whatever the pattern library learns
    return str(mp), str(dp), str(cp), x


def test_the_normalization_is_left_unrecognised_by_the_config(ln_files):
    # the pattern library reads this idiom (tests/patterns/test_exporter_idioms.py); the tests below turn
    # supergroups off so the net meets it as it meets whatever idiom the patterns still miss
    r = CliRunner().invoke(main, ["match", ln_files[0], "layernorm", "--json"])
    assert r.exit_code == 0 and len(json.loads(r.output)) == 1
    res = quantize(ln_files[0], ln_files[1], config=ln_files[2], min_sqnr=OFF)
    assert not any("supergroup" in str(v) for v in res.report["left_float"].values())


def test_safety_net_widens_the_cancelling_quantizers_on_ort_cpu(ln_files, tmp_path):
    mp, dp, cp, x = ln_files
    before = quantize(mp, dp, config=cp, min_sqnr=OFF, optimize="accuracy")
    s0 = before.report["output_sqnr_db"]["y"]
    assert s0 < DEFAULT_MIN_SQNR_DB and before.report["safety_net"]["triggered"] is False
    res = quantize(mp, dp, config=cp, optimize="accuracy")
    rep = res.report
    s1 = rep["output_sqnr_db"]["y"]
    assert s1 >= DEFAULT_MIN_SQNR_DB > s0, (s0, s1)
    sn = rep["safety_net"]
    assert sn["triggered"] and sn["sqnr_before_db"] == pytest.approx(s0) and sn["sqnr_after_db"] == s1
    assert 0 < sn["trials"] <= 64 and sn["samples_per_trial"] <= 8
    assert "safety-net" in rep["seconds"] and rep["below_floor"] == []
    changed = {c["value"] for c in sn["changed"]}
    # the statistics whose difference cancels are among the quantizers it turned to 16 bits
    assert {"ex2", "mu2"} <= changed or {"s2", "mu"} <= changed, changed
    for v in changed:
        assert "by the safety net: output SQNR" in rep["widened"][v]
        assert rep["quantized_activations"][v]["bits"] == 16
    out = str(tmp_path / "q.onnx")
    res.save(out)
    q, f = ort.InferenceSession(out), ort.InferenceSession(mp)
    y = np.stack([q.run(None, {"x": s})[0] for s in x])
    ref = np.stack([f.run(None, {"x": s})[0] for s in x])
    err = float(np.sum((ref - y) ** 2) / np.sum(ref ** 2))
    assert -10 * np.log10(err) == pytest.approx(s1, abs=0.1)   # the exported model is the one measured


def test_safety_net_keeps_float_where_the_target_has_no_int16(ln_files):
    mp, dp, cp, _ = ln_files
    rep = quantize(mp, dp, config=cp, target="trt").report
    assert rep["output_sqnr_db"]["y"] >= DEFAULT_MIN_SQNR_DB
    named = [v for v, why in rep["left_float"].items() if why.startswith("left float by the safety net")]
    assert named and not rep["widened"]
    assert all(v not in rep["quantized_activations"] for v in named)
    assert all(c["action"] == "float" for c in rep["safety_net"]["changed"])


def test_safety_net_does_not_run_above_the_floor(tmp_path):
    m, x = small_conv_model()
    base = quantize(m, [{"x": s} for s in x], min_sqnr=OFF).report
    rep = quantize(m, [{"x": s} for s in x]).report
    assert rep["safety_net"] == {"triggered": False, "seconds": 0.0}
    assert rep["output_sqnr_db"] == base["output_sqnr_db"] and rep["below_floor"] == []
    assert rep["min_sqnr_db"] == DEFAULT_MIN_SQNR_DB


def test_trial_cap_bounds_the_cost(ln_files, monkeypatch):
    from qcompiler.passes.quantize import safety_net
    from qcompiler.passes.quantize.safety_net import weights  # noqa: F401  (safety_net.weights below)
    mp, dp, cp, _ = ln_files
    made = []
    real = safety_net._Trials.__init__

    def spy(self, *a, **k):
        made.append(1)
        real(self, *a, **k)
    monkeypatch.setattr(safety_net, "MAX_TRIALS", 3)
    monkeypatch.setattr(safety_net, "MAX_REGION_TRIALS", 0)       # the region and weight phases' caps
    monkeypatch.setattr(safety_net.weights, "MAX_WEIGHT_TRIALS", 0)
    monkeypatch.setattr(safety_net._Trials, "__init__", spy)
    rep = quantize(mp, dp, config=cp, optimize="accuracy").report
    assert rep["safety_net"]["trials"] <= 3 and len(made) == 1


@pytest.mark.parametrize("bad", ["20", float("nan"), float("inf"), True, [20]])
def test_min_sqnr_must_be_a_number_of_db(bad):
    with pytest.raises(ArgumentError, match="min_sqnr"):
        check_min_sqnr(bad)
    assert check_min_sqnr(None) == DEFAULT_MIN_SQNR_DB and check_min_sqnr(20) == 20.0


@pytest.mark.parametrize("mean,d,target", [(20.0, 16, "trt"), (100.0, 256, "trt"), (1000.0, 16, "ort_cpu"),
                                           (1000.0, 256, "ort_cpu")])
def test_safety_net_reaches_the_floor_across_shapes(mean, d, target, tmp_path):
    from qcompiler.quant.settings.config import load_config
    (tmp_path / "cfg.yaml").write_text("supergroups: false\n")
    m, x = ln_moments_model(d=d, mean=mean)
    feeds = [{"x": s} for s in x]
    cfg = load_config(str(tmp_path / "cfg.yaml"))
    before = quantize(m, feeds, config=cfg, target=target, min_sqnr=OFF,
                      optimize="accuracy").report["output_sqnr_db"]["y"]
    rep = quantize(m, feeds, config=cfg, target=target, optimize="accuracy").report
    assert before < DEFAULT_MIN_SQNR_DB <= rep["output_sqnr_db"]["y"], (before, rep["safety_net"])
    assert rep["safety_net"]["seconds"] < 5 and rep["below_floor"] == []
