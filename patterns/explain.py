"""`qcompiler match MODEL PATTERN --explain NODE`: why a node is not the root of a pattern's match."""
from __future__ import annotations

from qcompiler.patterns.library import resolve
from qcompiler.patterns.matcher import Matcher, find_matches
from qcompiler.patterns.tracer import Tracer

from qcompiler.errors import PatternError


def explain(graph, pattern, node) -> str:
    """Why `node` (a Node or node name) is not the root of a match of `pattern` (a Pattern, list or name).

    Returns one line per pattern variant, closest attempt first; a node that does match says so.
    """
    pats = resolve(pattern)
    if isinstance(node, str):
        found = [n for g in graph.all_graphs() for n in g.nodes if n.name == node]
        if not found:
            raise PatternError(f"no node named {node!r} in graph {graph.name!r}")
        node = found[0]
    label = f"node '{node.name}' ({node.op_type})"
    for m in find_matches(node.graph, pats, recurse=False):
        if m.root is node:
            return f"{label} is the root of a {m.pattern} match ({len(m.nodes)} nodes)"
        if node in m.nodes:
            return (f"{label} is inside the {m.pattern} match rooted at '{m.root.name}' ({m.root.op_type}), "
                    "not its root")
    lines = []
    for p in pats:
        roots = sorted(p.compiled.root_ops)
        if node.op_type not in p.compiled.root_ops:
            lines.append((-1.0, f"{p.name}: root step expects {'|'.join(roots)}, {label} is {node.op_type}"))
            continue
        t = Tracer()
        m = Matcher(p, t).match_at(node)
        if m is not None:  # matched alone but lost to an overlapping earlier match
            lines.append((99.0, f"{p.name}: matches here alone but overlaps an earlier match of the same group"))
            continue
        f = t.best
        if f is None:
            lines.append((0.0, f"{p.name}: no attempt recorded"))
            continue
        got = f"; matched so far: {', '.join(f.matched)}" if f.matched else ""
        lines.append((f.depth, f"{p.name}: fails at {f}{got}"))
    lines.sort(key=lambda x: -x[0])
    head = f"{label} does not match {pattern if isinstance(pattern, str) else ', '.join(p.name for p in pats)}"
    return head + ":\n  " + "\n  ".join(l for _, l in lines)
