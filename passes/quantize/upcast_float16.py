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
notes say so. A model without float16 values is left untouched.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from qcompiler.ir.tensor import Tensor
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.context import QuantPass

F16, F32 = TensorProto.FLOAT16, TensorProto.FLOAT
_DTYPE_ATTRS = ("to", "dtype")            # Cast; RandomNormal(Like)/RandomUniform(Like)/EyeLike/Multinomial
_TENSOR_ATTRS = ("value",)                # Constant, ConstantOfShape
_ATTR_OPS = frozenset(("Cast", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "EyeLike",
                       "Multinomial", "Constant", "ConstantOfShape"))   # only these carry a type (attrs decoded)


def _is_f16_type(t) -> bool:
    return t is not None and t.HasField("tensor_type") and t.tensor_type.elem_type == F16


def _f32_type(t):
    c = onnx.TypeProto()
    c.CopyFrom(t)
    c.tensor_type.elem_type = F32
    return c


def _has_float16(model) -> bool:
    for g in model.graphs():
        if any(v.tensor is not None and v.tensor.dtype == F16 for v in g.initializers.values()):
            return True
        if any(_is_f16_type(v.type) for v in g.inputs) or any(_is_f16_type(v.type) for v in g.outputs):
            return True
        for n in g.nodes:
            if n.op_type in _ATTR_OPS and any(n.attr(a) == F16 for a in _DTYPE_ATTRS):
                return True
    return False


def upcast_float16(model) -> int:
    """Lift `model` to float32 inside, float16 at its interface; the number of float16 things changed."""
    if not _has_float16(model):
        return 0
    changed = 0
    main = model.graph
    iface_in = [v for v in main.inputs if v.tensor is None and _is_f16_type(v.type)]
    iface_out = [v for v in main.outputs if _is_f16_type(v.type) and not v.is_input]
    for g in model.graphs():
        for v in list(g.initializers.values()):
            if v.tensor is not None and v.tensor.dtype == F16:
                # NOTE: every reader is converted at once, so no copy on write: the value itself changes type
                v.tensor = Tensor.from_array(np.asarray(v.tensor.numpy(), np.float32))
                if v.type is not None and _is_f16_type(v.type):
                    v.type = _f32_type(v.type)
                changed += 1
        for v in g.local_values():
            if v.is_input and g is main:
                continue   # the interface keeps float16 (a Cast follows)
            if _is_f16_type(v.type):
                v.type = _f32_type(v.type)
                changed += 1
        for n in g.nodes:
            if n.op_type not in _ATTR_OPS:
                continue
            for a in _DTYPE_ATTRS:
                if n.attr(a) == F16:
                    n.set_attr(a, F32)
                    changed += 1
            for a in _TENSOR_ATTRS:
                t = n.attr(a)
                if isinstance(t, onnx.TensorProto) and t.data_type == F16 and t.data_location != t.EXTERNAL:
                    n.set_attr(a, numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32), t.name))
                    changed += 1
    for v in iface_in:
        uses = [u for u in v.uses() if not u.is_graph_output]
        if uses:
            cast = main.insert_after(v, "Cast", attrs={"to": F32}, uses=uses, name=f"{v.name}_to_float32")
            cast.outputs[0].set_tensor_type(F32, v.shape)
    for v in iface_out:
        uses = [u for u in v.uses() if u.is_graph_output]
        shape = v.shape
        cast = main.insert_after(v, "Cast", attrs={"to": F16}, uses=uses, name=f"{v.name}_to_float16")
        out = cast.outputs[0]
        out.set_tensor_type(F16, shape)
        if v.type is not None and _is_f16_type(v.type):
            v.type = _f32_type(v.type)
    return changed + len(iface_in) + len(iface_out)


@register_pass
class UpcastFloat16(QuantPass):
    name = "upcast-float16"
    description = "a float16 model computes in float32 between its Q/DQ; its float16 inputs and outputs stay"
    requires = ("quant-context",)

    def run(self, ctx) -> PassResult:
        n = upcast_float16(ctx.model)
        if n:
            ctx.notes.append("float16 model: computed in float32 between its quantizers; its float16 inputs and "
                             "outputs are cast at the boundary")
        return PassResult(n > 0, {"upcast": n})
