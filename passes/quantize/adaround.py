"""`adaround` (optional, `--recipe adaround`): learned weight rounding (AdaRound, Nagel et al. 2020) for Conv,
ConvTranspose, Gemm and MatMul weights, at each layer's own bit width from the plan (so a mixed-precision plan
works as it is: a 4-bit Conv learns its 4-bit rounding, an 8-bit one its 8-bit rounding).

It runs after `assign-encodings` (it needs the weight grids) and before `insert-qdq`, which writes the learned
integers (`QuantSpec.rounded`) instead of round-to-nearest; the weight encodings are frozen. The layer inputs
come from one float run over the calibration samples; each layer's result is never worse than round-to-nearest
on its own loss ||W X - W~ X||^2. The algorithm, its schedule, early stopping and what it skips (with reasons):
qcompiler/quant/adaround.py.

    qcompiler quantize m.onnx --calib c.npz --recipe adaround --weight-bits 4 -o m_w4a8.onnx

The report's notes give the layer count, the total iterations and the summed layer loss against round-to-nearest;
each skipped layer is named with its reason. Off by default: it costs seconds per layer on a 2-core CPU.
"""
from __future__ import annotations

from qcompiler.errors import DataError
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.adaround import adaround
from qcompiler.quant.context import QuantPass


@register_pass
class AdaRound(QuantPass):
    name = "adaround"
    description = "learned weight rounding (AdaRound) of Conv/ConvTranspose/Gemm/MatMul at each layer's bits"
    preserves_semantics = False
    requires = ("quant-context", "plan", "encodings")
    after = "assign-encodings"

    def run(self, ctx) -> PassResult:
        try:
            results = adaround(ctx.model, ctx.plan, ctx.samples)
        except DataError as e:
            if "already read once" not in str(e):
                raise
            raise DataError(f"pass 'adaround' reads the calibration samples a second time (after calibrate): "
                            f"{e}") from None
        done = [r for r in results if not r.skipped]
        if done:
            near = sum(r.loss_nearest for r in done)
            loss = sum(r.loss for r in done)
            layers = f"{len(done)} layer{'s' if len(done) != 1 else ''}"
            ctx.notes.append(f"adaround on {layers} ({sum(r.iterations for r in done)} iterations, "
                             f"{sum(r.seconds for r in done):.1f} s): summed layer loss {loss:.4g} against "
                             f"{near:.4g} for round-to-nearest, {sum(r.changed for r in done)} weights rounded "
                             f"the other way")
        for r in results:
            if r.skipped:
                ctx.notes.append(f"adaround skipped {r.op_type} '{r.node[:80]}': {r.skipped}")
        return PassResult(False, {"layers": len(done), "skipped": len(results) - len(done),
                                       "iterations": sum(r.iterations for r in done),
                                       "per_layer": {r.node: {"bits": r.bits, "iterations": r.iterations,
                                                              "loss_nearest": r.loss_nearest, "loss": r.loss,
                                                              "seconds": round(r.seconds, 3)} for r in done}})
