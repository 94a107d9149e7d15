"""The mixed-precision search rounds its candidates' weights with GPTQ on their plan grids (rounding.py): on small
CNNs whose convolutions hold the bytes, a 4-bit mix then fits budgets that round-to-nearest cannot, the model it
returns is smaller than the plain W8A8 run and carries the same integers the search measured; where no such mix
exists (a CNN whose fully connected layer holds the bytes), the plan stays within the budget and is never larger
than a plain run that meets it.

Within the budget on held-out samples: the search's rule (drop + 1 standard error on its samples, the drop on the
samples it held out) is a statistical statement; samples never seen are checked against 1.25 x the budget."""
from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from qcompiler.onnx_io import model_to_proto
from qcompiler.passes.quantize.mixed_precision import rounding
from qcompiler.quant.api import quantize
from qcompiler.quant.runtime.executor import SerialExecutor
from tests.helpers import make_model, relative_error, run, tinfo

F = np.float32
FRESH_SLACK = 1.25


def _images(rng, n, c, hw):
    """Smooth images (4x4 blocks plus a little noise): inputs with structure, as a camera's are."""
    lo = rng.normal(size=(n, c, hw // 4, hw // 4)).astype(F)
    x = lo.repeat(4, axis=2).repeat(4, axis=3)
    return (x + 0.1 * rng.normal(size=x.shape)).astype(F)


def _cnn(kind: str, seed: int = 0, hw: int = 16):
    """kind 'conv': Conv+Relu x4 (16..64 channels, 3x3) -> GlobalAveragePool -> Gemm, the convolutions hold 95 % of
    the weights; kind 'fc': Conv+Relu x2 (8 channels) -> Flatten -> Gemm 512x64 -> Relu -> Gemm, the first Gemm
    holds 96 %. Returns (model, 32 calibration samples, 16 samples never shown to quantize)."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    chans = [3, 8, 8] if kind == "fc" else [3, 16, 32, 32, 64]
    for i in range(len(chans) - 1):
        cin, co = chans[i], chans[i + 1]
        w = (rng.normal(size=(co, cin, 3, 3)) / np.sqrt(9 * cin)).astype(F)
        w[:, :, 1, 1] += 0.5 / np.sqrt(cin)
        inits += [numpy_helper.from_array(w, f"w{i}"),
                  numpy_helper.from_array((0.05 * rng.normal(size=co)).astype(F), f"b{i}")]
        s = 2 if i % 2 == 1 else 1
        nodes += [helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1],
                                   strides=[s, s]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    if kind == "fc":
        k = chans[-1] * (hw // 2) ** 2
        inits += [numpy_helper.from_array((rng.normal(size=(64, k)) / np.sqrt(k)).astype(F), "wf1"),
                  numpy_helper.from_array((rng.normal(size=(10, 64)) / 8).astype(F), "wf2")]
        nodes += [helper.make_node("Flatten", [x], ["fl"], name="flat"),
                  helper.make_node("Gemm", ["fl", "wf1"], ["h"], name="fc1", transB=1),
                  helper.make_node("Relu", ["h"], ["hr"], name="relu_fc"),
                  helper.make_node("Gemm", ["hr", "wf2"], ["y"], name="fc2", transB=1)]
    else:
        inits.append(numpy_helper.from_array((rng.normal(size=(10, chans[-1])) * 0.3).astype(F), "wf"))
        nodes += [helper.make_node("GlobalAveragePool", [x], ["p"], name="gap"),
                  helper.make_node("Flatten", ["p"], ["fl"], name="flat"),
                  helper.make_node("Gemm", ["fl", "wf"], ["y"], name="fc", transB=1)]
    m = make_model(nodes, [tinfo("x", [1, 3, hw, hw])], [tinfo("y", [1, 10])], inits, opset=13)
    xs = _images(rng, 48, 3, hw)
    return m, [{"x": xs[i:i + 1]} for i in range(32)], [{"x": xs[i:i + 1]} for i in range(32, 48)]


def _search(m, cal, budget, optimize):
    res = quantize(m, cal, max_drop=budget, optimize=optimize, executor=SerialExecutor(), min_sqnr=float("-inf"))
    return res.report["mixed_precision"], model_to_proto(res.model)


def test_a_conv_heavy_cnn_gets_a_4bit_mix_smaller_than_w8a8_within_the_budget():
    m, cal, fresh = _cnn("conv")
    budget = 0.01
    mp, q = _search(m, cal, budget, "size")
    assert "W4A8" in {l["chosen"] for l in mp["layers"].values()}, mp["layers"]
    assert mp["file_bytes"] < 0.7 * mp["plain_file_bytes"], mp["trials"]
    assert abs(q.ByteSize() - mp["file_bytes"]) < 0.05 * q.ByteSize(), (q.ByteSize(), mp["file_bytes"])
    assert mp["drop"] + mp["margin"] <= budget and mp["held_out_drop"] <= budget, mp
    # the model returned holds the integers the search measured: its error on the kept samples is the same
    assert abs(relative_error(m, q, cal) - mp["drop"]) <= 0.02 * mp["drop"], (relative_error(m, q, cal), mp)
    assert relative_error(m, q, fresh) <= FRESH_SLACK * budget, relative_error(m, q, fresh)


def test_gptq_rounding_is_what_buys_the_bytes(monkeypatch):
    m, cal, fresh = _cnn("conv")
    budget = 0.005
    mp, q = _search(m, cal, budget, "size")
    with monkeypatch.context() as p:
        p.setattr(rounding.WeightRounding, "apply", lambda self, model, plan: 0)   # round-to-nearest only
        nearest, qn = _search(m, cal, budget, "size")
    assert mp["file_bytes"] < 0.6 * nearest["file_bytes"], (mp["trials"], nearest["trials"])
    for table in (mp, nearest):
        assert table["drop"] + table["margin"] <= budget, table
    assert relative_error(m, q, fresh) <= FRESH_SLACK * budget, relative_error(m, q, fresh)
    # each layer alone at W4A8 (the table; "inf": not measured, its W8A8 alone broke the budget)
    w4 = {n: float(l["sensitivity"]["W4A8"]) for n, l in mp["layers"].items()}
    w4_nearest = {n: float(l["sensitivity"]["W4A8"]) for n, l in nearest["layers"].items()}
    both = [n for n in w4 if np.isfinite(w4[n]) and np.isfinite(w4_nearest[n])]
    assert len(both) >= 3, (w4, w4_nearest)
    assert sum(w4[n] for n in both) < 0.5 * sum(w4_nearest[n] for n in both), (w4, w4_nearest)


def test_an_fc_heavy_cnn_stays_within_the_budget_and_never_above_a_passing_plain_run():
    m, cal, fresh = _cnn("fc")
    for budget, optimize in ((0.02, "size"), (0.05, "balanced")):
        mp, q = _search(m, cal, budget, optimize)
        # the 512-input Gemm sees one row per sample (16 search samples): GPTQ would fit the rounding to those
        # 16 directions, so it keeps round-to-nearest; the convolutions (many patches per sample) are rounded
        assert not any(r.startswith("fc1 ") for r in mp["rounding"]["gptq"]), mp["rounding"]
        assert any(r.startswith("conv1 ") for r in mp["rounding"]["gptq"]), mp["rounding"]
        assert mp["drop"] + mp["margin"] <= budget and mp["held_out_drop"] <= budget, mp
        assert relative_error(m, q, fresh) <= FRESH_SLACK * budget, (budget, relative_error(m, q, fresh))
        if optimize == "balanced":   # the plain run meets 5 %: nothing larger and nothing on more float kernels
            plain = [t for t in mp["trials"] if t["what"].startswith("verify all W8A8")]
            assert not plain or plain[0]["drop"] + plain[0]["margin"] <= budget, plain
            assert mp["file_bytes"] <= mp["plain_file_bytes"], mp["trials"]
            assert mp["float_macs"]["plan"] <= mp["float_macs"]["plain"], mp["float_macs"]


def test_a_plain_run_within_the_budget_is_returned_after_one_measurement_under_balanced():
    """On ort_cpu a 4-bit Conv, a float16 and a float layer all run float kernels: when the plain W8A8 run meets
    the budget, no cheaper move can keep its speed, so nothing else is measured."""
    m, cal, fresh = _cnn("conv")
    budget = 0.02
    mp, q = _search(m, cal, budget, "balanced")
    assert mp["evaluations"] == 1 and [t["what"] for t in mp["trials"]][0].startswith("verify all W8A8"), mp
    assert mp["file_bytes"] == mp["plain_file_bytes"] and mp["float_macs"]["plan"] == 0, mp
    assert mp["latency"]["plan_ms"] > 0 and any("plain run is returned" in n for n in mp["notes"]), mp
    assert mp["drop"] + mp["margin"] <= budget and relative_error(m, q, fresh) <= FRESH_SLACK * budget
    # the plain run over the budget: the search runs
    mp, _ = _search(m, cal, 0.002, "balanced")
    assert mp["evaluations"] > 1 and not any("plain run is returned" in n for n in mp["notes"]), mp


def test_skipping_a_nearest_remeasure_of_the_same_model_gives_the_full_paths_plan(monkeypatch):
    """A layer whose round-to-nearest model is the one just measured (GPTQ kept its integers, or an earlier round
    of the same weight width chose round-to-nearest) is not measured again: the plan is the full path's."""
    m, cal, fresh = _cnn("conv")
    budget = 0.005
    mp, q = _search(m, cal, budget, "size")
    with monkeypatch.context() as p:   # the full path: every GPTQ-rounded layer measured both ways, every round
        p.setattr(rounding.WeightRounding, "worth_measuring", lambda self, name, bits: True)
        full, qf = _search(m, cal, budget, "size")
    assert mp["evaluations"] < full["evaluations"], (mp["evaluations"], full["evaluations"])
    assert {n: l["chosen"] for n, l in mp["layers"].items()} == {n: l["chosen"] for n, l in full["layers"].items()}
    assert {n: l["sensitivity"] for n, l in mp["layers"].items()} == \
        {n: l["sensitivity"] for n, l in full["layers"].items()}
    assert mp["rounding"]["gptq"] == full["rounding"]["gptq"], (mp["rounding"], full["rounding"])
    assert mp["file_bytes"] == full["file_bytes"] and mp["drop"] + mp["margin"] <= budget, (mp, full)
    assert relative_error(m, q, fresh) <= FRESH_SLACK * budget, relative_error(m, q, fresh)
