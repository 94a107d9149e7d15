"""`Pattern`: a declarative supergroup (pattern body + optional check) and `Match`, what matching returns.

A subclass defines `pattern(self, op, x, ...)` (each argument after `op` is a `Var` of that name) and may
define `check(self, match)` returning None when the match is acceptable, or a reason: a string or
`self.fail(reason, culprit)`. The check sees only the match: nothing is stored on the pattern between check
and any later rewrite (unlike onnxscript's `_layer_norm.py` which stashes `self._epsilon`).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Union
from typing import Optional as Opt

from qcompiler.patterns.dsl import (
    Const,
    NodeOut,
    OpBuilder,
    Optional,
    OrValue,
    PatternNode,
    PatternValue,
    Through,
    Var,
)

from qcompiler.errors import PatternError


@dataclass
class CheckFailure:
    """Why a structurally complete match was refused, and which node or value is to blame."""

    reason: str
    culprit: Any = None

    def __str__(self) -> str:
        name = getattr(self.culprit, "name", None)
        return self.reason + (f" (at '{name}')" if name else "")


class Match:
    """One occurrence of a pattern in a graph.

    nodes: graph nodes in graph order; root: the node producing the pattern's first output;
    bindings: pattern names (vars, named constants, Or names, pattern node names) -> Value / Node;
    inputs: values read from outside the match (first-read order); outputs: the values the pattern returns;
    constants: structural constants (name -> Value) that later passes must not fold into (field notes §4).
    `nodes` and `inputs` are computed on first access: most candidates are refused by a check before anyone
    looks at them.
    """

    __slots__ = ("pattern", "root", "members", "bindings", "outputs", "constants", "_position", "_nodes", "_inputs")

    def __init__(self, pattern: str, root: Any, members, bindings: dict, outputs: list, constants: dict,
                 position: Opt[dict] = None):
        self.pattern, self.root, self.members = pattern, root, members
        self.bindings, self.outputs, self.constants = bindings, outputs, constants
        self._position, self._nodes, self._inputs = position, None, None

    @property
    def nodes(self) -> list:
        if self._nodes is None:
            pos = self._position
            if pos is None:
                pos = {n: i for i, n in enumerate(self.root.graph.nodes)}
            self._nodes = sorted(self.members, key=pos.__getitem__)
            self._position = None
        return self._nodes

    @property
    def inputs(self) -> list:
        if self._inputs is None:
            produced = set(id(v) for n in self.members for v in n.outputs if v is not None)
            seen, out = set(), []
            for n in self.nodes:
                for v in n.inputs:
                    if v is not None and id(v) not in produced and id(v) not in seen:
                        seen.add(id(v))
                        out.append(v)
            self._inputs = out
        return self._inputs

    def __getitem__(self, name: str) -> Any:
        return self.bindings[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.bindings.get(name, default)

    def const(self, name: str) -> Any:
        """The numpy value of a bound constant, or None if `name` is unbound or not a constant."""
        v = self.bindings.get(name)
        return None if v is None or not hasattr(v, "const_value") else v.const_value()

    def __repr__(self) -> str:
        return f"Match({self.pattern} at {self.root.name!r}, {len(self.members)} nodes)"


class Pattern:
    """Base class of declarative patterns. Instances are cheap; the body is compiled once per instance."""

    name: str = ""
    description: str = ""
    # var name -> callable(value) returning None (ok) or a reason; run when the var is first bound, so a
    # doomed candidate stops early instead of reaching `check`
    var_checks: dict = {}

    def pattern(self, op: OpBuilder, *vars: Var):  # pragma: no cover - abstract
        raise NotImplementedError

    def check(self, match: Match) -> "Union[None, str, CheckFailure]":
        return None

    @staticmethod
    def fail(reason: str, culprit: Any = None) -> CheckFailure:
        return CheckFailure(reason, culprit)

    def __repr__(self) -> str:
        return f"<Pattern {self.name}>"

    # --- compiled form ---------------------------------------------------------------------------------------
    @property
    def compiled(self) -> "CompiledPattern":
        c = self.__dict__.get("_compiled")
        if c is None:
            c = CompiledPattern.build(self)
            self.__dict__["_compiled"] = c
        return c


class CompiledPattern:
    """The pattern graph of one Pattern: outputs, nodes reachable from them, root op types."""

    def __init__(self, outputs: list, nodes: list, root_ops: frozenset):
        self.outputs, self.nodes, self.root_ops = outputs, nodes, root_ops

    @classmethod
    def build(cls, pat: Pattern) -> "CompiledPattern":
        op = OpBuilder()
        params = list(inspect.signature(pat.pattern).parameters)[1:]
        out = pat.pattern(op, *[Var(p) for p in params])
        outputs = list(out) if isinstance(out, (tuple, list)) else [out]
        if not outputs or not all(isinstance(o, (NodeOut, OrValue)) for o in outputs):
            raise PatternError(f"pattern {pat.name!r} must return node outputs (or Or of them), got {outputs!r}")
        reached: dict = {}
        _collect(outputs[0], reached)
        for o in outputs[1:]:
            if not _reachable(o, reached):
                raise PatternError(f"pattern {pat.name!r}: output {o!r} is not computed inside the root's cone; "
                                   "matching starts at the first output and walks inputs only")
        missing = [n.name for n in op.nodes if n not in reached]
        if missing:
            raise PatternError(f"pattern {pat.name!r}: nodes {missing} do not feed the first output")
        return cls(outputs, list(reached), frozenset(_root_ops(outputs[0])))


def _collect(pv: PatternValue, acc: dict) -> None:
    if isinstance(pv, NodeOut):
        if pv.node in acc:
            return
        acc[pv.node] = None
        for i in pv.node.inputs:
            if i is not None:
                _collect(i, acc)
    elif isinstance(pv, OrValue):
        for a in pv.alternatives:
            _collect(a, acc)
    elif isinstance(pv, (Optional, Through)):
        _collect(pv.inner, acc)


def _reachable(pv: PatternValue, nodes: dict) -> bool:
    if isinstance(pv, NodeOut):
        return pv.node in nodes
    if isinstance(pv, OrValue):
        return all(_reachable(a, nodes) for a in pv.alternatives)
    return False


def _root_ops(pv: PatternValue) -> set:
    if isinstance(pv, NodeOut):
        return set(pv.node.op_types)
    if isinstance(pv, OrValue):
        s = set()
        for a in pv.alternatives:
            s |= _root_ops(a)
        return s
    raise PatternError(f"pattern root {pv!r} must be a node output")


__all__ = ["Pattern", "Match", "CheckFailure", "CompiledPattern", "Const", "Var", "PatternNode"]
