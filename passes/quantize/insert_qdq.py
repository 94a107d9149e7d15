"""`insert-qdq`: write the plan into the model: QuantizeLinear/DequantizeLinear pairs on activations, weights
as integers with a DequantizeLinear (or float on their int grid where the target has no integer kernel for the
node: quant/prefold.py), biases as int32 (qcompiler/quant/qdq.py)."""
from __future__ import annotations

from qcompiler.ir import verify
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.context import QuantPass
from qcompiler.quant.prefold import prefold_unfused_param_dq
from qcompiler.quant.qdq import apply_plan


@register_pass
class InsertQDQ(QuantPass):
    name = "insert-qdq"
    description = "write the plan into the model as QuantizeLinear/DequantizeLinear nodes"
    preserves_semantics = False
    requires = ("quant-context", "plan", "encodings")
    ensures = ("qdq",)

    def run(self, ctx) -> PassResult:
        ctx.activations, ctx.params = apply_plan(ctx.model, ctx.plan)
        ctx.prefolded = prefold_unfused_param_dq(ctx.model, ctx.profile)
        if ctx.prefolded:
            ctx.notes.append(f"{len(ctx.prefolded)} weights/biases stored fake-quantized (float on their int "
                             f"grid): their node has no integer kernel on {ctx.profile.get('name', '?')}, a DQ "
                             f"would run every inference")
        verify(ctx.model.graph)
        return PassResult(True, {"activations": len(ctx.activations), "params": len(ctx.params),
                                 "stored_on_grid": len(ctx.prefolded)})
