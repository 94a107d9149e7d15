"""The walk up a graph from seed values that the quantizer's rules share: which values feed a given one
through ops that keep its meaning (a Softmax's scores through a Reshape, a logits tensor behind its Softmax)."""
from __future__ import annotations

from typing import Callable, Iterable, List, Optional

from qcompiler.ir.value import Value


def walk_up(seeds: Iterable[Optional[Value]], step: Callable[[Value], Iterable[Optional[Value]]]) -> List[Value]:
    """The values `seeds` holds and every value `step(value)` leads to from them, each once, in the order first
    reached (depth first). `step` returns the values to go on to, usually inputs of `value.producer`, none to
    stop there; None entries (absent optional inputs) are skipped. Iterative (a stack): a walk of any depth stays
    within Python's recursion limit."""
    found: dict = {}
    stack = list(seeds)
    while stack:
        v = stack.pop()
        if v is None or v in found:
            continue
        found[v] = None
        stack.extend(step(v))
    return list(found)
