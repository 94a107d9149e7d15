"""`insert-qdq`: write the plan into the model: QuantizeLinear/DequantizeLinear pairs on activations, weights
as integers with a DequantizeLinear or float on their int grid (the plan's `storage`, decided first from the
target's integer-kernel rule: quant/weight_storage.py), biases as int32 (qcompiler/quant/core/qdq.py)."""
from __future__ import annotations

from qcompiler.ir import verify
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.core.qdq import apply_plan
from qcompiler.quant.placement import decide_storage


@register_pass
class InsertQDQ(QuantPass):
    name = "insert-qdq"
    description = "write the plan into the model as QuantizeLinear/DequantizeLinear nodes"
    preserves_semantics = False
    requires = ("quant-context", "plan", "encodings")
    ensures = ("qdq", "quantized")

    def run(self, ctx) -> PassResult:
        decide_storage(ctx.plan, ctx.model)   # after every pass that edits weight specs (bias-correction adds some)
        ctx.activations, ctx.params = apply_plan(ctx.model, ctx.plan)
        ctx.prefolded = ctx.plan.stored_on_grid()
        if ctx.prefolded:
            ctx.notes.append(f"{len(ctx.prefolded)} weights/biases stored fake-quantized (float on their int "
                             f"grid): their node has no integer kernel on {ctx.profile.name}, a DQ "
                             f"would run every inference")
        verify(ctx.model.graph)
        return PassResult(True, {"activations": len(ctx.activations), "params": len(ctx.params),
                                 "stored_on_grid": len(ctx.prefolded)})
