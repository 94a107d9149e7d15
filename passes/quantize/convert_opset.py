"""`convert-opset`: bring the model to the output opset chosen before the pipeline (qcompiler/quant/core/opset.py),
once, before calibration: nothing later converts again, so the statistics, the plan and the IR's annotations
all refer to one model."""
from __future__ import annotations

from qcompiler.errors import QCompilerError
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.core.opset import convert_in_place, opset_note
from qcompiler.quant.runtime.memory import release, weight_bytes

COLLECT_OVER_BYTES = 16 << 20   # below this, a full gc (~15 ms) costs more than the replaced graph holds


@register_pass
class ConvertOpset(QuantPass):
    name = "convert-opset"
    description = ("convert the model to the output opset chosen for its Q/DQ (21 where the target widens to 16 "
                   "bits or for int4/int16/blocks, else 13)")
    requires = ("quant-context",)
    ensures = ("output-opset",)

    def run(self, ctx) -> PassResult:
        model, before = ctx.model, ctx.model.opset
        try:
            changed = convert_in_place(model, ctx.opset)
        except QCompilerError:
            # the wish for opset 21 came only from the profile's optional 16-bit widening: quantize at the
            # opset the settings need (widening a value to 16 bits then fails with one line, at `place`)
            if ctx.opset_fallback is None:
                raise
            ctx.opset = ctx.opset_fallback
            ctx.notes.append("the model could not be converted to opset 21; 16-bit widening is off")
            changed = convert_in_place(model, ctx.opset)
        if changed:
            ctx.notes.append(opset_note(before, model.opset))
            if weight_bytes(model) > COLLECT_OVER_BYTES:
                release(collect=True)   # the replaced graph: one big cycle, gone only at a full collection
        return PassResult(changed, {"opset": model.opset})
