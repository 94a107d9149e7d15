"""The mixed-precision search weighs latency: the cost model's float multiply-accumulates of every trial, a choice
never slower (cost model, then onnxruntime's clock on ort_cpu) nor larger than the plain run when the plain run
meets the budget, `--optimize latency` as the objective; and its sensitivity table from one switchable model per
candidate agrees with the one-model-per-layer table it replaces."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
from onnx import helper, numpy_helper

from qcompiler.onnx_io import model_to_proto
from qcompiler.passes.quantize.mixed_precision import search as mp_search
from qcompiler.passes.quantize.mixed_precision.search import Result, Search, Trial
from qcompiler.quant.api import quantize
from qcompiler.quant.runtime.executor import SerialExecutor
from qcompiler.sqnr import sqnr_db
from tests.helpers import make_model, run, tinfo

F = np.float32


def _light_then_heavy(seed=0, hw=16):
    """A 3->4 Conv (light, its input channels of very different ranges) feeding a 4->64 3x3 Conv and a 64->64 3x3
    Conv (heavy: most of the multiply-accumulates), GlobalAveragePool -> Gemm. Keeping the light layer float
    makes the heavy Conv read a float value: a float kernel on ort_cpu."""
    rng = np.random.default_rng(seed)
    w0 = (rng.normal(size=(4, 3, 1, 1)) * 0.5).astype(F)
    w1 = (rng.normal(size=(64, 4, 3, 3)) / 6).astype(F)
    w2 = (rng.normal(size=(64, 64, 3, 3)) / 24).astype(F)
    wf = (rng.normal(size=(10, 64)) * 0.3).astype(F)
    inits = [numpy_helper.from_array(w0, "w0"), numpy_helper.from_array(w1, "w1"),
             numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(wf, "wf")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="light"),
             helper.make_node("Relu", ["c0"], ["r0"], name="relu0"),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], name="heavy1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="heavy2", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["fl"], name="flat"),
             helper.make_node("Gemm", ["fl", "wf"], ["y"], name="fc", transB=1)]
    m = make_model(nodes, [tinfo("x", [1, 3, hw, hw])], [tinfo("y", [1, 10])], inits, opset=13)
    scale = np.array([1.0, 10.0, 0.1], F).reshape(1, 3, 1, 1)
    cal = [{"x": (rng.normal(size=(1, 3, hw, hw)) * scale).astype(F)} for _ in range(16)]
    return m, cal


def test_widening_the_light_layer_is_never_chosen_over_a_plain_run_that_meets_the_budget():
    m, cal = _light_then_heavy()
    res = quantize(m, cal, max_drop=0.05, executor=SerialExecutor(), min_sqnr=float("-inf"))
    mp = res.report["mixed_precision"]
    plain = next(t for t in mp["trials"] if "plain run" in t["what"] or t["what"] == "all W8A8")
    assert plain["float_macs"] is not None and all(t["float_macs"] is not None for t in mp["trials"])
    assert plain["float_macs"] == 0, plain    # W8A8 everywhere: every Conv on an integer kernel
    # the plain run meets 5 % here: the choice runs no more float MACs and its file is no larger
    assert mp["drop"] <= 0.05
    assert mp["float_macs"]["plan"] <= mp["float_macs"].get("plain", 0) * 1.05, mp["float_macs"]
    assert mp["file_bytes"] <= mp["plain_file_bytes"] or mp["plain_file_bytes"] is None, mp
    # ort_cpu runs here: both were timed, and the choice is not slower than the plain run beyond the tolerance
    lat = mp["latency"]
    assert lat and lat["plan_ms"] > 0 and lat["plain_ms"] > 0
    assert lat["plan_ms"] <= lat["plain_ms"] * (1 + mp_search.LATENCY_TOLERANCE) or mp["file_bytes"] == \
        mp["plain_file_bytes"], lat
    q = model_to_proto(res.model)
    worst = min(sqnr_db(run(m, f)[0], run(q, f)[0]) for f in cal)
    assert worst >= 20 * math.log10(1 / 0.05) - 6, worst


def _chooser(optimize="balanced"):
    """A Search with only what `choose` reads: no timing (a profile without a fusion table)."""
    s = Search.__new__(Search)
    s.ctx = SimpleNamespace(settings=SimpleNamespace(optimize=optimize))
    s.profile = SimpleNamespace(fusions=None)
    return s


def _res():
    return Result(budget=0.01, metric="m", layers=[], candidates=[], skipped={}, table={}, assignment={},
                  drop=0.0, weight_bytes=0)


def test_choose_rejects_a_smaller_plan_that_puts_heavy_kernels_on_float():
    plain = (Trial("plain", {}, 0, 0.005, file_bytes=1000, float_macs=0.0), {"a": "W8A8"}, "base")
    widened = (Trial("greedy", {}, 0, 0.004, file_bytes=900, float_macs=5e6), {"a": "float16"}, "base")
    res = _res()
    assert _chooser().choose([widened, plain], plain, [], res) is plain
    assert res.float_macs == {"plan": 0, "plain": 0}
    # without a plain run within the budget, the smallest file wins
    assert _chooser().choose([widened], plain, [], _res()) is widened
    # under --optimize latency the cost model's float MACs come first, bytes break ties
    faster = (Trial("g2", {}, 0, 0.004, file_bytes=1100, float_macs=0.0), {"a": "W4A8"}, "base")
    assert _chooser("latency").choose([widened, faster], None, [], _res()) is faster
    assert _chooser().choose([widened, faster], None, [], _res()) is widened


def test_optimize_latency_is_the_objective_and_reports_both_latencies():
    m, cal = _light_then_heavy(seed=1)
    res = quantize(m, cal, max_drop=0.05, optimize="latency", executor=SerialExecutor(),
                   min_sqnr=float("-inf"))
    mp = res.report["mixed_precision"]
    assert mp["latency"]["plan_ms"] > 0 and mp["latency"]["clock"] == "cpu"
    within = [t for t in mp["trials"] if t.get("margin") is not None and t["drop"] + t["margin"] <= 0.05
              and (t.get("held_out_drop") or 0) <= 0.05]
    # the choice has the fewest float MACs of the verified trials
    assert mp["float_macs"]["plan"] <= min(t["float_macs"] for t in within), (mp["float_macs"], within)


def test_switchable_sensitivity_ranks_layers_as_the_per_layer_models_do(monkeypatch):
    # NOTE: on trt a layer's quantizers are the same alone or among quantized neighbours; on ort_cpu a layer
    # alone between float layers runs a float kernel (exact weights, or the full 8-bit grid), while the
    # switchable model measures it as the plan will run it (an integer kernel's 7-bit weight grid): larger,
    # truer drops there, not comparable
    m, cal = _light_then_heavy(seed=2)
    kw = dict(max_drop=0.02, target="trt", executor=SerialExecutor(), min_sqnr=float("-inf"))
    fast = quantize(m, cal, **kw).report["mixed_precision"]
    assert fast["sensitivity_rounds"].get("W8A8", "").startswith("one switchable model"), fast["sensitivity_rounds"]
    monkeypatch.setattr(Search, "measure_switched", lambda self, c, todo, layers: None)
    slow = quantize(m, cal, **kw).report["mixed_precision"]
    assert not slow["sensitivity_rounds"]
    for c in ("W8A8", "W4A8"):
        a = {n: l["sensitivity"][c] for n, l in fast["layers"].items() if c in l["sensitivity"]}
        b = {n: l["sensitivity"][c] for n, l in slow["layers"].items() if c in l["sensitivity"]}
        assert a.keys() == b.keys() and a
        # the most sensitive layer is the same, and each drop is within a factor of 3 of the per-layer one
        assert max(a, key=a.get) == max(b, key=b.get), (c, a, b)
        for n in a:
            if b[n] > 1e-4:
                assert b[n] / 3 <= a[n] <= 3 * b[n], (c, n, a[n], b[n])
