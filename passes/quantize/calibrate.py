"""`calibrate`: one streaming pass of the float model over the calibration data (qcompiler/quant/calibration/calibrate.py).

What to observe comes from placement's structural rules (`observed_names`: no supergroup interiors, no
data-movement copies; `observed_body_names`: the same rules inside If/Loop/Scan bodies, observed through
qcompiler/quant/calibration/body_probe.py) plus what later passes in the pipeline ask for (`QuantPass.calibration_request`: the
per-channel means bias correction needs; `rounding_noise_request`: the layer inputs whose int8 rounding
narrow-float-weights weighs), so the data is read once whatever the recipe."""
from __future__ import annotations

from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.calibration.body_probe import has_bodies
from qcompiler.quant.calibration.calibrate import calibrate
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.interop.report import SQNR_KEEP_BYTES, SQNR_MAX_SAMPLES
from qcompiler.quant.placement import bulk_names, observed_body_names, observed_names
from qcompiler.quant.runtime.memory import large_model, release


@register_pass
class Calibrate(QuantPass):
    name = "calibrate"
    description = "run the float model once over the calibration data; keep statistics per activation"
    requires = ("quant-context",)
    ensures = ("float-outputs", "statistics",)

    def run(self, ctx) -> PassResult:
        s = ctx.settings
        axes: dict = {}
        blocks: dict = {}
        for p in ctx.passes:
            axes.update(p.calibration_request(ctx) if hasattr(p, "calibration_request") else {})
            blocks.update(p.rounding_noise_request(ctx) if hasattr(p, "rounding_noise_request") else {})
        sym = ctx.profile.activation.symmetric if s.selection.act_symmetric is None \
            else s.selection.act_symmetric
        bodies = observed_body_names(ctx.model, ctx.profile, ctx.options) if has_bodies(ctx.model) else False
        ctx.calibration = calibrate(ctx.model, ctx.samples, scheme=s.scheme, bits=s.act_bits, symmetric=sym,
                                    progress=s.progress, names=observed_names(ctx.model, ctx.profile, ctx.options),
                                    keep_samples=SQNR_MAX_SAMPLES, keep_bytes=SQNR_KEEP_BYTES,
                                    channel_axes=axes or None, bodies=bodies or False,
                                    bulk_names=bulk_names(ctx.model, ctx.profile, s.optimize),
                                    rounding_blocks=blocks, spill=large_model(ctx.model))
        release()   # the calibration session's freed heap (memory.py)
        cal = ctx.calibration
        stats = {"samples": cal.samples, "observed_values": len(cal.observers)}
        if cal.bodies is not None:
            self._body_notes(ctx, cal.bodies)
            stats["body_values"] = len(cal.bodies.probe.probes)
        return PassResult(False, stats)

    @staticmethod
    def _body_notes(ctx, body) -> None:
        """The report's notes: branches never taken, values observed as per-run min/max only, values not
        probed (each with its reason)."""
        ctx.notes.extend(body.tally.report())
        probe = body.probe
        minmax = sorted(set(probe.minmax_values) | set(body.minmax))
        if minmax:
            shown = ", ".join(f"'{n[:60]}'" for n in minmax[:8]) + (f" and {len(minmax) - 8} more"
                                                                     if len(minmax) > 8 else "")
            ctx.notes.append(f"{len(minmax)} body values calibrated by per-run min/max (inside nested loops or "
                             f"of changing shape: {shown})")
        for path, what, reason in probe.skipped[:8]:
            ctx.notes.append(f"not observed inside bodies: {(what or path or 'model')[:80]}: {reason[:120]}")
