"""`upcast-float16`: a float16 model computes in float32 between its Q/DQ; its interface stays float16.

Users bring half-precision exports (`model.half()` before torch.onnx.export, optimum's `--fp16`, onnxconverter's
float16 conversion). Every quantizer here has a float32 scale (QuantizeLinear before opset 19 takes float32
only; onnxruntime's QDQ fusions want float32 too), so such a model used to come out with
`QuantizeLinear bound to different types (tensor(float16) and tensor(float))`: exit 1 after all the work. A
QDQ model's float arithmetic is float32 anyway (onnxruntime's integer kernels dequantize to float32), so here
the model is lifted to float32 before calibration: float16 initializers, value types, `Cast(to=FLOAT16)` and
`dtype`/`value` attributes (ConstantOfShape, Constant, RandomNormal, EyeLike) become float32, in bodies too. The
graph's float16 inputs and outputs keep their names and types: a Cast to float32 after each such input and a
Cast back to float16 before each such output, so a caller feeds and gets float16 as before. The report's
notes say so. A model without float16 values is left untouched. The profile decides (`float16_compute`): on a
runtime that computes in half precision (trt, qnn_htp) the model stays float16 and its Q/DQ take the value's own
type (qdq.float_route: float16 scales from opset 19, Casts around float32 Q/DQ below).
"""
from __future__ import annotations

from qcompiler.ir import verify
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.core.float16 import compute_in_float32


@register_pass
class UpcastFloat16(QuantPass):
    name = "upcast-float16"
    description = "a float16 model computes in float32 between its Q/DQ; its float16 inputs and outputs stay"
    requires = ("quant-context",)

    def run(self, ctx) -> PassResult:
        if ctx.profile.float16_compute != "float32":
            return PassResult(False, {"upcast": 0})   # the runtime computes in float16: qdq.float_route
        counts = compute_in_float32(ctx.model)
        n = sum(counts.values())
        if n:
            verify(ctx.model.graph)
            ctx.notes.append("float16 model: computed in float32 between its quantizers; its float16 inputs and "
                             "outputs are cast at the boundary")
        return PassResult(n > 0, {"upcast": n, **counts})
