"""ONNX ModelProto -> IR, losing nothing: opsets, metadata, value_info, functions, names, attribute types.

Nodes are created in two sweeps per graph (outputs first, then inputs), so a graph whose node list is not
topologically sorted still imports; a name that nothing defines is reported with the node and slot.
Bodies of If/Loop/Scan become nested Graphs that resolve outer names through their parent.
Every tensor the model holds goes through `tensor_check` (size against shape, external data inside the model's
folder only) before anything uses it; tensors outside initializers get their external bytes inlined.
"""
from __future__ import annotations

from collections import defaultdict
from itertools import repeat
from operator import attrgetter
from typing import Optional

import onnx

from qcompiler.errors import InvalidModelError, ModelLoadError
from qcompiler.ir.graph import Graph
from qcompiler.ir.model import Model
from qcompiler.ir.names import NameScope
from qcompiler.ir.node import AT, Attr, Node, _decode_attr
from qcompiler.ir.tensor import Tensor
from qcompiler.ir.value import Usage, Value
from qcompiler.onnx_io.gc_pause import gc_paused
from qcompiler.onnx_io.loop_check import check_loops_end
from qcompiler.onnx_io.tensor_check import (
    check_sparse,
    check_tensor,
    check_text,
    collect_external_files,
    default_schema,
    not_utf8,
    scan_attributes,
    scan_model_extras,
    schema_attribute_types,
    short,
)


def model_from_proto(proto: onnx.ModelProto, base_dir: Optional[str] = None, *, data_stubs: bool = False) -> Model:
    """Build a Model from a ModelProto; external tensors are resolved against `base_dir` (initializers lazily,
    any other tensor inlined now); with no `base_dir`, a tensor that uses external data is refused.

    The caller's proto is never changed. `data_stubs`: initializers with no data at all are accepted (graph-only
    copies made for onnx's version converter, whose tensors the caller puts back before anyone reads them).
    """
    if not isinstance(proto, onnx.ModelProto):
        raise ModelLoadError(f"expected an onnx.ModelProto, got {type(proto).__name__}")
    _check_model_texts(proto)
    with collect_external_files() as files:
        functions, training_info = scan_model_extras(proto.functions, proto.training_info, base_dir)
        names, node_names = NameScope(), NameScope()
        graph = Graph(proto.graph.name or "main_graph", None, names, node_names)
        opsets = {}
        for o in proto.opset_import:
            check_text(o.domain, lambda: "opset import domain")
            opsets[o.domain] = _opset_version(o.domain, o.version)
        ctx = _Ctx(base_dir, data_stubs, opsets.get("", opsets.get("ai.onnx")))
        with gc_paused():
            _fill_graph(graph, proto.graph, ctx, [])
        for sub in ctx.graphs:   # NOTE: each graph's dict of values (its keys in order): a join over the
            _check_names(sub._values, "value")   # model-wide name set walks a sparse table, ~3x slower at 120k
        _check_names(node_names._used, "node")
    if len(ctx.graphs) > 1:   # a Loop has a body: without bodies there is no Loop to check (a walk over every node)
        check_loops_end(graph)
    model = Model(graph, opsets, proto.ir_version)
    model.producer_name = proto.producer_name
    model.producer_version = proto.producer_version
    model.domain = proto.domain
    model.model_version = proto.model_version
    model.doc_string = proto.doc_string
    model.metadata_props = {p.key: p.value for p in proto.metadata_props}
    model.functions = functions
    model.training_info = training_info
    if hasattr(proto, "configuration"):
        model.configuration = list(proto.configuration)
    model.base_dir = base_dir
    model.external_files = frozenset(files)
    return model


def _check_model_texts(proto: onnx.ModelProto) -> None:
    """The model's own string fields are valid UTF-8 (upb hands an invalid one back as bytes)."""
    for field in ("producer_name", "producer_version", "domain", "doc_string"):
        check_text(getattr(proto, field), lambda field=field: f"model {field}")
    for p in proto.metadata_props:
        check_text(p.key, lambda: "metadata key")
        check_text(p.value, lambda p=p: f"metadata value of '{short(p.key)}'")


def _check_names(names, kind: str) -> None:
    """Every value (node) name is valid UTF-8: one join at C speed over the names the import reserved (a name
    upb could not decode is bytes, which str.join refuses); the culprit is looked for only on failure."""
    try:
        "".join(names)
    except TypeError:
        bad = next(x for x in names if x.__class__ is not str)
        raise not_utf8(f"{kind} name", bad) from None


OPSET_MAX = 2 ** 31 - 1   # onnxruntime and onnx's converters keep opset versions in 32 bits (2^62 read as 0)


def _opset_version(domain: str, version: int) -> int:
    """An opset version no reader can misread: 1 .. 2^31-1 (a version beyond onnx's own release is onnxruntime's
    to refuse, with its reason, when a session is made)."""
    if not 1 <= version <= OPSET_MAX:
        raise InvalidModelError(f"opset import of domain '{short(domain or 'ai.onnx')}' has version {version}; "
                                f"a version is between 1 and {OPSET_MAX}")
    return version


class _Ctx:
    __slots__ = ("base_dir", "stubs", "pending", "opset", "checked_attrs", "graphs")

    def __init__(self, base_dir, stubs=False, opset=None):
        self.base_dir, self.stubs = base_dir, stubs
        self.opset = opset   # the default domain's version: which schema says what inputs an op requires
        # (op_type, domain, each AttributeProto serialized) of attribute lists that passed `scan_attributes` with
        # no body and no external data: the same bytes on the same op pass again (see _fill_graph)
        self.checked_attrs: set = set()
        # body Graph id -> its GraphProto, until the outer graph is complete (per import: an import that fails
        # half way leaves nothing behind)
        self.pending: dict = {}
        self.graphs: list = []   # every graph imported, the main one first


def _inlined_node(np_: onnx.NodeProto, where, ctx: _Ctx) -> onnx.NodeProto:
    """A copy of `np_` whose attribute tensors hold their external bytes inline (the caller's proto unchanged)."""
    c = onnx.NodeProto()
    c.CopyFrom(np_)
    scan_attributes(c.attribute, where, ctx.base_dir, inline=True)
    return c


def _empty_input(ctx: _Ctx, g: Graph, name: str, op_type: str, domain: str, slot: int) -> None:
    """An input name left empty means "optional input omitted"; where the op's schema requires that input,
    every pass reading it would trip over None, so the model is refused here with one line."""
    if domain not in ("", "ai.onnx") or ctx.opset is None:
        return
    schema = default_schema(op_type, ctx.opset)
    inputs = schema.inputs if schema is not None else ()
    if slot < len(inputs) and inputs[slot].option == onnx.defs.OpSchema.FormalParameterOption.Single:
        raise InvalidModelError(f"graph '{short(g.name)}': node '{short(name)}' ({short(op_type)}) input {slot} "
                                f"is empty, but {short(op_type)} requires that input")


_KNOWN_ELEM_TYPES = frozenset(onnx.TensorProto.DataType.values())


def _check_type(g: Graph, what: str, name: str, t) -> None:
    """A value's declared type names only element types ONNX defines (a type of 99 is one line, not a KeyError in
    whatever reads the type later)."""
    while t is not None:
        kind = t.WhichOneof("value")
        if kind in ("tensor_type", "sparse_tensor_type"):
            elem = getattr(t, kind).elem_type
            if elem not in _KNOWN_ELEM_TYPES:
                raise InvalidModelError(f"graph '{short(g.name)}': {what} '{short(name)}' has element type {elem}, "
                                        f"which ONNX does not define")
            return
        if kind == "sequence_type":
            t = t.sequence_type.elem_type
        elif kind == "optional_type":
            t = t.optional_type.elem_type
        elif kind == "map_type":
            t = t.map_type.value_type
        else:
            return


def _define(g: Graph, local: dict, name: str):
    """Register a value defined in this graph under its file name; a body name that shadows an outer one
    (allowed by ONNX) gets a fresh unique name, since names are model-wide exact keys here."""
    if name in local:
        return None
    actual = name if name not in g.names else g.names.fresh(name)
    if actual == name:
        g.names.reserve(name)
    v = g._new_value(actual)
    local[name] = v
    return v


def _lookup(name: str, local: dict, scope: list):
    v = local.get(name)
    if v is not None:
        return v
    for d in reversed(scope):
        v = d.get(name)
        if v is not None:
            return v
    return None


_NODE_BASE = ("input", "output", "name", "op_type", "domain", "attribute", "doc_string", "overload", "metadata_props")
_NODE_EXTRA = tuple(f.name for f in onnx.NodeProto.DESCRIPTOR.fields if f.number > 9)   # fields a later onnx adds
# a node's fields in the order _fill_graph unpacks them, the last one true when any field the IR does not model
# is set (then export rebuilds the node, without it). NOTE: one C-level attrgetter while onnx adds at most one
# such field (device_configurations); a star-unpacked list per node cost ~1 % of the import
if len(_NODE_EXTRA) <= 1:
    _NODE_FIELDS = attrgetter(*_NODE_BASE, *(_NODE_EXTRA or ("metadata_props",)))
else:   # pragma: no cover - a later onnx
    _node_base, _node_extra = attrgetter(*_NODE_BASE), attrgetter(*_NODE_EXTRA)

    def _NODE_FIELDS(np_):
        return (*_node_base(np_), any(_node_extra(np_)))


_serialize = onnx.AttributeProto.SerializeToString
_domain_of = attrgetter("domain")
_MEMO_BYTES = 4096   # attribute lists larger than this (tensors, long lists) are checked each time, never kept


def _fill_graph(g: Graph, gp: onnx.GraphProto, ctx: _Ctx, scope: list) -> None:
    check_text(g.name, lambda: "graph name")
    check_text(gp.doc_string, lambda g=g: f"doc string of graph '{short(g.name)}'")
    g.doc_string = gp.doc_string
    ctx.graphs.append(g)
    names = g.names
    used_names = names._used
    # NOTE: in the main graph no outer name exists to shadow, so every value keeps its file name: the graph's own
    # name -> Value dict is the file-name lookup too (one dict insert per value, not two), and the model-wide
    # name set is filled in bulk after sweep 1 (`local` answers "seen before?" until then)
    body = bool(scope) or bool(used_names)
    values = g._values
    local: dict = {} if body else values
    # graph inputs (old-style models also list initializers here)
    for vi in gp.input:
        v = _define(g, local, vi.name)
        if v is None:
            raise InvalidModelError(f"graph '{short(g.name)}': input name '{short(vi.name)}' is listed twice")
        v.type = vi.type if vi.HasField("type") else None
        if v.type is not None:
            _check_type(g, "input", vi.name, v.type)
        v.is_input = True
        if vi.doc_string:
            check_text(vi.doc_string, lambda: f"doc string of input '{short(vi.name)}'")
        v.doc_string = vi.doc_string
        g.inputs.append(v)
    initializers = g.initializers
    base_dir, stubs, imported = ctx.base_dir, ctx.stubs, Tensor._imported
    for tp in gp.initializer:
        tname = tp.name   # NOTE: read once: each field read on a upb message costs about a microsecond
        v = local.get(tname)
        if v is None:
            if not body:   # the main graph: its names go into `used_names` after sweep 1
                v = local[tname] = Value(tname, g)
            elif tname in used_names:   # shadows an outer-scope name
                v = _define(g, local, tname)
            else:   # what _define does for a new name
                used_names.add(tname)
                v = values[tname] = local[tname] = Value(tname, g)
        elif v.tensor is not None:
            raise InvalidModelError(f"graph '{short(g.name)}': initializer '{short(tname)}' is listed twice")
        # NOTE: _tensor inlined (one Python call less per initializer: ~30k in bench_ir)
        dt, dims, ref = check_tensor(tp, lambda tname=tname, g=g: f"initializer '{short(tname)}' of graph "
                                                                  f"'{short(g.name)}'", base_dir, stubs)
        v.tensor = imported(tp, dt, dims, ref)
        initializers[v.name] = v
    sparse = list(gp.sparse_initializer)
    for i, sp in enumerate(sparse):
        def where(sp=sp, g=g):
            return f"sparse initializer '{short(sp.values.name)}' of graph '{short(g.name)}'"
        if check_sparse(sp, where, ctx.base_dir):
            c = onnx.SparseTensorProto()
            c.CopyFrom(sp)
            check_sparse(c, where, ctx.base_dir, inline=True)
            sparse[i] = c
    g.sparse_initializers = sparse
    # sweep 1: nodes and their outputs
    # NOTE: every field of every node is read by one C-level map of an attrgetter (no Python loop over
    # ListFields, no bytecode per field): per-node Python work is what made importing a 90k-node graph 5x
    # slower than protobuf's parse.
    nps = gp.node[:]   # NOTE: a slice of a upb container is a C copy, about twice as fast as list()
    # the Nodes, in file order (index i is nps[i]), made by one C-level map and filled in below
    nodes = list(map(Node.__new__, repeat(Node, len(nps))))
    graph_nodes = []   # (Node, its proto with attribute tensors inlined) for each node that holds a body
    # NOTE: while every input so far names a value already defined in this graph (the file is sorted), inputs
    # are linked here; from the first one that is not (a forward reference, an outer-scope name that a later
    # node may shadow, a missing name) linking stops and sweep 2 resumes at that node and slot, so uses are
    # appended in node order either way.
    cut = None   # (node position, input slot) where sweep 2 starts
    new_usage = tuple.__new__   # Usage(n, i) without NamedTuple's Python-level __new__
    # NOTE: the scopes' sets directly: NameScope.__contains__/reserve as Python calls cost ~0.04 s per 90k nodes
    used_node_names = g.node_names._used
    node_names = g.node_names
    reserve = used_names.add
    seen = used_names if body else local
    no_attrs = ()
    local_get = local.get
    empty_defined = "" in local   # a graph input named '': an empty input name then needs the slow path
    expected_by_op: dict = {}
    checked_attrs = ctx.checked_attrs
    base_dir = ctx.base_dir
    nodes_by_op = defaultdict(dict)   # the by-op index, in node order
    for n, np_, (ins, outs, name, op_type, domain, attributes, doc, overload, meta, extra) in zip(
            nodes, nps, map(_NODE_FIELDS, nps)):
        # NOTE: every slot set here once, each by its own statement (Node.__init__ would set seven of them twice;
        # a 4-target tuple assignment builds and unpacks a tuple): ~90k nodes
        n.op_type = op_type
        n.domain = domain
        n.name = name
        n.graph = g
        n.doc_string = doc   # checked below when not empty
        n.overload = overload
        n.metadata_props = n.meta = None
        if name:
            if name in used_node_names:
                n.name = node_names.fresh(name)
            else:
                used_node_names.add(name)
        if doc or overload or meta:
            if doc:
                check_text(doc, lambda name=name: f"doc string of node '{short(name)}'")
            if overload:
                check_text(overload, lambda name=name: f"overload of node '{short(name)}'")
            if meta:
                meta = n.metadata_props = list(meta)
        has_graph = False
        if attributes:
            attributes = attributes[:]
            # NOTE: a check's outcome depends only on the attributes' bytes and the op (its schema's types; the
            # opset is fixed per import), so a list seen before on the same op is not checked again: one C-level
            # serialization per attribute instead of a ListFields and the checks (an LLM repeats a handful of
            # attribute lists across its nodes). Only lists that passed with no body and no external data are
            # kept, and only small ones; a failing list is checked in full each time, so its message is the same.
            key = (op_type, domain, *map(_serialize, attributes))
            if key not in checked_attrs:
                # every attribute's tensors checked (any op may carry one); bodies are checked as they are imported
                def where(name=name, op_type=op_type, g=g):
                    return f"node '{short(name)}' ({short(op_type)}) in graph '{short(g.name)}'"
                expected = expected_by_op.get((op_type, domain), False)
                if expected is False:
                    expected = expected_by_op[op_type, domain] = (
                        schema_attribute_types(op_type, ctx.opset) if not domain or domain == "ai.onnx" else None)
                has_graph, external = scan_attributes(attributes, where, base_dir, expected=expected)
                if external:
                    np_ = _inlined_node(np_, where, ctx)
                    attributes = list(np_.attribute)
                elif not has_graph and sum(map(len, key[2:])) <= _MEMO_BYTES:
                    checked_attrs.add(key)
            n._attrs = {} if has_graph else None
            n._attr_protos = attributes
        else:
            n._attrs = None
            n._attr_protos = no_attrs
        ins = ins[:]   # NOTE: a slice of a upb container is a C copy, about twice as fast as list()
        if cut is None:
            vs = list(map(local_get, ins))
            if None in vs or empty_defined:
                vs = n.inputs = []
                for i, iname in enumerate(ins):
                    if not iname:
                        _empty_input(ctx, g, name, op_type, domain, i)
                        vs.append(None)
                        continue
                    v = local_get(iname)
                    if v is None:
                        cut = (nodes.index(n), i)
                        break
                    vs.append(v)
                    v._uses.append(new_usage(Usage, (n, i)))   # g._add_use, for a local v with no index built
            else:
                n.inputs = vs
                i = 0
                for v in vs:
                    v._uses.append(new_usage(Usage, (n, i)))
                    i += 1
        else:
            n.inputs = []
        outs = outs[:]
        # NOTE: every name this graph defines (or shadows) is in `seen` (the model-wide `used_names`; in the main
        # graph, `local`), so one lookup clears the common case; the duplicate and shadow checks run only for a
        # name seen before. One output with a new name (most nodes) takes the first branch, without the loop.
        if len(outs) == 1 and (oname := outs[0]) and oname not in seen:
            local[oname] = v = Value(oname, g, None, n, 0)
            if body:
                reserve(oname)
                values[oname] = v
            n.outputs = [v]
        else:
            n.outputs = n_outputs = []
            i = 0
            for oname in outs:
                if oname and oname not in seen:
                    local[oname] = v = Value(oname, g, None, n, i)
                    if body:
                        reserve(oname)
                        values[oname] = v
                    n_outputs.append(v)
                    i += 1
                    continue
                elif not oname:
                    n_outputs.append(None)
                    i += 1
                    continue
                elif oname in local:
                    raise InvalidModelError(f"graph '{short(g.name)}': node '{short(name)}' ({short(op_type)}) output "
                                            f"'{short(oname)}' is already defined (duplicate name)")
                else:   # shadows an outer-scope name: fresh unique name (see _define)
                    v = _define(g, local, oname)
                v.producer = n
                v.index = i
                n_outputs.append(v)
                i += 1
        nodes_by_op[op_type][n] = None
        if has_graph:
            graph_nodes.append((n, np_))
            n._source = None
        elif extra or meta:
            n._source = None
        else:
            # what export compares against to reuse `np_` unchanged (see exporter._node_protos)
            n._source = (np_, op_type, domain, name, ins, outs, doc, overload)
    if not body:
        used_names.update(local)
    all_nodes = nodes
    if g._nodes:
        g._nodes.update(dict.fromkeys(all_nodes))
    else:
        g._nodes = dict.fromkeys(all_nodes)
    by_op = g._by_op
    for op, ops in nodes_by_op.items():   # a few distinct op types
        if op in by_op:
            by_op[op].update(ops)
        else:
            by_op[op] = ops
    try:   # domains: one C-speed join over the few distinct ones (see _check_names)
        "".join(set(map(_domain_of, all_nodes)))
    except TypeError:
        bad = next(n for n in all_nodes if n.domain.__class__ is not str)
        raise not_utf8(f"domain of node '{short(bad.name)}'", bad.domain) from None
    try:   # op types: one C-speed join over the few distinct ones (see _check_names)
        "".join(by_op)
    except TypeError:
        raise not_utf8(f"graph '{short(g.name)}': op type", next(x for x in by_op if x.__class__ is not str)) \
            from None
    # unnamed nodes get fresh unique names later by canonicalize; keep '' as imported
    # sweep 2: subgraphs, then inputs
    for n, np_ in graph_nodes:
        _decode_body_attrs(n, np_, g, ctx)
    forward_ref = False
    if cut is not None:
        position = {n: i for i, n in enumerate(nodes)}
    for here in range(cut[0] if cut is not None else len(nodes), len(nodes)):
        n, np_ = nodes[here], nps[here]
        inputs = n.inputs
        for i, iname in enumerate(np_.input[:]):   # read again: only the nodes after a forward reference
            if i < len(inputs):   # linked in sweep 1 (the node where linking stopped)
                continue
            if not iname:
                _empty_input(ctx, g, np_.name, np_.op_type, np_.domain, i)
                inputs.append(None)
                continue
            v = local.get(iname)
            if v is None:
                v = _lookup(iname, local, scope)
                if v is None:
                    if iname in {sp.values.name for sp in gp.sparse_initializer}:
                        raise InvalidModelError(f"graph '{short(g.name)}': node '{short(np_.name)}' "
                                                f"({short(np_.op_type)}) input {i} '{short(iname)}' is a sparse "
                                                f"initializer; qcompiler reads only dense ones (store it dense)")
                    raise InvalidModelError(f"graph '{short(g.name)}': node '{short(np_.name)}' "
                                            f"({short(np_.op_type)}) input {i} '{short(iname)}' is not produced by "
                                            f"any node, graph input or initializer")
            inputs.append(v)
            if v.graph is g and g._index is None:
                v._uses.append(Usage(n, i))   # what g._add_use does when no index is built yet
            else:
                g._add_use(v, Usage(n, i))
            p = v.producer
            if p is not None and p.graph is g and position[p] >= here:
                forward_ref = True
    bodies = bool(graph_nodes)
    for n, _ in graph_nodes:
        for sg in n.subgraphs():
            _link_subgraph(sg, n, ctx, scope + [local])
    # not topologically sorted, or bodies that may capture a value defined later: sort (a cycle is named)
    if forward_ref or bodies:
        g.toposort()
    for vi in gp.output:
        v = _lookup(vi.name, local, scope)
        if v is None:
            raise InvalidModelError(f"graph '{short(g.name)}': output '{short(vi.name)}' is not produced by any node, "
                                    f"input or initializer")
        if vi.HasField("type"):
            _check_type(g, "output", vi.name, vi.type)
        if vi.HasField("type") and (v.type is None or v.graph is g):
            if v.type is None or not v.is_input:
                v.type = vi.type
        if vi.doc_string:
            check_text(vi.doc_string, lambda: f"doc string of output '{short(vi.name)}'")
            v.doc_string = vi.doc_string
        g.add_output(v)
    for vi in gp.value_info:
        v = local.get(vi.name)
        if v is not None and vi.HasField("type"):
            _check_type(g, "value_info", vi.name, vi.type)
            if v.type is None:
                v.type = vi.type
            g.value_info_order.append(v.name)
    g.quantization_annotation = list(gp.quantization_annotation)
    if hasattr(gp, "metadata_props"):
        g.metadata_props = list(gp.metadata_props)


def _decode_body_attrs(n: Node, np_: onnx.NodeProto, g: Graph, ctx: _Ctx) -> None:
    """Decode the attributes of a node that holds a body; each body becomes a Graph (filled after sweep 2)."""
    attrs = {}
    for a in np_.attribute:
        if a.type == AT.GRAPH:
            attrs[a.name] = Attr(a.name, a.type, _subgraph(a.g, n, g, ctx), a.ref_attr_name, a.doc_string)
        elif a.type == AT.GRAPHS:
            attrs[a.name] = Attr(a.name, a.type, [_subgraph(x, n, g, ctx) for x in a.graphs],
                                 a.ref_attr_name, a.doc_string)
        else:
            attrs[a.name] = _decode_attr(a)
    n._attrs = attrs
    n._attr_protos = None


def _subgraph(gp: onnx.GraphProto, parent: Node, outer: Graph, ctx: _Ctx) -> Graph:
    """Create a body graph now (so its values exist) and link its inputs once the outer graph is complete."""
    sg = Graph(gp.name or f"{parent.name}_body", parent, outer.names, outer.node_names)
    ctx.pending[id(sg)] = gp
    return sg


def _link_subgraph(sg: Graph, parent: Node, ctx: _Ctx, scope: list) -> None:
    gp = ctx.pending.pop(id(sg))
    _fill_graph(sg, gp, ctx, scope)
