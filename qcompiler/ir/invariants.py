"""The IR's invariant checker: proves the node lists, use lists, name maps and networkx index agree.

Run after every pass in tests (and with `--verify-each`). Each problem names the graph, node and value.
"""
from __future__ import annotations

from collections import Counter

from qcompiler.errors import InvariantError
from qcompiler.ir.graph import SINK, SOURCE, Graph
from qcompiler.ir.value import Usage


def problems(graph: Graph) -> list:
    """Every invariant violation in `graph` and its bodies, as readable strings (empty when sound)."""
    out: list[str] = []
    expected_uses: dict[int, Counter] = {}
    expected_edges: dict[int, Counter] = {}
    values = {}
    value_names: Counter = Counter()
    node_names: Counter = Counter()
    for g in graph.all_graphs():
        _check_graph(g, out, expected_uses, expected_edges, values, value_names, node_names)
    for g in graph.all_graphs():
        if g._index is not None:
            _compare_edges(g, expected_edges.get(id(g), Counter()), out)
        else:   # NOTE: an index not built yet is built from these use lists: nothing to compare, no networkx import
            _check_acyclic(g, out)
    for vid, v in values.items():
        got = Counter((id(u.user), u.index) for u in v._uses)
        want = expected_uses.get(vid, Counter())
        if got != want:
            out.append(f"value '{v.name}': use list {sorted(got.items())} != uses found in nodes/outputs {sorted(want.items())}")
    # uses of values not owned by any graph (dangling objects)
    for vid, want in expected_uses.items():
        if vid not in values:
            out.append(f"a node or graph output uses a value (id {vid}) that no graph in scope defines")
    for name, c in value_names.items():
        if c > 1:
            out.append(f"value name '{name}' is defined {c} times")
    for name, c in node_names.items():
        if c > 1 and name:
            out.append(f"node name '{name}' is used {c} times")
    for name in value_names:
        if name not in graph.names:
            out.append(f"value name '{name}' is not reserved in the name scope")
    return out


def _check_graph(g: Graph, out, expected_uses, expected_edges, values, value_names, node_names) -> None:
    where = f"graph '{g.name}'"
    for name, v in g._values.items():
        if v.name != name:
            out.append(f"{where}: value map key '{name}' holds value '{v.name}'")
        if v.graph is not g:
            out.append(f"{where}: value '{name}' belongs to another graph")
        values[id(v)] = v
        value_names[name] += 1
    for name, v in g.initializers.items():
        if g._values.get(name) is not v or v.tensor is None:
            out.append(f"{where}: initializer '{name}' is not a registered constant value")
    for v in g.inputs:
        if g._values.get(v.name) is not v or not v.is_input:
            out.append(f"{where}: graph input '{v.name}' is not registered as an input value")
    by_op: dict = {}
    for node in g._nodes:
        node_names[node.name] += 1
        by_op.setdefault(node.op_type, set()).add(node)
        if node.graph is not g:
            out.append(f"{where}: node '{node.name}' points at another graph")
        if g._index is not None and node not in g._index:
            out.append(f"{where}: node '{node.name}' ({node.op_type}) missing from the index")
        for i, v in enumerate(node.outputs):
            if v is None:
                continue
            if v.producer is not node or v.index != i:
                out.append(f"{where}: output {i} '{v.name}' of node '{node.name}' has producer {v.producer!r}/{v.index}")
            if g._values.get(v.name) is not v:
                out.append(f"{where}: output '{v.name}' of node '{node.name}' not in the value map")
        for i, v in enumerate(node.inputs):
            if v is None:
                continue
            if g.value(v.name) is not v:
                out.append(f"{where}: node '{node.name}' ({node.op_type}) input {i} '{v.name}' is not defined in scope")
            expected_uses.setdefault(id(v), Counter())[(id(node), i)] += 1
            _expect_edges(g, v, Usage(node, i), expected_edges)
        for sg in node.subgraphs():
            if sg.parent is not node:
                out.append(f"{where}: body '{sg.name}' of node '{node.name}' has parent {sg.parent!r}")
    for pos, v in enumerate(g.outputs):
        if g.value(v.name) is not v:
            out.append(f"{where}: graph output {pos} '{v.name}' is not defined in scope")
        expected_uses.setdefault(id(v), Counter())[(id(g), pos)] += 1
        _expect_edges(g, v, Usage(g, pos), expected_edges)
    for op, nodes in g._by_op.items():
        if set(nodes) != by_op.get(op, set()):
            out.append(f"{where}: op index for '{op}' is stale")
    for op in by_op:
        if op not in g._by_op:
            out.append(f"{where}: op index lacks '{op}'")


def _compare_edges(g: Graph, expected_edges: Counter, out: list) -> None:
    where = f"graph '{g.name}'"
    got_edges = Counter()
    for u, v, k in g.index.edges(keys=True):
        got_edges[(id(u) if u is not SOURCE else SOURCE, id(v) if v is not SINK else SINK, k)] += 1
    if got_edges != expected_edges:
        missing = expected_edges - got_edges
        extra = got_edges - expected_edges
        out.append(f"{where}: index edges disagree with uses (missing {[k for *_, k in list(missing)[:3]]}, "
                   f"extra {[k for *_, k in list(extra)[:3]]})")
    if set(g.index.nodes) != set(g._nodes) | {SOURCE, SINK}:
        out.append(f"{where}: index vertices differ from the node list")
    import networkx as nx
    if not nx.is_directed_acyclic_graph(g.index):
        out.append(f"{where}: the graph has a cycle")


def _check_acyclic(g: Graph, out: list) -> None:
    """Kahn's algorithm on the same edges as the index (Graph._producers_of: captures included)."""
    indeg = dict.fromkeys(g._nodes, 0)
    succ: dict = {}
    for n in g._nodes:
        for p in g._producers_of(n):
            if p in indeg:
                indeg[n] += 1
                succ.setdefault(p, []).append(n)
    ready = [n for n, d in indeg.items() if d == 0]
    seen = 0
    while ready:
        n = ready.pop()
        seen += 1
        for m in succ.get(n, ()):
            indeg[m] -= 1
            if indeg[m] == 0:
                ready.append(m)
    if seen != len(indeg):
        out.append(f"graph '{g.name}': the graph has a cycle")


def _expect_edges(g: Graph, v, use: Usage, expected: dict) -> None:
    for e in (g._edge_for(v, use), g._capture_edge(v, use)):
        if e is not None:
            eg, a, b, k = e
            expected.setdefault(id(eg), Counter())[(id(a) if a is not SOURCE else SOURCE, id(b) if b is not SINK else SINK, k)] += 1


def verify(graph: Graph) -> None:
    """Raise InvariantError listing every violation; return None when the IR is sound."""
    found = problems(graph)
    if found:
        raise InvariantError("IR invariants violated:\n  " + "\n  ".join(found[:20]))
