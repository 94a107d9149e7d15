"""The mixed-precision search on ort_cpu counts the bytes the target really stores: no candidate that is float-sized
on it (16-bit activations: no integer kernel), never a file larger than the plain run when the plain run meets the
budget, the real sizes in the report, and reasons that name the search rather than a config nobody gave."""
from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from qcompiler.onnx_io import model_to_proto
from qcompiler.quant.api import quantize
from qcompiler.quant.runtime.executor import SerialExecutor
from qcompiler.sqnr import sqnr_db
from tests.helpers import make_model, run, tinfo

F = np.float32


def _deep_cnn(layers=6, c=16, hw=8, seed=0):
    """A chain of Conv+Relu layers, the last one's output read by GlobalAveragePool -> Gemm."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        cin = 3 if i == 0 else c
        inits.append(numpy_helper.from_array((rng.normal(size=(c, cin, 3, 3)) / np.sqrt(9 * cin)).astype(F), f"w{i}"))
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}")]
        x = f"r{i}"
    inits.append(numpy_helper.from_array((rng.normal(size=(10, c)) * 0.3).astype(F), "wf"))
    nodes += [helper.make_node("GlobalAveragePool", [x], ["p"], name="gap"),
              helper.make_node("Flatten", ["p"], ["fl"], name="flat"),
              helper.make_node("Gemm", ["fl", "wf"], ["y"], name="fc", transB=1)]
    m = make_model(nodes, [tinfo("x", [1, 3, hw, hw])], [tinfo("y", [1, 10])], inits, opset=13)
    cal = [{"x": rng.normal(size=(1, 3, hw, hw)).astype(F)} for _ in range(8)]
    return m, cal


def test_never_larger_than_the_plain_run_and_no_float_sized_candidate():
    m, cal = _deep_cnn()
    plain = model_to_proto(quantize(m, cal).model)
    res = quantize(m, cal, max_drop=0.05, executor=SerialExecutor(), min_sqnr=float("-inf"))
    q = model_to_proto(res.model)
    mp = res.report["mixed_precision"]
    assert not {"W8A16", "W16A16"} & set(mp["candidates"]), mp["candidates"]
    assert "no integer kernel" in mp["skipped_candidates"]["W16A16"]
    # the plain run meets a 5 % budget here: the search's model is no larger (the real file, not a table)
    assert mp["plain_file_bytes"] and mp["file_bytes"] <= mp["plain_file_bytes"], mp["trials"]
    assert q.ByteSize() <= plain.ByteSize() * 1.02, (q.ByteSize(), plain.ByteSize())
    assert all(t["file_bytes"] for t in mp["trials"])
    worst = min(sqnr_db(run(m, f)[0], run(q, f)[0]) for f in cal)
    assert worst >= 20 * np.log10(1 / 0.05) - 6, worst      # the budget's SQNR, within the held-out slack
    # no config was given: no reason may say one decided
    assert not any("by config" in r for r in res.report["left_float"].values()), res.report["left_float"]


def test_a_layer_the_search_keeps_float_says_so():
    m, cal = _deep_cnn(layers=3)
    res = quantize(m, cal, max_drop=1e-6, executor=SerialExecutor(), min_sqnr=float("-inf"))
    reasons = [r for r in res.report["left_float"].values() if "kept" in r]
    assert reasons and all("mixed-precision search" in r for r in reasons), reasons
