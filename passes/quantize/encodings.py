"""`load-encodings` (optional: `--load-encodings FILE`) freezes encodings read from an AIMET file onto the plan
(its FLOAT entries go to `ctx.float_encodings`, so the result's encodings keep them); `assign-encodings`
computes every other encoding from the statistics (and per-block weight grids).

The file is read once more before the pipeline (qcompiler/quant/core/opset.py): its int4/int16/per-block entries choose the
output opset, so `--load-encodings FILE` alone is enough for such a file."""
from __future__ import annotations

from qcompiler.errors import ConfigError
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.calibration.calibrate import assign_encodings
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.core.qdq import assign_block_encodings
from qcompiler.quant.interop.freeze import freeze_encodings
from qcompiler.quant.interop.report import layer_choices


@register_pass
class LoadEncodings(QuantPass):
    name = "load-encodings"
    description = "freeze the encodings of an AIMET encodings file (--load-encodings); the rest is calibrated"
    requires = ("quant-context", "plan")
    after = "place"

    def run(self, ctx) -> PassResult:
        path = ctx.settings.load_encodings
        if path is None:
            raise ConfigError("pass 'load-encodings' needs an encodings file: pass --load-encodings FILE")
        ctx.float_encodings = freeze_encodings(ctx.plan, ctx.model, path, ctx.notes, ctx.warnings)
        frozen = sum(1 for s in list(ctx.plan.values.values()) + list(ctx.plan.uses.values()) if s.frozen)
        return PassResult(False, {"frozen": frozen})


@register_pass
class AssignEncodings(QuantPass):
    name = "assign-encodings"
    description = "scales and zero points for every quantized value of the plan (frozen ones kept)"
    requires = ("quant-context", "plan", "statistics")
    ensures = ("encodings",)

    def run(self, ctx) -> PassResult:
        scheme = ctx.settings.scheme
        assign_encodings(ctx.plan, ctx.model, ctx.calibration, scheme)
        blocks = assign_block_encodings(ctx.plan, ctx.model, scheme)
        ctx.layers = layer_choices(ctx.model, ctx.plan, ctx.settings.config)
        return PassResult(False, {"per_block_weights": blocks})
