"""Modules of a model for the debugger: name-prefix scopes of its node names (`/encoder/layer.0/`), or, when the
names carry no scopes (`Conv@12`), contiguous stretches of the graph.

The depth is the smallest at which the quantized nodes fall into at least MIN_MODULES scopes; a scope is a
node name's folder cut at that depth, so `/embeddings/Add` stays in `/embeddings/` at depth 2.
"""
from __future__ import annotations

from typing import Dict, List, Optional

MIN_MODULES = 4
MAX_MODULES = 32
MAX_DEPTH = 8
STRETCHES = 8


def scope_of(name: str, depth: int) -> str:
    """`name`'s folder cut at `depth` folders ("" when the name has none)."""
    lead = 1 if name.startswith("/") else 0
    parts = name.split("/")
    folders = parts[lead:-1]
    if not folders:
        return ""
    return ("/" if lead else "") + "/".join(folders[:depth]) + "/"


def module_scopes(nodes: List[str], depth: Optional[int] = None) -> Dict[str, str]:
    """node name -> module name for the nodes (in graph order) that carry quantizers."""
    if depth is None:
        for d in range(1, MAX_DEPTH + 1):
            scopes = {scope_of(n, d) for n in nodes} - {""}
            if len(scopes) >= MIN_MODULES:
                depth = d if len(scopes) <= MAX_MODULES else max(1, d - 1)
                break
    if depth is not None:
        scopes = {n: scope_of(n, depth) for n in nodes}
        if len(set(scopes.values()) - {""}) >= 2:
            return {n: s or "(top level)" for n, s in scopes.items()}
    # no scopes in the names: contiguous stretches of the graph
    distinct = list(dict.fromkeys(nodes))
    if not distinct:
        return {}
    k = min(STRETCHES, len(distinct))
    out = {}
    for i in range(k):
        part = distinct[i * len(distinct) // k:(i + 1) * len(distinct) // k]
        label = f"{part[0]} .. {part[-1]}" if len(part) > 1 else part[0]
        for n in part:
            out[n] = label
    return out
