"""Turn Constant nodes into initializers with the same value name (bodies too).

Exporters such as Paddle2ONNX emit every weight as a `Constant` node (ppocr_cls: 308 of them, no initializers),
so tools that look for initializers treat weights as activations: per-channel quantization silently does
nothing and BatchNorms stay. After this pass, weights are initializers of the graph the Constant lived in
(a body's Constant becomes an initializer of that body), and names do not change.

Kept as Constant nodes: sparse_value, value_string(s), string tensors, external-data tensors, and Constants
whose output is a graph output (an initializer listed as a graph output is not portable across runtimes).
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import onnx

from qcompiler.ir import Graph, Node, Tensor
from qcompiler.passmanager import Pass, PassResult, register_pass

_DENSE = ("value", "value_float", "value_floats", "value_int", "value_ints")


def _tensor_of(node: Node):
    """(Tensor, None) for a dense numeric Constant, else (None, reason)."""
    attrs = node.attrs
    kind = next((k for k in attrs if k in _DENSE), None)
    if kind is None:
        return None, f"{node.name}: {', '.join(attrs) or 'no value'} attribute is kept as a Constant node"
    if kind == "value":
        proto = attrs["value"].value
        if proto.data_type == onnx.TensorProto.STRING:
            return None, f"{node.name}: string tensor kept as a Constant node"
        if proto.data_location == onnx.TensorProto.EXTERNAL:
            return None, f"{node.name}: external-data tensor kept as a Constant node"
        return Tensor(proto=proto), None
    arr = node.outputs[0].const_value()
    return Tensor.from_array(np.array(arr)), None


def to_initializer(g: Graph, node: Node) -> Optional[str]:
    """Replace one Constant node by an initializer of `g` with the same name; None on success, else why not."""
    out = node.outputs[0]
    if out is None:
        return f"{node.name}: no output"
    if out.is_output_of_any_graph():
        return f"{node.name}: output '{out.name}' is a graph output"
    tensor, reason = _tensor_of(node)
    if reason:
        return reason
    name, meta = out.name, out.meta
    new = g.add_constant(tensor, name + "__init")
    g.replace_all_uses(out, new)
    g.remove_node(node)
    g.rename_value(new, name)
    new.meta = meta
    return None


@register_pass
class ConstantToInitializer(Pass):
    """Constant nodes (value tensor / value_float(s) / value_int(s)) -> initializers with the same names."""

    name = "constant-to-initializer"
    description = "turn dense Constant nodes into initializers (same value names), in bodies too"
    preserves_semantics = True

    def run(self, model) -> PassResult:
        converted, kept = 0, {}
        for g in model.graphs():
            for node in g.nodes_by_op("Constant"):
                if node.domain not in ("", "ai.onnx"):
                    continue
                reason = to_initializer(g, node)
                if reason:
                    kept[node.name] = reason
                else:
                    converted += 1
        return PassResult(converted > 0, {"converted": converted, "kept": len(kept), "kept_reasons": kept})
