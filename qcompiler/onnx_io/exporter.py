"""IR -> ONNX ModelProto. Writes back every field the importer kept; attributes never decoded go out as read."""
from __future__ import annotations

import onnx

from ..ir.graph import Graph
from ..ir.model import Model


def _value_info(v, want_type: bool = True) -> onnx.ValueInfoProto:
    vi = onnx.ValueInfoProto()
    vi.name = v.name
    if v.type is not None:
        vi.type.CopyFrom(v.type)
    elif want_type and v.tensor is not None:
        vi.type.CopyFrom(onnx.helper.make_tensor_type_proto(v.tensor.dtype, list(v.tensor.dims)))
    if v.doc_string:
        vi.doc_string = v.doc_string
    return vi


def graph_to_proto(g: Graph, gp: "onnx.GraphProto | None" = None) -> onnx.GraphProto:
    """Serialize one graph (into `gp` if given, which avoids copying large initializers twice)."""
    gp = onnx.GraphProto() if gp is None else gp
    gp.name = g.name
    if g.doc_string:
        gp.doc_string = g.doc_string
    NodeProto = onnx.NodeProto
    protos = []
    for n in g._nodes:
        p = NodeProto(op_type=n.op_type, name=n.name,
                      input=["" if v is None else v.name for v in n.inputs],
                      output=["" if v is None else v.name for v in n.outputs])
        if n.domain:
            p.domain = n.domain
        attrs = n._attr_protos if n._attrs is None else n.attr_protos()
        if attrs:
            p.attribute.extend(attrs)
        if n.doc_string:
            p.doc_string = n.doc_string
        if n.overload:
            p.overload = n.overload
        if n.metadata_props:
            p.metadata_props.extend(n.metadata_props)
        protos.append(p)
    gp.node.extend(protos)
    gp.initializer.extend([v.tensor.to_proto(name) for name, v in g.initializers.items()])
    if g.sparse_initializers:
        gp.sparse_initializer.extend(g.sparse_initializers)
    gp.input.extend([_value_info(v, want_type=False) for v in g.inputs])
    gp.output.extend([_value_info(v) for v in g.outputs])
    skip = {v.name for v in g.inputs} | {v.name for v in g.outputs}
    seen = set()
    infos = []
    for name in g.value_info_order:
        v = g._values.get(name)
        if v is not None and v.type is not None and name not in skip and name not in seen and v.tensor is None:
            seen.add(name)
            infos.append(_value_info(v))
    for v in g._values.values():
        if v.type is not None and v.name not in skip and v.name not in seen and v.tensor is None and not v.is_input:
            seen.add(v.name)
            infos.append(_value_info(v))
    gp.value_info.extend(infos)
    if g.quantization_annotation:
        gp.quantization_annotation.extend(g.quantization_annotation)
    if g.metadata_props:
        gp.metadata_props.extend(g.metadata_props)
    return gp


def model_to_proto(model: Model) -> onnx.ModelProto:
    mp = onnx.ModelProto()
    mp.ir_version = model.ir_version
    for domain, version in model.opset_imports.items():
        o = mp.opset_import.add()
        o.domain, o.version = domain, version
    if model.producer_name:
        mp.producer_name = model.producer_name
    if model.producer_version:
        mp.producer_version = model.producer_version
    if model.domain:
        mp.domain = model.domain
    if model.model_version:
        mp.model_version = model.model_version
    if model.doc_string:
        mp.doc_string = model.doc_string
    for k, v in model.metadata_props.items():
        e = mp.metadata_props.add()
        e.key, e.value = k, v
    graph_to_proto(model.graph, mp.graph)
    if model.functions:
        mp.functions.extend(model.functions)
    if model.training_info:
        mp.training_info.extend(model.training_info)
    if model.configuration:
        mp.configuration.extend(model.configuration)
    return mp
