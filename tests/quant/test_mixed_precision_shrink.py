"""The mixed-precision search's last pass moves layers to cheaper candidates while the verification on the real
model still passes: the plan it returns is smaller than without that pass (and than the plain run), and the
model stays within the budget when run in onnxruntime."""
from __future__ import annotations

import numpy as np

from qcompiler.onnx_io import model_to_proto
from qcompiler.passes.quantize.mixed_precision import rounding, search
from qcompiler.quant.api import quantize
from qcompiler.quant.runtime.executor import SerialExecutor
from tests.helpers import relative_error, run
from tests.quant.test_mixed_precision_bytes import _deep_cnn

BUDGET = 0.02


def test_the_shrink_pass_gives_a_smaller_plan_within_the_budget(monkeypatch):
    m, cal = _deep_cnn()
    # NOTE: with its weights rounded by GPTQ (rounding.py) the search's first plan on this model is already the
    # smallest that passes, so nothing is left for the last pass: round-to-nearest here, where it has work
    monkeypatch.setattr(rounding.WeightRounding, "apply", lambda self, model, plan: 0)

    def searched():
        res = quantize(m, cal, target="qnn_htp", max_drop=BUDGET, executor=SerialExecutor(),
                       min_sqnr=float("-inf"))
        return res, res.report["mixed_precision"]
    res, mp = searched()
    with monkeypatch.context() as p:
        p.setattr(search, "SHRINK_STEPS", 0)
        _, unshrunk = searched()
    assert mp["file_bytes"] < unshrunk["file_bytes"], (mp["trials"], unshrunk["trials"])
    assert mp["file_bytes"] < mp["plain_file_bytes"], mp["trials"]
    assert any(t["what"].startswith("verify shrink") for t in mp["trials"]), mp["trials"]
    # within the rule on the samples the search measured, and in onnxruntime on the calibration samples
    assert mp["drop"] + mp["margin"] <= BUDGET and mp["held_out_drop"] <= BUDGET, mp
    q = model_to_proto(res.model)
    assert abs(q.ByteSize() - mp["file_bytes"]) < 0.05 * q.ByteSize(), (q.ByteSize(), mp["file_bytes"])
    assert relative_error(m, q, cal) <= BUDGET, relative_error(m, q, cal)
