"""simplify-shape-of: read a tensor's shape before the data-movement op that only permutes it.

`Shape(Transpose(x, perm))` is `Gather(Shape(x), perm)`. Exporters emit this when they compute a batch size
for an initial state after a layout change (PyTorch's LSTM export: `Transpose -> Shape -> Gather`). Computing the
shape from `x` lets the Transpose die when nothing else reads it; in a QDQ model it also stops a
DequantizeLinear -> Transpose pair from running on every inference only to feed a Shape.
"""
from __future__ import annotations

import numpy as np

from qcompiler.passmanager import Pass, PassResult, register_pass


@register_pass
class SimplifyShapeOf(Pass):
    name = "simplify-shape-of"
    description = "Shape(Transpose(x, perm)) -> Gather(Shape(x), perm); Transposes read only by Shape then die"
    preserves_semantics = True

    def run(self, model) -> PassResult:
        rewritten = removed = 0
        for g in model.graphs():
            for shape in g.nodes_by_op("Shape"):
                t = shape.inputs[0].producer if shape.inputs and shape.inputs[0] is not None else None
                if t is None or t.op_type != "Transpose" or t.graph is not g or t.domain not in ("", "ai.onnx"):
                    continue
                if shape.attr("start", 0) != 0 or shape.attr("end") is not None:
                    continue
                perm = t.attr("perm")
                if perm is None:
                    rank = None if t.inputs[0].shape is None else len(t.inputs[0].shape)
                    if rank is None:
                        continue
                    perm = list(range(rank))[::-1]
                x = t.inputs[0]
                new_shape = g.add_node("Shape", [x], [shape.outputs[0].name + "_of_input"], before=shape,
                                       name=shape.name + "_of_input")
                idx = g.add_constant(np.asarray(perm, np.int64), shape.name + "_perm")
                gather = g.add_node("Gather", [new_shape.outputs[0], idx], [shape.outputs[0].name + "_permuted"],
                                    {"axis": 0}, name=shape.name + "_permute", before=shape)
                gather.outputs[0].type = shape.outputs[0].type
                g.substitute(shape.outputs[0], gather.outputs[0], remove=[shape])
                rewritten += 1
                if not any(v is not None and v.uses() for v in t.outputs):
                    g.remove_node(t)
                    removed += 1
        return PassResult(rewritten > 0, {"rewritten": rewritten, "transposes_removed": removed})
