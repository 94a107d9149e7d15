"""`measure-sqnr`: each graph output's SQNR and max abs error against float, on the calibration samples kept
during calibration (their float outputs were kept then; qcompiler/quant/interop/report.py). A quantized model onnxruntime's
default session options fail on (one of its graph fusions) is a warning, never silent: a user's first session
would fail."""
from __future__ import annotations

import numpy as np

from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.interop.report import output_errors
from qcompiler.quant.runtime.memory import release
from qcompiler.quant.settings.selection import warning


@register_pass
class MeasureSQNR(QuantPass):
    name = "measure-sqnr"
    description = "per-output SQNR and max abs error against float on the kept calibration samples"
    requires = ("quant-context", "float-outputs", "quantized")
    ensures = ("output-errors",)

    def run(self, ctx) -> PassResult:
        refusals: list = []
        kept = ctx.reference if ctx.reference is not None else ctx.calibration.kept
        if ctx.settings.report_samples is not None:
            kept = kept[:ctx.settings.report_samples]
        ctx.errors = output_errors(ctx.model, kept, ctx.settings.progress, refusals)
        if refusals:
            ctx.warnings.append(warning(
                "onnxruntime", "default session options",
                f"fail on the quantized model ({refusals[0]}); it runs with graph_optimization_level="
                f"ORT_ENABLE_BASIC, at which its SQNR was measured"))
        release()
        worst = min((e.sqnr_db() for e in ctx.errors.values()), default=float("inf"))
        return PassResult(False, {"outputs": len(ctx.errors),
                                  "worst_sqnr_db": round(worst, 2) if np.isfinite(worst) else worst})
