"""canonicalize: unique node names, Identity removal that keeps graph output names, dead-code elimination.

Identity removal: `y = Identity(x)` is bypassed by pointing y's readers at x. When y is a graph output the
output's name must not change, so x takes y's name instead (only when x is a plain node output of the same graph
that is not itself a graph input, initializer or another graph output); otherwise the Identity stays.
"""
from __future__ import annotations

from qcompiler.ir.graph import Graph
from qcompiler.passmanager import Pass, PassResult, register_pass


def remove_identities(g: Graph) -> int:
    removed = 0
    for node in g.nodes_by_op("Identity"):
        if node.domain not in ("", "ai.onnx") or len(node.inputs) != 1 or node.inputs[0] is None:
            continue
        x, y = node.inputs[0], node.outputs[0]
        if y is None:
            continue
        if y.is_output_of_any_graph():
            # NOTE: the output keeps its name, so x must be free to take it over.
            if not y.is_graph_output() or any(u.is_graph_output and u.user is not g for u in y.uses()):
                continue
            if not g.can_take_name(x):
                continue
        g.substitute(y, x, remove=[node])
        removed += 1
    return removed


def eliminate_dead_code(g: Graph) -> tuple:
    """Remove nodes none of whose outputs reach a graph output (or a body output), and unused initializers.

    One reverse sweep: removing a node can only make the producers of what it read dead, so those go on a
    worklist instead of rescanning the graph until nothing changes (a 90k-node chain took a scan per step).
    """
    removed_nodes = 0
    worklist = g.nodes   # a snapshot list, popped from the end: reverse graph order, consumers before producers
    while worklist:
        node = worklist.pop()
        if node.graph is not g or node.op_type in _SIDE_EFFECT_OPS:
            continue
        # NOTE: a plain loop, not any(<generator>): the generator's setup was most of this check's cost
        for v in node.outputs:
            if v is not None and v.uses():
                break
        else:
            _remove_dead(g, node, worklist)
            removed_nodes += 1
    removed_inits = 0
    for name, v in list(g.initializers.items()):
        if not v.uses() and not v.is_input:
            g.remove_initializer(v)
            removed_inits += 1
    return removed_nodes, removed_inits


def _remove_dead(g: Graph, node, worklist: list) -> None:
    """Remove `node` and queue the producers of what it read, which may have just become dead."""
    read = _values_read(node)
    g.remove_node(node)
    for v in read:
        p = v.producer
        if p is not None and p.graph is g:
            worklist.append(p)


def _values_read(node) -> list:
    """The node's inputs plus every value its bodies read or return (captures are released with the node)."""
    out = [v for v in node.inputs if v is not None]
    for sg in node.subgraphs():
        out.extend(sg.outputs)
        for n in sg.nodes:
            out.extend(_values_read(n))
    return out


_SIDE_EFFECT_OPS = frozenset()


def unique_node_names(g: Graph) -> int:
    """Give every unnamed node a fresh name (names are already unique model-wide by construction)."""
    n = 0
    for node in g.nodes:
        if not node.name:
            node.name = g.node_names.fresh(node.op_type.lower())
            n += 1
    return n


@register_pass
class Canonicalize(Pass):
    name = "canonicalize"
    ensures = ("canonical-names",)
    description = "unique node names, Identity removal (graph output names kept), dead-code elimination"
    preserves_semantics = True

    def run(self, model) -> PassResult:
        stats = {"named": 0, "identities_removed": 0, "dead_nodes_removed": 0, "dead_initializers_removed": 0}
        for g in reversed(model.graphs()):  # bodies first, so their captures are released before outer DCE
            stats["named"] += unique_node_names(g)
            stats["identities_removed"] += remove_identities(g)
            dn, di = eliminate_dead_code(g)
            stats["dead_nodes_removed"] += dn
            stats["dead_initializers_removed"] += di
        return PassResult(any(stats.values()), stats)
