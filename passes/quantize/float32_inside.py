"""`float32-inside` (optional, `--recipe float32-inside`): a float16 model computes in float32 inside, its inputs
and outputs keep float16 (qcompiler/quant/float16.compute_in_float32). Runs right after `canonicalize`, before
the opset conversion and calibration, so every later pass sees a float32 model and the QDQ model gets the
integer kernels of the float32 one. Without it a float16 model is quantized in float16 (qdq.float_route:
float16 Q/DQ at opset >= 19, Casts around float32 Q/DQ below), which onnxruntime's CPU provider runs through
Casts, slower than the float16 model itself (the function's docstring has the figures). A model with no float16
value is left as it is."""
from __future__ import annotations

from qcompiler.ir import verify
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.context import QuantPass
from qcompiler.quant.float16 import compute_in_float32


@register_pass
class Float32Inside(QuantPass):
    name = "float32-inside"
    description = "a float16 model computes in float32 inside; its inputs and outputs stay float16"
    preserves_semantics = False     # float32 arithmetic: the outputs change by float16 rounding
    after = "canonicalize"

    def run(self, ctx) -> PassResult:
        counts = compute_in_float32(ctx.model)
        if not any(counts.values()):
            return PassResult(False)
        verify(ctx.model.graph)
        ctx.notes.append(f"float32-inside: the float16 model computes in float32 ({counts['initializers']} "
                         f"initializers, {counts['types']} declared types, {counts['edge_casts']} Casts at its "
                         f"inputs and outputs)")
        return PassResult(True, counts)
