"""The ConnectedGraph: nodes and values of one ONNX graph, with a networkx index kept in step by the mutation API.

The index is a `networkx.MultiDiGraph` whose vertices are the graph's nodes plus two sentinels (`SOURCE` for
graph inputs and initializers, `SINK` for graph outputs). Each edge is keyed by
`(value name, producer output index, consumer input index)`, so `Mul(x, x)` has two edges and a value read by N
nodes and also a graph output has N+1. A value that a subgraph body captures from an outer scope adds an edge
to the node that owns the body, keyed `(name, out index, ("capture", inner node name, input index))`, so
topological order and dead-code elimination see through bodies.

Every change goes through the methods below; `qcompiler.ir.invariants.verify` proves the index, the use lists
and the node lists agree.

NOTE: the index is built on first access of `Graph.index` (from the use lists, with the same `_edge_for` /
`_capture_edge` keys the mutation API writes), and kept in step from then on. Importing, canonicalizing and
exporting a 90k-node model never reads it, and adding its ~160k edges one by one cost more than the whole
protobuf parse (benchmarks/bench_ir.py). What reads it: the graph queries (`topological_nodes`, `reachable_from`,
`upstream_of`, `has_path`, `outputs_reached` / `downstream_outputs`: the safety net's reach from a quantizer to
the outputs) and the invariant checker.
"""
from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Iterable, Iterator, Optional, Sequence, Union

if TYPE_CHECKING:  # pragma: no cover
    import networkx as nx

import numpy as np
import onnx

from qcompiler.errors import InvalidModelError
from qcompiler.ir.names import NameScope
from qcompiler.ir.node import Node, Subgraph, attr_from_python
from qcompiler.ir.tensor import Tensor
from qcompiler.ir.value import Usage, Value

SOURCE = "<source>"
SINK = "<sink>"


def _result_type(op_type: str, value: Value, extra: list, node: Node) -> Optional[onnx.TypeProto]:
    """The type of `op(value, ...)` for ops inserted in front of a graph output, which must stay typed."""
    if value.type is None or not value.type.HasField("tensor_type"):
        return value.type
    elem = value.type.tensor_type.elem_type
    if op_type == "QuantizeLinear":
        zp = extra[1] if len(extra) > 1 else None
        elem = (zp.dtype if zp is not None and zp.dtype else node.attr("output_dtype", 0)) or onnx.TensorProto.UINT8
    elif op_type == "DequantizeLinear":
        scale = extra[0] if extra else None
        elem = scale.dtype if scale is not None and scale.dtype else onnx.TensorProto.FLOAT
    elif op_type == "Cast":
        elem = node.attr("to", elem)
    t = onnx.TypeProto()
    t.CopyFrom(value.type)
    t.tensor_type.elem_type = elem
    return t


class Graph(Subgraph):
    """One graph (the main graph or an If/Loop/Scan body). Bodies resolve outer-scope names through `parent`."""

    def __init__(self, name: str = "graph", parent: Optional[Node] = None, names: Optional[NameScope] = None,
                 node_names: Optional[NameScope] = None):
        self.name = name
        self.doc_string = ""
        self.parent: Optional[Node] = parent          # the node whose attribute holds this graph
        self.names = names if names is not None else NameScope()            # value names, model-wide
        self.node_names = node_names if node_names is not None else NameScope()  # node names, model-wide
        self.inputs: list[Value] = []
        self.outputs: list[Value] = []
        self.initializers: dict[str, Value] = {}
        self._nodes: dict[Node, None] = {}             # insertion-ordered set
        self._values: dict[str, Value] = {}            # values defined in this graph
        self._by_op: dict[str, dict[Node, None]] = {}
        self._index = None   # networkx.MultiDiGraph, built lazily by the `index` property
        # raw pieces kept verbatim for a lossless round trip
        self.sparse_initializers: list = []
        self.quantization_annotation: list = []
        self.metadata_props: list = []
        self.value_info_order: list[str] = []

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self._nodes)} nodes)"

    # --- reading ------------------------------------------------------------------------------------------
    @property
    def index(self) -> "nx.MultiDiGraph":
        """The networkx index (nodes + SOURCE/SINK, one keyed edge per use); built on first access."""
        if self._index is None:
            self._index = self._build_index()
        return self._index

    def _build_index(self) -> "nx.MultiDiGraph":
        """Every edge the mutation API would have written for the current uses: node inputs and graph outputs
        of this graph, plus capture edges of this graph's values read from inside bodies."""
        import networkx as nx  # NOTE: imported on first use: ~0.1 s that a CLI run without index queries saves
        index = nx.MultiDiGraph()
        index.add_node(SOURCE)
        index.add_node(SINK)
        index.add_nodes_from(self._nodes)
        add_edge = index.add_edge
        for node in self._nodes:
            for i, v in enumerate(node.inputs):
                if v is not None:
                    e = self._edge_for(v, Usage(node, i))
                    if e is not None:
                        add_edge(e[1], e[2], key=e[3])
        for pos, v in enumerate(self.outputs):
            e = self._edge_for(v, Usage(self, pos))
            if e is not None and e[0] is self:
                add_edge(e[1], e[2], key=e[3])
        for v in self._values.values():
            for use in v._uses:
                c = self._capture_edge(v, use)
                if c is not None:
                    add_edge(c[1], c[2], key=c[3])
        return index

    @property
    def nodes(self) -> list:
        """The nodes in their current order (a snapshot list)."""
        return list(self._nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(list(self._nodes))

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, node: Node) -> bool:
        return node in self._nodes

    def nodes_by_op(self, op_type: str) -> list:
        """Nodes of one op type, in graph order, straight from the index (no scan)."""
        return list(self._by_op.get(op_type, ()))

    def op_types(self) -> list:
        return [k for k, v in self._by_op.items() if v]

    def value(self, name: str) -> Optional[Value]:
        """Resolve a name in this graph, then in enclosing graphs (outer scope)."""
        g = self
        while g is not None:
            v = g._values.get(name)
            if v is not None:
                return v
            g = g.parent.graph if g.parent is not None else None
        return None

    def local_values(self) -> list:
        return list(self._values.values())

    def subgraphs(self, recursive: bool = True) -> list:
        """Bodies of the nodes of this graph (and of their nodes, if recursive)."""
        out = []
        for n in self._nodes:
            if not n._attrs:   # never decoded (None) or empty: no bodies (model.graphs(), 90k nodes: 14 -> 2 ms)
                continue
            for g in n.subgraphs():
                out.append(g)
                if recursive:
                    out.extend(g.subgraphs(True))
        return out

    def all_graphs(self) -> list:
        return [self] + self.subgraphs(True)

    @property
    def root(self) -> "Graph":
        g = self
        while g.parent is not None:
            g = g.parent.graph
        return g

    def is_ancestor_of(self, other: "Graph") -> bool:
        g = other
        while g is not None:
            if g is self:
                return True
            g = g.parent.graph if g.parent is not None else None
        return False

    def _owner_in(self, node: Node) -> Optional[Node]:
        """The node of *this* graph that is `node` or (through bodies) contains it."""
        n = node
        while n is not None:
            if n.graph is self:
                return n
            g = n.graph
            n = g.parent if g is not None else None
        return None

    # --- value creation -------------------------------------------------------------------------------------
    def _new_value(self, name: str, type: Optional[onnx.TypeProto] = None) -> Value:
        v = Value(name, self, type)
        self._values[name] = v
        return v

    def add_input(self, name: str, elem_type: Optional[int] = None, shape=None) -> Value:
        name = self.names.fresh(name) if name in self.names else (self.names.reserve(name) or name)
        v = self._new_value(name, onnx.helper.make_tensor_type_proto(elem_type, shape) if elem_type else None)
        v.is_input = True
        self.inputs.append(v)
        return v

    def add_constant(self, array: Union[np.ndarray, Tensor], name: str = "const") -> Value:
        """A new initializer holding `array`, with a fresh name built from `name`."""
        name = self.names.fresh(name)
        v = self._new_value(name)
        v.tensor = array if isinstance(array, Tensor) else Tensor.from_array(np.asarray(array))
        self.initializers[name] = v
        return v

    def add_output(self, value: Value) -> None:
        """Append `value` as a graph output (one more use; existing uses are untouched)."""
        self._add_use(value, Usage(self, len(self.outputs)))
        self.outputs.append(value)

    def set_output(self, position: int, value: Value) -> None:
        old = self.outputs[position]
        self._remove_use(old, Usage(self, position))
        self.outputs[position] = value
        self._add_use(value, Usage(self, position))

    # --- node creation ------------------------------------------------------------------------------------
    def add_node(self, op_type: str, inputs: Sequence[Optional[Value]] = (), outputs: Union[int, Sequence[str]] = 1,
                 attrs: Optional[dict] = None, name: Optional[str] = None, domain: str = "",
                 before: Optional[Node] = None, after: Optional[Node] = None) -> Node:
        """Create a node; `outputs` is a count or a list of name hints (fresh names are generated from them).

        The node goes at the end, or just before/after a given node, so the node list stays topological when
        the caller inserts next to a producer or consumer.
        """
        node = Node(op_type, domain, self.node_names.fresh(name or op_type.lower()))
        node.graph = self
        if attrs:
            node._attrs = {k: attr_from_python(k, v) for k, v in attrs.items()}
            for a in node._attrs.values():
                for g in (a.value if isinstance(a.value, list) else [a.value]):
                    if isinstance(g, Graph):
                        g.parent = node
        hints = [f"{node.name}_out{i}" for i in range(outputs)] if isinstance(outputs, int) else list(outputs)
        for i, h in enumerate(hints):
            if h == "":
                node.outputs.append(None)
                continue
            v = self._new_value(self.names.fresh(h))
            v.producer, v.index = node, i
            node.outputs.append(v)
        self._insert_node(node, before, after)
        for i, v in enumerate(inputs):
            node.inputs.append(v)
            if v is not None:
                self._link(v, node, i)
        return node

    def _insert_node(self, node: Node, before: Optional[Node], after: Optional[Node]) -> None:
        if before is None and after is None:
            self._nodes[node] = None
        else:
            anchor = before if before is not None else after
            if anchor not in self._nodes:
                raise ValueError(f"{anchor!r} is not in graph {self.name!r}")
            items = list(self._nodes)
            pos = items.index(anchor) + (0 if before is not None else 1)
            items.insert(pos, node)
            self._nodes = dict.fromkeys(items)
        self._by_op.setdefault(node.op_type, {})[node] = None
        if self._index is not None:
            self._index.add_node(node)

    def move_before(self, node: Node, anchor: Node) -> None:
        """Reorder: place `node` just before `anchor` (both in this graph)."""
        items = [n for n in self._nodes if n is not node]
        items.insert(items.index(anchor), node)
        self._nodes = dict.fromkeys(items)

    # --- use bookkeeping (the only code that touches the index) ---------------------------------------------
    def _edge_for(self, value: Value, use: Usage):
        """(graph, u, v, key) of the index edge that records `use` of `value`, or None."""
        if use.is_graph_output:
            g = use.user
            u = value.producer if value.producer is not None and value.producer.graph is g else SOURCE
            if value.graph is not g:   # body output that is an outer value: recorded as a capture
                u = SOURCE
            return g, u, SINK, (value.name, value.index, ("out", use.index))
        node = use.user
        g = node.graph
        if value.graph is g:
            u = value.producer if value.producer is not None else SOURCE
            return g, u, node, (value.name, value.index, use.index)
        return None

    def _capture_edge(self, value: Value, use: Usage):
        """Edge in the value's own graph for a use from inside a body (captured outer-scope value)."""
        vg = value.graph
        user_graph = use.user if use.is_graph_output else use.user.graph
        if user_graph is vg:
            return None
        inner = user_graph.parent if use.is_graph_output else use.user
        owner = vg._owner_in(inner)
        if owner is None:
            return None
        u = value.producer if value.producer is not None else SOURCE
        tag = ("capture", id(use.user), use.index, "out" if use.is_graph_output else "in")
        return vg, u, owner, (value.name, value.index, tag)

    def _add_use(self, value: Value, use: Usage) -> None:
        value._uses.append(use)
        e = self._edge_for(value, use)
        if e is not None and e[0]._index is not None:
            e[0]._index.add_edge(e[1], e[2], key=e[3])
        c = self._capture_edge(value, use)
        if c is not None and c[0]._index is not None:
            c[0]._index.add_edge(c[1], c[2], key=c[3])

    def _remove_use(self, value: Value, use: Usage) -> None:
        for i, u in enumerate(value._uses):
            if u.user is use.user and u.index == use.index:
                del value._uses[i]
                break
        else:
            raise ValueError(f"{value!r} has no use {use}")
        e = self._edge_for(value, use)
        if e is not None and e[0]._index is not None and e[0]._index.has_edge(e[1], e[2], e[3]):
            e[0]._index.remove_edge(e[1], e[2], key=e[3])
        c = self._capture_edge(value, use)
        if c is not None and c[0]._index is not None and c[0]._index.has_edge(c[1], c[2], c[3]):
            c[0]._index.remove_edge(c[1], c[2], key=c[3])

    def _link(self, value: Value, node: Node, index: int) -> None:
        self._add_use(value, Usage(node, index))

    # --- mutation API -----------------------------------------------------------------------------------------
    def set_input(self, node: Node, index: int, value: Optional[Value]) -> None:
        """Point input slot `index` of `node` at `value` (None empties an optional slot)."""
        old = node.inputs[index]
        if old is value:
            return
        if old is not None:
            self._remove_use(old, Usage(node, index))
        node.inputs[index] = value
        if value is not None:
            self._add_use(value, Usage(node, index))

    def append_input(self, node: Node, value: Optional[Value]) -> None:
        node.inputs.append(value)
        if value is not None:
            self._add_use(value, Usage(node, len(node.inputs) - 1))

    def replace_all_uses(self, old: Value, new: Value, include_graph_outputs: bool = False) -> int:
        """Redirect every node use of `old` (in any body too) to `new`; returns how many uses moved.

        NOTE: graph-output uses are left alone unless asked, because moving them renames a model output;
        callers that must keep output names use `rename_value` instead.
        """
        n = 0
        for use in old.uses():
            if use.is_graph_output:
                if include_graph_outputs:
                    use.user.set_output(use.index, new)
                    n += 1
                continue
            use.user.graph.set_input(use.user, use.index, new)
            n += 1
        return n

    def remove_node(self, node: Node, force: bool = False) -> None:
        """Remove a node whose outputs have no uses (or, with force, drop those uses' links too)."""
        for v in node.outputs:
            if v is not None and v._uses and not force:
                raise ValueError(f"cannot remove {node!r}: output '{v.name}' still has {len(v._uses)} use(s)")
        for i, v in enumerate(node.inputs):
            if v is not None:
                self._remove_use(v, Usage(node, i))
        for sg in node.subgraphs():
            sg._detach_captures()
        for v in node.outputs:
            if v is not None:
                for use in v.uses():
                    if use.is_graph_output:
                        raise ValueError(f"cannot remove {node!r}: output '{v.name}' is a graph output")
                    use.user.graph.set_input(use.user, use.index, None)
                del self._values[v.name]
                self.names.release(v.name)
        del self._nodes[node]
        del self._by_op[node.op_type][node]
        if self._index is not None:
            self._index.remove_node(node)
        self.node_names.release(node.name)
        node.graph = None

    def _detach_captures(self) -> None:
        """Drop uses that this body (recursively) makes of values outside it."""
        for n in list(self._nodes):
            for i, v in enumerate(n.inputs):
                if v is not None and not self.is_ancestor_of(v.graph):
                    self._remove_use(v, Usage(n, i))
                    n.inputs[i] = None
            for sg in n.subgraphs():
                sg._detach_captures()
        for pos, v in enumerate(self.outputs):
            if not self.is_ancestor_of(v.graph):
                self._remove_use(v, Usage(self, pos))

    def can_take_name(self, value: Value) -> bool:
        """Can `value` be renamed to stand in for a graph output (a node output of this graph, not itself an
        input, initializer or output)?"""
        return value.graph is self and value.producer is not None and not value.is_output_of_any_graph()

    def substitute(self, old: Value, new: Value, remove: Sequence[Node] = ()) -> None:
        """Let `new` stand for `old`: every use of `old` (node inputs in any body, graph outputs) moves to `new`,
        the nodes in `remove` (now dead: `old`'s producer and whatever else the rewrite replaced) go, with the
        constants only they read; if `old` was a graph output, `new` takes over its name and declared type.

        NOTE: this is the one place that keeps a model's interface when a rewrite replaces an output's producer;
        passes call it instead of juggling replace/remove/rename themselves. `old`'s producer must be in `remove`
        when `old` is a graph output, so its name is free for `new`.
        """
        keep = old.is_output_of_any_graph()
        if keep and not self.can_take_name(new):
            raise ValueError(f"'{new.name}' cannot take over graph output '{old.name}' (it is an input, initializer "
                             f"or output itself, or lives in another graph)")
        if keep and old.producer not in remove:
            raise ValueError(f"graph output '{old.name}' keeps its name only if its producer is removed")
        name, typ = old.name, old.type
        read = [v for n in remove for v in n.inputs]
        self.replace_all_uses(old, new, include_graph_outputs=True)
        for n in remove:
            n.graph.remove_node(n)
        self.drop_if_unused(read)
        if keep:
            self.rename_value(new, name)
            if typ is not None:
                new.type = typ

    def drop_if_unused(self, values: Iterable[Optional[Value]]) -> int:
        """Remove those of `values` that are constants (initializers or Constant-node outputs) left without uses.

        Passes call this with the inputs of the nodes they removed, so constants orphaned by the rewrite go and
        constants that were unused before the pass stay (dead-code elimination is canonicalize's job).
        """
        n = 0
        for v in {id(v): v for v in values if v is not None}.values():
            if v.uses():
                continue
            if v.tensor is not None and not v.is_input and v.graph.initializers.get(v.name) is v:
                v.graph.remove_initializer(v)
                n += 1
            elif v.producer is not None and v.producer.op_type == "Constant" and v.producer.graph is not None \
                    and not any(o is not None and o.uses() for o in v.producer.outputs):
                v.producer.graph.remove_node(v.producer)
                n += 1
        return n

    def remove_initializer(self, value: Value) -> None:
        if value._uses:
            raise ValueError(f"initializer '{value.name}' still has {len(value._uses)} use(s)")
        del self.initializers[value.name]
        if value.is_input:
            self.inputs.remove(value)
        del self._values[value.name]
        self.names.release(value.name)

    def remove_input(self, value: Value) -> None:
        if value._uses:
            raise ValueError(f"graph input '{value.name}' still has {len(value._uses)} use(s)")
        self.inputs.remove(value)
        if value.tensor is not None:
            del self.initializers[value.name]
        del self._values[value.name]
        self.names.release(value.name)

    def unlist_input(self, value: Value) -> None:
        """An initializer also listed as a graph input (IR < 4 files, torch's keep_initializers_as_inputs) leaves
        the input list and becomes a constant; its name, tensor and uses stay."""
        if not value.is_input or value.tensor is None or self.initializers.get(value.name) is not value:
            raise ValueError(f"'{value.name}' is not an initializer listed as an input of graph '{self.name}'")
        self.inputs.remove(value)
        value.is_input = False

    def rename_value(self, value: Value, new_name: str) -> None:
        """Give `value` an exact new name (which must be free model-wide); index keys follow."""
        if new_name == value.name:
            return
        if new_name in self.names:
            raise ValueError(f"cannot rename '{value.name}' to '{new_name}': name in use")
        g = value.graph
        uses = value.uses()
        for u in uses:
            self._remove_use(value, u)
        self.names.release(value.name)
        del g._values[value.name]
        if value.name in g.initializers:
            del g.initializers[value.name]
            value.name = new_name
            g.initializers[new_name] = value
        value.name = new_name
        self.names.reserve(new_name)
        g._values[new_name] = value
        for u in uses:
            self._add_use(value, u)

    def swap_names(self, a: Value, b: Value) -> None:
        """Exchange the names of two values (used to keep a graph output's name on a new producer)."""
        na, nb = a.name, b.name
        tmp = self.names.fresh(na + "__swap")
        self.names.release(tmp)
        self.rename_value(a, tmp)
        self.rename_value(b, na)
        self.rename_value(a, nb)

    def insert_after(self, value: Value, op_type: str, extra_inputs: Sequence[Optional[Value]] = (),
                     attrs: Optional[dict] = None, uses: Optional[Iterable[Usage]] = None,
                     name: Optional[str] = None, domain: str = "") -> Node:
        """Insert `op_type(value, *extra_inputs)` and move the chosen uses of `value` (default: all) to its output.

        If a graph-output use moves, the new output takes over the output's name and `value` gets a fresh
        one, so graph output names and order never change.
        """
        chosen = list(value.uses()) if uses is None else list(uses)
        after = value.producer if value.producer is not None and value.producer.graph is self else None
        node = self.add_node(op_type, [value, *extra_inputs], [f"{value.name}_{op_type.lower()}"], attrs,
                             name=name or f"{value.name}_{op_type}", domain=domain, after=after,
                             before=None if after is not None else self._first_node())
        out = node.outputs[0]
        moved_output = False
        for u in chosen:
            if u.is_graph_output:
                u.user.set_output(u.index, out)
                if not moved_output:
                    out.type = _result_type(op_type, value, list(extra_inputs), node)
                moved_output = True
            else:
                u.user.graph.set_input(u.user, u.index, out)
        if moved_output and value.graph is self and not value.is_input and value.tensor is None:
            self.swap_names(value, out)
        return node

    def insert_before(self, node: Node, input_index: int, op_type: str, extra_inputs: Sequence[Optional[Value]] = (),
                      attrs: Optional[dict] = None, name: Optional[str] = None, domain: str = "") -> Node:
        """Insert `op_type(node.inputs[i], *extra_inputs)` feeding only that one input slot of `node`."""
        value = node.inputs[input_index]
        g = node.graph
        new = g.add_node(op_type, [value, *extra_inputs], [f"{value.name}_{op_type.lower()}"], attrs,
                         name=name or f"{node.name}_in{input_index}_{op_type}", domain=domain, before=node)
        g.set_input(node, input_index, new.outputs[0])
        return new

    def _first_node(self) -> Optional[Node]:
        return next(iter(self._nodes), None)

    # --- constants: shared by reference, copied on write ---------------------------------------------------
    def readers(self, value: Value) -> list:
        """Every node (in any graph) that reads `value`, plus graph objects for output uses."""
        return [u.user for u in value.uses()]

    def set_constant(self, value: Value, array: np.ndarray, writer: Optional[Node] = None) -> Value:
        """Write new contents into an initializer; copy on write if anyone other than `writer` reads it.

        Field notes §4: folding a SmoothQuant scale into a shared GELU `0.5` rescaled every GELU. Here the
        writer gets a private copy (its inputs are rewired to it) and the other readers keep the original.
        Returns the value that now holds `array` (the original or the copy).
        """
        if value.tensor is None or value.is_input:
            raise ValueError(f"'{value.name}' is not an initializer; cannot write it")
        others = [u for u in value.uses() if writer is None or u.user is not writer]
        if writer is not None and others:
            g = writer.graph
            copy = g.add_constant(np.asarray(array), value.name)
            for i, v in enumerate(writer.inputs):
                if v is value:
                    g.set_input(writer, i, copy)
            return copy
        if writer is None and len(value.uses()) > 1:
            raise ValueError(f"'{value.name}' has {len(value.uses())} readers; name the writer to copy on write")
        value.tensor = Tensor.from_array(np.asarray(array))
        return value

    def private_constant(self, node: Node, index: int) -> Value:
        """Make input `index` of `node` a constant only `node` reads (copying it if shared), and return it."""
        v = node.inputs[index]
        arr = v.const_value()
        if arr is None:
            raise ValueError(f"input {index} of {node!r} is not a constant")
        if len(v.uses()) == 1 and v.tensor is not None:
            return v
        copy = node.graph.add_constant(np.array(arr), v.name)
        node.graph.set_input(node, index, copy)
        return copy

    # --- graph queries, answered by the index ------------------------------------------------------------------
    # NOTE: these are the IR's graph algorithms (topological order, reachability, paths, the outputs a value
    # reaches); passes call them instead of walking use lists by hand. Each builds the index on first use (a
    # graph that is only imported, rewritten locally and exported never pays for it) and reads the same edges
    # the invariant checker proves, captures into If/Loop/Scan bodies included.
    def _position_key(self):
        pos = {n: i for i, n in enumerate(self._nodes)}
        pos[SOURCE], pos[SINK] = -1, len(pos)
        return pos.__getitem__

    def topological_nodes(self, op_types: Optional[Iterable[str]] = None) -> list:
        """This graph's nodes in topological order (a body's owner after what its body captures), ties broken by
        node-list position, so a sorted graph gives its node list. With `op_types`: only nodes of those types, in
        that order (the layer order a sequential pass walks). A cycle is an InvalidModelError naming the graph."""
        import networkx as nx
        try:
            order = list(nx.lexicographical_topological_sort(self.index, key=self._position_key()))
        except nx.NetworkXUnfeasible:
            raise InvalidModelError(f"graph '{self.name}' has a cycle") from None
        wanted = None if op_types is None else frozenset(op_types)
        return [n for n in order if n is not SOURCE and n is not SINK and (wanted is None or n.op_type in wanted)]

    def _own(self, node: Node) -> Node:
        owner = self._owner_in(node)
        if owner is None:
            raise ValueError(f"{node!r} is not in graph {self.name!r} or its bodies")
        return owner

    def reachable_from(self, node: Node) -> list:
        """The nodes of this graph that read, directly or through other nodes (and bodies), what `node` (or the
        node of this graph whose body holds it) computes; in node-list order."""
        import networkx as nx
        found = nx.descendants(self.index, self._own(node))
        return [n for n in self._nodes if n in found]

    def upstream_of(self, node: Node) -> list:
        """The nodes of this graph whose results `node` (or its owner here) reads, directly or not; in node-list
        order."""
        import networkx as nx
        found = nx.ancestors(self.index, self._own(node))
        return [n for n in self._nodes if n in found]

    def has_path(self, a: Node, b: Node) -> bool:
        """Does what `a` computes reach `b` (both in this graph or its bodies; a node reaches itself)?"""
        import networkx as nx
        return nx.has_path(self.index, self._own(a), self._own(b))

    def outputs_reached(self, values: Iterable[Value]) -> dict:
        """{value: [outputs of this graph it reaches]} for each of `values` (in output order, once each); one
        sweep over the index in reverse topological order, however many values are asked about. A value this
        graph cannot see (another branch's body) reaches nothing."""
        import networkx as nx
        index = self.index
        try:
            order = list(nx.topological_sort(index))
        except nx.NetworkXUnfeasible:
            raise InvalidModelError(f"graph '{self.name}' has a cycle") from None
        reach: dict = {}   # node -> bit set (an int) of output positions
        for n in reversed(order):
            if n is SINK:
                continue
            bits = 0
            for _, m, key in index.out_edges(n, keys=True):
                bits |= (1 << key[2][1]) if m is SINK else reach[m]
            reach[n] = bits
        out = {}
        for v in values:
            bits = 0
            for use in v.uses():
                if use.is_graph_output:
                    if use.user is self:
                        bits |= 1 << use.index
                    continue
                owner = self._owner_in(use.user)
                if owner is not None:
                    bits |= reach[owner]
            seen: dict = {}
            for i, o in enumerate(self.outputs):
                if bits >> i & 1:
                    seen.setdefault(id(o), o)
            out[v] = list(seen.values())
        return out

    def downstream_outputs(self, value: Value) -> list:
        """The outputs of this graph that `value` reaches (in output order, once each)."""
        return self.outputs_reached([value])[value]

    # --- order --------------------------------------------------------------------------------------------
    def _producers_of(self, node: Node):
        """Nodes of this graph whose outputs `node` reads: directly, or from inside its bodies (captures)."""
        for v in node.inputs:
            if v is not None and v.producer is not None and v.producer.graph is self:
                yield v.producer
        for sg in node.subgraphs():
            for inner in sg._nodes:
                yield from self._producers_of(inner)
            for v in sg.outputs:
                if v.producer is not None and v.producer.graph is self:
                    yield v.producer

    def toposort(self) -> bool:
        """Stable topological sort of the node list (Kahn's algorithm on the use lists); True if order changed.

        NOTE: the same edges as the index (captures included), read from the producers directly: this is the
        mutation that repairs the node list (on import of an unsorted file, after a bulk insertion), and building
        the index for it would cost a 90k-node import ~2 s instead of 0.17 s. Passes that want an order without
        reordering call `topological_nodes`, which reads the index.
        """
        order = list(self._nodes)
        pos = {n: i for i, n in enumerate(order)}
        indeg = dict.fromkeys(order, 0)
        succ: dict = {}
        for n in order:
            for p in self._producers_of(n):
                indeg[n] += 1
                succ.setdefault(p, []).append(n)
        ready = [pos[n] for n in order if indeg[n] == 0]
        heapq.heapify(ready)
        out = []
        while ready:
            n = order[heapq.heappop(ready)]
            out.append(n)
            for m in succ.get(n, ()):
                indeg[m] -= 1
                if indeg[m] == 0:
                    heapq.heappush(ready, pos[m])
        if len(out) != len(order):
            stuck = [n for n in order if indeg[n] > 0][:3]
            raise InvalidModelError(f"graph '{self.name}' has a cycle through node(s) " +
                                    ", ".join(f"'{n.name}' ({n.op_type})" for n in stuck))
        changed = out != order
        if changed:
            self._nodes = dict.fromkeys(out)
        return changed
