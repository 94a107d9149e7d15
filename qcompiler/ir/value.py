"""Values: every tensor of a graph (graph input, initializer, node output), with an ordered list of uses.

Field notes §3: AIMET let the graph-output "consumer" overwrite a branch's real consumers. Here a use is
`Usage(user, index)` where `user` is a Node (`index` = input slot) or a Graph (`index` = output position), so a
value read by N nodes and also a graph output has N+1 uses and none replaces another.
Values compare by identity (no `__eq__`); the name is an exact key, unique in the model.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Optional, Union

import numpy as np
import onnx

from qcompiler.ir.node import constant_node_value
from qcompiler.ir.tensor import Tensor

if TYPE_CHECKING:  # pragma: no cover
    from qcompiler.ir.graph import Graph
    from qcompiler.ir.node import Node


class Usage(NamedTuple):
    """One use of a value: input slot `index` of node `user`, or output position `index` of graph `user`."""

    user: "Union[Node, Graph]"
    index: int

    @property
    def is_graph_output(self) -> bool:
        return not hasattr(self.user, "op_type")


class Value:
    """A tensor of the graph: produced by one node output, or a graph input, or an initializer."""

    __slots__ = ("name", "type", "producer", "index", "_uses", "tensor", "graph", "is_input", "doc_string",
                 "metadata_props", "meta")

    def __init__(self, name: str, graph: "Graph", type: Optional[onnx.TypeProto] = None,
                 producer: Optional["Node"] = None, index: int = -1):
        self.name = name
        self.graph = graph
        self.type = type
        self.producer = producer
        self.index = index
        self._uses: list[Usage] = []
        self.tensor: Optional[Tensor] = None
        self.is_input = False
        self.doc_string = ""
        self.metadata_props = None
        self.meta: Optional[dict] = None  # free-form annotations for passes (e.g. supergroup membership)

    def __repr__(self) -> str:
        return f"Value({self.name!r})"

    # --- uses -------------------------------------------------------------------------------------------
    def uses(self) -> tuple:
        """A snapshot of the uses in insertion order, safe to iterate while mutating the graph."""
        return tuple(self._uses)

    def consumers(self) -> list:
        """Distinct consuming nodes in use order (graph-output uses excluded)."""
        seen, out = set(), []
        for u in self._uses:
            if not u.is_graph_output and id(u.user) not in seen:
                seen.add(id(u.user))
                out.append(u.user)
        return out

    def is_graph_output(self) -> bool:
        return any(u.is_graph_output and u.user is self.graph for u in self._uses)

    def is_output_of_any_graph(self) -> bool:
        return any(u.is_graph_output for u in self._uses)

    # --- constants --------------------------------------------------------------------------------------
    @property
    def is_initializer(self) -> bool:
        return self.tensor is not None

    def is_constant(self) -> bool:
        """True for initializers (that are not graph inputs) and outputs of Constant nodes."""
        if self.tensor is not None:
            return not self.is_input
        p = self.producer
        return p is not None and p.op_type == "Constant" and p.domain in ("", "ai.onnx")

    def const_value(self) -> Optional[np.ndarray]:
        """The constant's values (read-only), or None if this value is not a constant."""
        if self.tensor is not None:
            return None if self.is_input else self.tensor.numpy()
        p = self.producer
        if p is not None and p.op_type == "Constant" and p.domain in ("", "ai.onnx"):
            return constant_node_value(p)
        return None

    # --- type info --------------------------------------------------------------------------------------
    @property
    def dtype(self) -> Optional[int]:
        """ONNX element type (TensorProto.FLOAT, ...) or None if unknown."""
        if self.tensor is not None:
            return self.tensor.dtype
        t = self.type
        if t is not None and t.HasField("tensor_type") and t.tensor_type.elem_type:
            return t.tensor_type.elem_type
        p = self.producer
        if p is not None and p.op_type == "Constant":
            v = self.const_value()
            if v is not None:
                return onnx.helper.np_dtype_to_tensor_dtype(v.dtype)
        return None

    @property
    def shape(self) -> Optional[tuple]:
        """Dims as ints, symbolic names (str) or None; None if the rank is unknown."""
        if self.tensor is not None:
            return self.tensor.dims
        t = self.type
        if t is not None and t.HasField("tensor_type") and t.tensor_type.HasField("shape"):
            return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                         for d in t.tensor_type.shape.dim)
        return None

    def set_tensor_type(self, elem_type: int, shape=None) -> None:
        self.type = onnx.helper.make_tensor_type_proto(elem_type, shape)
