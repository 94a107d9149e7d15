"""IR -> ONNX ModelProto. Writes back every field the importer kept; attributes never decoded go out as read."""
from __future__ import annotations

import sys
from operator import attrgetter

import onnx
from onnx import numpy_helper

AT = onnx.AttributeProto

from qcompiler.ir.graph import Graph
from qcompiler.ir.model import Model
from qcompiler.ir.tensor import read_external_bytes
from qcompiler.onnx_io.gc_pause import gc_paused

EXTERNAL_MIN_BYTES = 1024   # tensors under this stay inline (onnx's own size_threshold)
_ALIGN = 4096               # large tensors start on a page boundary, so onnxruntime can map them
_ALIGN_OVER = 1 << 20


class ExternalData:
    """Where a model's main-graph initializers go when it is written with external data, tensor by tensor.

    `tensor_proto(name, tensor)` returns what the model file holds for one initializer: the tensor itself when it
    is small (under `min_bytes`) or a string tensor, else a stub (name, type, dims, `external_data` location,
    offset and length) whose bytes were appended to `data_file` (named `location` relative to the model file).
    Only one tensor's bytes are held at a time: an external tensor of the input is read from its file without
    being decoded or cached in the IR. `reference(name, tensor)` is a hook for writers that can point at bytes
    that already exist (onnxruntime sessions, see ort_session): (location, offset, length) or None.
    """

    def __init__(self, data_file=None, location: str = "", min_bytes: int = EXTERNAL_MIN_BYTES):
        self.data_file, self.location, self.min_bytes = data_file, location, min_bytes
        self.offset = 0

    def reference(self, name: str, tensor):
        return None

    def write(self, raw) -> None:
        """Append one tensor's bytes to the data file (one call per tensor)."""
        self.data_file.write(raw)

    def tensor_proto(self, name: str, tensor) -> onnx.TensorProto:
        if tensor.dtype == onnx.TensorProto.STRING or tensor.nbytes < self.min_bytes:
            return tensor.to_proto(name)
        ref = self.reference(name, tensor)
        if ref is not None:
            return external_stub(name, tensor, *ref)
        raw = tensor_bytes(name, tensor) if self.data_file is not None else None
        if raw is None:
            return tensor.to_proto(name)
        align = _ALIGN if len(raw) >= _ALIGN_OVER else 16
        pad = -self.offset % align
        if pad:
            self.data_file.write(bytes(pad))
            self.offset += pad
        stub = external_stub(name, tensor, self.location, self.offset, len(raw))
        self.write(raw)
        self.offset += len(raw)
        return stub


def encode_attr(a) -> onnx.AttributeProto:
    """An IR Attr as an AttributeProto (a body attribute through graph_to_proto)."""
    p = onnx.AttributeProto()
    p.name, p.type = a.name, a.type
    if a.doc_string:
        p.doc_string = a.doc_string
    if a.ref_attr_name:
        p.ref_attr_name = a.ref_attr_name
        return p
    t, v = a.type, a.value
    if t == AT.FLOAT:
        p.f = v
    elif t == AT.INT:
        p.i = v
    elif t == AT.STRING:
        p.s = v if isinstance(v, bytes) else str(v).encode()
    elif t == AT.INTS:
        p.ints.extend(v)
    elif t == AT.FLOATS:
        p.floats.extend(v)
    elif t == AT.STRINGS:
        p.strings.extend(s if isinstance(s, bytes) else str(s).encode() for s in v)
    elif t == AT.TENSOR:
        p.t.CopyFrom(v)
    elif t == AT.SPARSE_TENSOR:
        p.sparse_tensor.CopyFrom(v)
    elif t == AT.TYPE_PROTO:
        p.tp.CopyFrom(v)
    elif t == AT.TENSORS:
        p.tensors.extend(v)
    elif t == AT.SPARSE_TENSORS:
        p.sparse_tensors.extend(v)
    elif t == AT.TYPE_PROTOS:
        p.type_protos.extend(v)
    elif t == AT.GRAPH:
        p.g.CopyFrom(graph_to_proto(v))
    elif t == AT.GRAPHS:
        p.graphs.extend(graph_to_proto(g) for g in v)
    return p


def node_attr_protos(n) -> list:
    """A node's AttributeProtos for export: the original protos while never decoded, else re-encoded."""
    if n._attrs is None:
        return n._attr_protos
    return [encode_attr(a) for a in n._attrs.values()]


def external_stub(name: str, tensor, location: str, offset: int, length: int) -> onnx.TensorProto:
    """A TensorProto with no data of its own: its bytes are `length` bytes at `offset` of the file `location`."""
    t = onnx.TensorProto(name=name, data_type=tensor.dtype, dims=tensor.dims,
                         data_location=onnx.TensorProto.EXTERNAL)
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def tensor_bytes(name: str, tensor) -> "bytes | memoryview | None":
    """The little-endian raw bytes of a tensor (ONNX's raw_data layout), or None when it has none (strings).

    An external tensor not yet decoded is read from its file and neither decoded nor cached: writing a model of
    2 GB of external weights holds one tensor at a time, not all of them.
    """
    if tensor.is_external:
        return read_external_bytes(tensor._external, name)
    a = tensor._array
    if a is not None and a.dtype.kind in "biuf" and a.dtype.isnative and a.flags.c_contiguous \
            and onnx.helper.np_dtype_to_tensor_dtype(a.dtype) == tensor.dtype and sys.byteorder == "little":
        return memoryview(a.reshape(-1)).cast("B")   # the array's own bytes, no copy (a quantized weight)
    p = tensor.to_proto(name)
    if p.HasField("raw_data"):
        return p.raw_data
    p = numpy_helper.from_array(numpy_helper.to_array(p), name)   # typed fields (float_data...)
    if p.data_type != tensor.dtype or not p.HasField("raw_data"):
        return None
    return p.raw_data


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


_name_of = attrgetter("name")
_serialize_node = onnx.NodeProto.SerializeToString   # mapped in C over ~90k nodes (no comprehension frame)


def _node_protos(g: Graph) -> list:
    """One NodeProto per node, in order. A node whose op, domain, name, input/output names, doc string and
    overload all still equal what was imported, and whose attributes were never decoded, gets its original
    proto back (checked here, so no mutation path has to remember to mark nodes dirty)."""
    NodeProto = onnx.NodeProto
    protos = []
    append = protos.append
    for n in g._nodes:
        # NOTE: names by a C-level map (no comprehension frame per node); an omitted optional slot (None) has
        # no name, and only such a node takes the comprehension
        try:
            ins = list(map(_name_of, n.inputs))
        except AttributeError:
            ins = ["" if v is None else v.name for v in n.inputs]
        try:
            outs = list(map(_name_of, n.outputs))
        except AttributeError:
            outs = ["" if v is None else v.name for v in n.outputs]
        src = n._source
        if (src is not None and n._attrs is None and n.metadata_props is None and src[4] == ins
                and src[5] == outs and src[3] == n.name and src[1] == n.op_type and src[2] == n.domain
                and src[6] == n.doc_string and src[7] == n.overload):
            append(src[0])
            continue
        p = NodeProto(op_type=n.op_type, name=n.name, input=ins, output=outs)
        if n.domain:
            p.domain = n.domain
        attrs = node_attr_protos(n)
        if attrs:
            p.attribute.extend(attrs)
        if n.doc_string:
            p.doc_string = n.doc_string
        if n.overload:
            p.overload = n.overload
        if n.metadata_props:
            p.metadata_props.extend(n.metadata_props)
        append(p)
    return protos


def _initializer_protos(g: Graph, stub_over: "int | None" = None) -> list:
    """One TensorProto per initializer; with `stub_over`, tensors above that many bytes go out as stubs (name,
    type and dims, no data) for tools that read only the graph (onnx's version converter)."""
    if stub_over is None:
        return [v.tensor.to_proto(name) for name, v in g.initializers.items()]
    return [v.tensor.to_proto(name) if v.tensor.nbytes <= stub_over else
            onnx.TensorProto(name=name, data_type=v.tensor.dtype, dims=v.tensor.dims)
            for name, v in g.initializers.items()]


def _fill_rest(g: Graph, gp: onnx.GraphProto) -> None:
    """Every GraphProto field after `initializer` (field numbers 10-16)."""
    if g.doc_string:
        gp.doc_string = g.doc_string
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


def graph_to_proto(g: Graph, gp: "onnx.GraphProto | None" = None, stub_over: "int | None" = None) -> onnx.GraphProto:
    """Serialize one graph (into `gp` if given, which avoids copying large initializers twice)."""
    gp = onnx.GraphProto() if gp is None else gp
    gp.name = g.name
    gp.node.extend(_node_protos(g))
    gp.initializer.extend(_initializer_protos(g, stub_over))
    _fill_rest(g, gp)
    return gp


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_TAG_NODE, _TAG_INITIALIZER, _TAG_GRAPH = b"\x0a", b"\x2a", b"\x3a"   # length-delimited fields 1, 5 and 7


def _add_fields(pieces: list, tag: bytes, payloads) -> None:
    """Append `tag, length, payload` for each payload: the header as its own piece, so a tensor's bytes are
    never copied just to prefix them (writelines / one final join handle the pieces)."""
    short = [tag + bytes((k,)) for k in range(128)]   # most nodes serialize to under 128 bytes
    append = pieces.append
    for b in payloads:
        k = len(b)
        append(short[k] if k < 128 else tag + _varint(k))
        append(b)


def _graph_bytes(g: Graph) -> list:
    """The GraphProto wire bytes as pieces, fields in number order as protobuf writes them.

    NOTE: why not `graph_to_proto(g).SerializeToString()`: adding 90k nodes and ~200 MB of initializers to a
    new GraphProto copies every one of them, and serializing walks them again; serializing each (mostly
    reused) piece once and joining is the same bytes for about a third of the time.
    """
    head = onnx.GraphProto()
    head.name = g.name
    rest = onnx.GraphProto()
    _fill_rest(g, rest)
    pieces: list = []
    _add_fields(pieces, _TAG_NODE, list(map(_serialize_node, _node_protos(g))))
    pieces.append(head.SerializeToString())
    _add_fields(pieces, _TAG_INITIALIZER, [t.SerializeToString() for t in _initializer_protos(g)])
    pieces.append(rest.SerializeToString())
    return pieces


def _model_head_tail(model: Model) -> tuple:
    """ModelProtos holding the fields before `graph` (1-6) and after it (8-26)."""
    head, tail = onnx.ModelProto(), onnx.ModelProto()
    head.ir_version = model.ir_version
    for domain, version in model.opset_imports.items():
        o = tail.opset_import.add()
        o.domain, o.version = domain, version
    if model.producer_name:
        head.producer_name = model.producer_name
    if model.producer_version:
        head.producer_version = model.producer_version
    if model.domain:
        head.domain = model.domain
    if model.model_version:
        head.model_version = model.model_version
    if model.doc_string:
        head.doc_string = model.doc_string
    for k, v in model.metadata_props.items():
        e = tail.metadata_props.add()
        e.key, e.value = k, v
    if model.functions:
        tail.functions.extend(model.functions)
    if model.training_info:
        tail.training_info.extend(model.training_info)
    if model.configuration:
        tail.configuration.extend(model.configuration)
    return head, tail


def model_to_proto(model: Model, stub_over: "int | None" = None) -> onnx.ModelProto:
    """The model as one ModelProto. `stub_over`: main-graph initializers above that many bytes are stubs with
    no data (see _initializer_protos), so a graph-only tool gets the model without a copy of its weights."""
    head, tail = _model_head_tail(model)
    mp = onnx.ModelProto()
    mp.MergeFrom(head)
    with gc_paused():
        graph_to_proto(model.graph, mp.graph, stub_over)
    mp.MergeFrom(tail)
    return mp


def model_to_byte_pieces(model: Model) -> list:
    """The bytes of `model_to_proto(model).SerializeToString()` as a list of pieces, for `file.writelines`
    (joining ~200 MB of weights into one bytes object just to write it costs a copy)."""
    head, tail = _model_head_tail(model)
    with gc_paused():
        graph = _graph_bytes(model.graph)
    return [head.SerializeToString(), _TAG_GRAPH, _varint(sum(map(len, graph)))] + graph + [tail.SerializeToString()]


def model_to_bytes(model: Model) -> bytes:
    """`model_to_proto(model).SerializeToString()`, built from per-node and per-tensor pieces (see _graph_bytes)."""
    return b"".join(model_to_byte_pieces(model))


def write_model(model: Model, f, extra_outputs=(), external: "ExternalData | None" = None) -> None:
    """Write the bytes of `model_to_bytes(model)` to the binary file `f`, one initializer at a time.

    `external`: main-graph initializers go through `external.tensor_proto` (their bytes to its data file, a stub
    here), for models over protobuf's 2 GB limit; the data of an external input tensor is then streamed from
    its file, never held whole.

    NOTE: why: model_to_byte_pieces holds every tensor's serialized bytes at once, a second copy of the weights
    (minilm: +90 MB); here each tensor is serialized, written and dropped, so only the largest one is extra.
    `extra_outputs`: value names appended as name-only graph outputs (calibration copies; onnxruntime infers
    their types).
    """
    g = model.graph
    head, tail = _model_head_tail(model)
    name = onnx.GraphProto()
    name.name = g.name
    rest = onnx.GraphProto()
    with gc_paused():
        nodes: list = []
        _add_fields(nodes, _TAG_NODE, list(map(_serialize_node, _node_protos(g))))
        tensors = _initializer_protos(g) if external is None else \
            [external.tensor_proto(n, v.tensor) for n, v in g.initializers.items()]
        _fill_rest(g, rest)
    rest.output.extend([onnx.ValueInfoProto(name=n) for n in extra_outputs])
    name_b, rest_b = name.SerializeToString(), rest.SerializeToString()
    sizes = [t.ByteSize() for t in tensors]
    heads = [_TAG_INITIALIZER + _varint(k) for k in sizes]
    total = sum(map(len, nodes)) + len(name_b) + sum(map(len, heads)) + sum(sizes) + len(rest_b)
    f.write(head.SerializeToString() + _TAG_GRAPH + _varint(total))
    f.writelines(nodes)
    del nodes
    f.write(name_b)
    for t, h, k in zip(tensors, heads, sizes):
        b = t.SerializeToString()
        if len(b) != k:
            raise RuntimeError(f"initializer '{t.name}': serialized {len(b)} bytes, ByteSize said {k}")
        f.write(h)
        f.write(b)
    f.write(rest_b)
    f.write(tail.SerializeToString())
