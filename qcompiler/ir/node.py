"""Nodes: an operator with ordered inputs (empty optional slots kept as None), ordered outputs and attributes.

Attributes are decoded lazily: importing a 90k-node model keeps each node's AttributeProtos until a pass
reads `node.attrs`, and export writes untouched protos back as they were. Subgraph attributes are always
decoded, because bodies are first-class graphs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qcompiler.errors import InvalidModelError

if TYPE_CHECKING:  # pragma: no cover
    from qcompiler.ir.graph import Graph
    from qcompiler.ir.value import Value

AT = onnx.AttributeProto


class Attr:
    """One attribute: name, ONNX attribute type and a Python value (a Graph for GRAPH, a list for GRAPHS)."""

    __slots__ = ("name", "type", "value", "ref_attr_name", "doc_string")

    def __init__(self, name: str, type: int, value: Any, ref_attr_name: str = "", doc_string: str = ""):
        self.name, self.type, self.value = name, type, value
        self.ref_attr_name, self.doc_string = ref_attr_name, doc_string

    def __repr__(self) -> str:
        return f"Attr({self.name}={self.value!r})"


class Subgraph:
    """What a GRAPH attribute holds: the IR's Graph derives from it, so attributes know a body without the node
    module importing the graph module (which imports this one)."""
    __slots__ = ()


def attr_from_python(name: str, value: Any) -> Attr:
    """Build an Attr from a plain Python value, inferring the ONNX type as onnx.helper does."""
    if isinstance(value, Attr):
        return value
    if isinstance(value, Subgraph):
        return Attr(name, AT.GRAPH, value)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, Subgraph) for v in value):
        return Attr(name, AT.GRAPHS, list(value))
    if isinstance(value, np.ndarray):
        return Attr(name, AT.TENSOR, numpy_helper.from_array(value, name))
    p = helper.make_attribute(name, value)
    return Attr(name, p.type, helper.get_attribute_value(p))


class Node:
    """An operator instance. Mutate inputs/outputs only through the Graph's API, which keeps the index."""

    __slots__ = ("op_type", "domain", "name", "inputs", "outputs", "_attrs", "_attr_protos", "doc_string",
                 "overload", "metadata_props", "graph", "meta", "_source")

    def __init__(self, op_type: str, domain: str = "", name: str = ""):
        self.op_type, self.domain, self.name = op_type, domain, name
        self.inputs: list[Optional["Value"]] = []
        self.outputs: list[Optional["Value"]] = []
        self._attrs: Optional[dict] = {}
        self._attr_protos: Optional[list] = None
        self.doc_string = ""
        self.overload = ""
        self.metadata_props = None
        self.graph: Optional["Graph"] = None
        self.meta: Optional[dict] = None
        # (NodeProto, op_type, domain, name, input names, output names, doc_string, overload) as imported;
        # export reuses the proto only while all of these still match (exporter._node_protos)
        self._source: Optional[tuple] = None

    def __repr__(self) -> str:
        return f"Node({self.op_type} {self.name!r})"

    @property
    def attrs(self) -> dict:
        """Ordered name -> Attr; decoded from the original protos on first access."""
        if self._attrs is None:
            d = {}
            for p in self._attr_protos:
                d[p.name] = _decode_attr(p)
            self._attrs = d
            self._attr_protos = None
        return self._attrs

    def attr(self, name: str, default: Any = None) -> Any:
        """The Python value of attribute `name`, or `default`."""
        a = self.attrs.get(name)
        return default if a is None else a.value

    def set_attr(self, name: str, value: Any) -> None:
        self.attrs[name] = attr_from_python(name, value)

    def subgraphs(self) -> list:
        """Graphs held in this node's attributes (If branches, Loop/Scan bodies), in attribute order."""
        out = []
        attrs = self._attrs if self._attrs is not None else {}
        for a in attrs.values():
            if a.type == AT.GRAPH:
                out.append(a.value)
            elif a.type == AT.GRAPHS:
                out.extend(a.value)
        return out

    def input_names(self) -> list:
        return ["" if v is None else v.name for v in self.inputs]

    def output_names(self) -> list:
        return ["" if v is None else v.name for v in self.outputs]


def _decode_attr(p: onnx.AttributeProto) -> Attr:
    if p.ref_attr_name:
        return Attr(p.name, p.type, None, p.ref_attr_name, p.doc_string)
    t = p.type
    if t == AT.FLOAT:
        v = p.f
    elif t == AT.INT:
        v = p.i
    elif t == AT.STRING:
        v = p.s
    elif t == AT.INTS:
        v = list(p.ints)
    elif t == AT.FLOATS:
        v = list(p.floats)
    elif t == AT.STRINGS:
        v = list(p.strings)
    elif t in (AT.TENSOR, AT.SPARSE_TENSOR, AT.TYPE_PROTO, AT.TENSORS, AT.SPARSE_TENSORS, AT.TYPE_PROTOS):
        v = helper.get_attribute_value(p)
    elif t in (AT.GRAPH, AT.GRAPHS):   # the importer decodes these (bodies are graphs of the IR)
        raise ValueError(f"attribute {p.name[:80]!r} of type {t} must be imported as a subgraph")
    else:   # the importer refuses these; a hand-built proto may still carry one
        raise InvalidModelError(f"attribute {p.name[:80]!r} has {'no type' if t == 0 else f'unknown type {t}'}")
    return Attr(p.name, t, v, "", p.doc_string)


def constant_node_value(node: Node) -> Optional[np.ndarray]:
    """The tensor a Constant node produces, as numpy (None for sparse or unsupported forms)."""
    if node.meta is not None and "_const_cache" in node.meta:
        return node.meta["_const_cache"]
    attrs = node.attrs
    v = None
    if "value" in attrs:
        v = numpy_helper.to_array(attrs["value"].value)
    elif "value_float" in attrs:
        v = np.array(attrs["value_float"].value, dtype=np.float32)
    elif "value_floats" in attrs:
        v = np.array(attrs["value_floats"].value, dtype=np.float32)
    elif "value_int" in attrs:
        v = np.array(attrs["value_int"].value, dtype=np.int64)
    elif "value_ints" in attrs:
        v = np.array(attrs["value_ints"].value, dtype=np.int64)
    elif "value_string" in attrs:
        v = np.array(attrs["value_string"].value, dtype=object)
    elif "value_strings" in attrs:
        v = np.array(attrs["value_strings"].value, dtype=object)
    if v is not None:
        v.setflags(write=False)
        if node.meta is None:
            node.meta = {}
        node.meta["_const_cache"] = v
    return v
