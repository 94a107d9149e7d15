"""shape-inference: run onnx's shape inference and record the inferred types on the IR's values.

Only types are added; nodes and names are untouched, so the pass always preserves semantics. Values whose
type inference cannot determine keep what they had.
"""
from __future__ import annotations

import onnx

from qcompiler.onnx_io import model_to_proto
from qcompiler.onnx_io.graph_protos import graph_protos
from qcompiler.passmanager import Pass, PassResult, register_pass


@register_pass
class ShapeInference(Pass):
    name = "shape-inference"
    description = "infer value types and shapes with onnx.shape_inference and record them on the values"
    preserves_semantics = True

    def run(self, model) -> PassResult:
        proto = model_to_proto(model)
        # tensors are not needed for inference beyond their shapes; drop raw data to keep this cheap
        try:
            inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
        except Exception as e:  # inference is best effort
            return PassResult(False, {"error": str(e).splitlines()[0][:200]})
        infos = {}

        for gp in graph_protos(inferred.graph):
            for vi in list(gp.value_info) + list(gp.output):
                infos[vi.name] = vi
        added = 0
        for g in model.graphs():
            for v in g.local_values():
                if v.tensor is not None or v.is_input:
                    continue
                vi = infos.get(v.name)
                if vi is None or not vi.HasField("type"):
                    continue
                if v.type is None or (v.type != vi.type and _more_specific(vi.type, v.type)):
                    v.type = vi.type
                    added += 1
        return PassResult(added > 0, {"typed_values": added})


def _more_specific(new: onnx.TypeProto, old: onnx.TypeProto) -> bool:
    if not new.HasField("tensor_type") or not old.HasField("tensor_type"):
        return False
    nt, ot = new.tensor_type, old.tensor_type
    if not ot.elem_type and nt.elem_type:
        return True
    if nt.HasField("shape") and not ot.HasField("shape"):
        return True
    if nt.HasField("shape") and ot.HasField("shape") and len(nt.shape.dim) == len(ot.shape.dim):
        return sum(d.HasField("dim_value") for d in nt.shape.dim) > sum(d.HasField("dim_value") for d in ot.shape.dim)
    return False
