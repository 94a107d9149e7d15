"""Declarative supergroup patterns (LayerNorm, GELU, RMSNorm, HardSwish, Conv+BN+act, ...), matcher and tracer.

    from qcompiler.patterns import find_matches, explain
    for m in find_matches(graph, "layernorm"):
        m.nodes, m.bindings, m.inputs, m.outputs, m.constants
    print(explain(graph, "gelu", "Mul_12"))
"""
from qcompiler.patterns.dsl import Const, OpBuilder, Optional, OrValue, Through, Var
from qcompiler.patterns.explain import explain
from qcompiler.patterns.library import all_patterns, get_pattern, register, resolve
from qcompiler.patterns.matcher import Matcher, find_matches, structural_constants
from qcompiler.patterns.pattern import CheckFailure, Match, Pattern
from qcompiler.patterns.tracer import Tracer

__all__ = ["Pattern", "Match", "CheckFailure", "Var", "Const", "Optional", "OrValue", "Through", "OpBuilder",
           "find_matches", "explain", "structural_constants", "get_pattern", "all_patterns", "register", "resolve", "Matcher", "Tracer"]
