"""`calibrate`: one streaming pass of the float model over the calibration data (qcompiler/quant/calibrate.py).

What to observe comes from placement's structural rules (`observed_names`: no supergroup interiors, no
data-movement copies) plus what later passes in the pipeline ask for (`QuantPass.calibration_request`: the
per-channel means bias correction needs), so the data is read once whatever the recipe."""
from __future__ import annotations

from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.calibrate import calibrate
from qcompiler.quant.context import QuantPass
from qcompiler.quant.memory import release
from qcompiler.quant.placement import observed_names
from qcompiler.quant.report import SQNR_KEEP_BYTES, SQNR_MAX_SAMPLES


@register_pass
class Calibrate(QuantPass):
    name = "calibrate"
    description = "run the float model once over the calibration data; keep statistics per activation"
    requires = ("quant-context",)
    ensures = ("statistics",)

    def run(self, ctx) -> PassResult:
        s = ctx.settings
        axes: dict = {}
        for p in ctx.passes:
            axes.update(p.calibration_request(ctx) if hasattr(p, "calibration_request") else {})
        sym = ctx.profile.activation.symmetric if s.selection.act_symmetric is None \
            else s.selection.act_symmetric
        ctx.calibration = calibrate(ctx.model, ctx.samples, scheme=s.scheme, bits=s.act_bits, symmetric=sym,
                                    progress=s.progress, names=observed_names(ctx.model, ctx.profile, ctx.options),
                                    keep_samples=SQNR_MAX_SAMPLES, keep_bytes=SQNR_KEEP_BYTES,
                                    channel_axes=axes or None)
        release()   # the calibration session's freed heap (memory.py)
        cal = ctx.calibration
        return PassResult(False, {"samples": cal.samples, "observed_values": len(cal.observers)})
