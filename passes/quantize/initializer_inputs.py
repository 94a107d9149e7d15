"""`initializers-as-constants`: initializers that are also listed as graph inputs become plain constants.

Old exporters (IR version < 4, where the format required it) and torch.onnx with `keep_initializers_as_inputs=True`
list every weight as a graph input too. Such an input is overridable, so nothing may treat it as a constant: every
weight of such a model used to stay float (no weight quantizer at all, and nothing said so), and an IR 3 model
came out invalid (its new Q/DQ scales were initializers that are not inputs). Quantization fixes the weights: a
QDQ model's weights are its quantized initializers, a feed could not override them anyway, and the calibration
data never provides them (qcompiler.quant.calibration.data.input_specs skips them). So in the main graph each of them
leaves the input list (name, tensor and readers unchanged), the IR version becomes at least 4 (where initializers
need not be inputs) and the report's notes say how many. Body graphs are left alone (their inputs are formal
parameters).
"""
from __future__ import annotations

from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.core.context import QuantPass

MIN_IR = 4   # the first IR version in which an initializer need not be a graph input


def unlist_initializer_inputs(model) -> int:
    """Make the main graph's initializers that are also inputs plain constants; how many."""
    g = model.graph
    listed = [v for v in g.inputs if v.tensor is not None]
    for v in listed:
        g.unlist_input(v)
    if listed:
        model.ir_version = max(model.ir_version, MIN_IR)
    return len(listed)


@register_pass
class InitializersAsConstants(QuantPass):
    name = "initializers-as-constants"
    description = "initializers also listed as graph inputs (IR < 4, keep_initializers_as_inputs) become constants"
    requires = ("quant-context",)

    def run(self, ctx) -> PassResult:
        n = unlist_initializer_inputs(ctx.model)
        if n:
            ctx.notes.append(f"{n} initializer(s) listed as graph inputs were taken as constants (weights); the "
                             f"quantized model no longer lists them as inputs")
        return PassResult(n > 0, {"unlisted": n})
