"""The one walk over an ONNX GraphProto and the If/Loop/Scan bodies its nodes hold (graph-valued attributes)."""
from __future__ import annotations

from typing import Iterator

import onnx

_GRAPH, _GRAPHS = onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS


def graph_protos(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """`graph` and every body below it at any depth, in preorder: a graph before its bodies, the bodies in node
    and attribute order. A body's nodes are read when the walk reaches it, so the caller may edit each graph
    it is handed (its nodes' inputs, its initializers) before the walk goes on."""
    stack = [graph]
    while stack:
        g = stack.pop()
        yield g
        bodies = []
        for n in g.node:
            for a in n.attribute:
                if a.type == _GRAPH:
                    bodies.append(a.g)
                elif a.type == _GRAPHS:
                    bodies.extend(a.graphs)
        stack.extend(reversed(bodies))


__all__ = ["graph_protos"]
