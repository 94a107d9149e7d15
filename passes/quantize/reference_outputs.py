"""`reference-outputs`: the float model's graph outputs on a few calibration samples, kept for the report's SQNR.

The full pipeline keeps them during calibration (`calibrate`); weight-only quantization has no calibration pass,
so this runs the float model once on at most `report_samples` samples (default 4) before the weights are
written. Without calibration data it keeps nothing and the report says the output SQNR was not measured.
"""
from __future__ import annotations

from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.calibration.calibrate import make_session
from qcompiler.quant.core.context import QuantPass

DEFAULT_SAMPLES = 4


@register_pass
class ReferenceOutputs(QuantPass):
    name = "reference-outputs"
    description = "float graph outputs on a few calibration samples, for the report's output SQNR"
    requires = ("quant-context",)
    ensures = ("float-outputs",)

    def run(self, ctx) -> PassResult:
        ctx.reference = []
        if ctx.samples is None:
            ctx.notes.append("no calibration data: the output SQNR against float was not measured")
            return PassResult(False, {"samples": 0})
        n = ctx.settings.report_samples or DEFAULT_SAMPLES
        sess = make_session(ctx.model, role="float")
        names = [v.name for v in ctx.model.graph.outputs]
        for i, feed in enumerate(ctx.samples):
            if i >= n:
                break
            outs = sess.run(names, feed, where=f"calibration sample {i}")
            ctx.reference.append((dict(feed), dict(zip(names, outs))))
        return PassResult(False, {"samples": len(ctx.reference)})
