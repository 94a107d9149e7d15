"""`place`: build the quantization plan once (qcompiler/quant/placement.py): which values and weight uses get
quantizers, on what grid, which stay float and why; and which nodes a config sends to fp16 islands."""
from __future__ import annotations

from qcompiler.errors import QCompilerError
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.core.float16 import float16_nodes
from qcompiler.quant.placement import build_plan


@register_pass
class Place(QuantPass):
    name = "place"
    description = "build the quantization plan from the graph, the target profile, the config and the statistics"
    requires = ("quant-context", "canonical-names", "output-opset", "statistics")
    ensures = ("plan",)

    def run(self, ctx) -> PassResult:
        cal = ctx.calibration
        ctx.plan = plan = build_plan(ctx.model, ctx.profile, cal.dtypes, cal.stats(), ctx.options)
        if plan.needs_opset() > ctx.model.opset:
            raise QCompilerError(f"the plan needs opset {plan.needs_opset()} (16-bit or per-block Q/DQ), but the "
                                 f"model is at opset {ctx.model.opset}: pass --opset {plan.needs_opset()} or keep "
                                 f"8-bit grids")
        ctx.float16 = float16_nodes(ctx.model, ctx.settings.config, plan.dtypes)
        quantized = sum(1 for s in plan.values.values() if not s.keep_float)
        return PassResult(False, {"quantized_values": quantized, "float_values": len(plan.values) - quantized,
                                  "weight_uses": sum(1 for s in plan.uses.values() if s.kind == "weight"),
                                  "supergroups": len(plan.supergroups)})
