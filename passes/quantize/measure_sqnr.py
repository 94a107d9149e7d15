"""`measure-sqnr`: each graph output's SQNR and max abs error against float, on the calibration samples kept
during calibration (their float outputs were kept then; quant/report.py)."""
from __future__ import annotations

import numpy as np

from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.context import QuantPass
from qcompiler.quant.memory import release
from qcompiler.quant.report import output_errors


@register_pass
class MeasureSQNR(QuantPass):
    name = "measure-sqnr"
    description = "per-output SQNR and max abs error against float on the kept calibration samples"
    requires = ("quant-context", "statistics", "qdq")
    ensures = ("output-errors",)

    def run(self, ctx) -> PassResult:
        ctx.errors = output_errors(ctx.model, ctx.calibration.kept, ctx.settings.progress)
        release()
        worst = min((e.sqnr_db() for e in ctx.errors.values()), default=float("inf"))
        return PassResult(False, {"outputs": len(ctx.errors),
                                  "worst_sqnr_db": round(worst, 2) if np.isfinite(worst) else worst})
