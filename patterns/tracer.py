"""The tracer: why a node is not the root of a match (first failing step of the closest attempt).

Like onnxscript's `MatchingTracer`, a dry run: it only records the attempt that got furthest (most pattern
nodes matched; post-structural failures such as exclusive use or the check count as further) and never
changes the graph.
"""
from __future__ import annotations

from typing import Any
from typing import Optional as Opt


class Failure:
    """One failed step: how far the attempt got (matched nodes), the step, the reason, the culprit."""

    __slots__ = ("depth", "step", "reason", "culprit", "matched")

    def __init__(self, depth, step, reason, culprit, matched):
        self.depth, self.step, self.reason, self.culprit, self.matched = depth, step, reason, culprit, matched

    def __str__(self) -> str:
        return f"step '{self.step}': {self.reason}"


class Tracer:
    """Keeps the closest failed attempt (most pattern nodes matched; first such failure wins)."""

    def __init__(self):
        self.best: Opt[Failure] = None

    def record(self, depth: float, step: str, reason: str, culprit: Any, st) -> None:
        if self.best is None or depth > self.best.depth:
            matched = [f"{pn.name}={gn.name}" for pn, gn in st.nodes.items()]
            self.best = Failure(depth, step, reason, culprit, matched)
