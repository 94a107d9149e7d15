"""`safety-net`: when an output's SQNR is below the floor (`--min-sqnr`), find and fix the quantizers that break
it (keep float or widen to 16 bits; qcompiler/quant/safety_net.py). A no-op above the floor."""
from __future__ import annotations

from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.context import QuantPass
from qcompiler.quant.safety_net import run_safety_net


@register_pass
class SafetyNet(QuantPass):
    name = "safety-net"
    description = "below the output SQNR floor: keep float or widen the quantizers that break an output"
    preserves_semantics = False
    requires = ("quant-context", "qdq", "output-errors")

    def run(self, ctx) -> PassResult:
        outcome, fixed = run_safety_net(ctx.model, ctx.plan, ctx.activations, ctx.calibration.kept, ctx.errors,
                                        ctx.settings.min_sqnr, ctx.profile)
        ctx.safety_net = outcome
        if fixed is not None:
            ctx.errors = fixed
        return PassResult(bool(outcome.changed), {"triggered": outcome.triggered, "changed": len(outcome.changed)})
