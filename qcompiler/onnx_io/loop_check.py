"""Refuse a Loop that can never end, at import, with one line naming its graph, node and inputs.

A Loop stops when its trip count M runs out or when its body's first output (the condition) turns false. With
M left empty and a condition that is true on entry (or left empty) and that the body only passes on (its condition output is
its condition input, through Identity nodes at most, or a constant true), nothing can ever stop it. ONNX allows
the form (the spec's `input ("", cond)` while loop), but such a model cannot be run: each run spins until the
run timeout, and calibration, which stacks body values over the iterations (calibration/body_probe.py), grows
memory until onnxruntime's CPU arena fails an allocation and aborts the whole process (a bfc_arena.cc
assertion, signal 6) instead of raising. The check looks only at Loop nodes (the parents of bodies), so a model
without bodies costs one walk over its nodes' attribute slots.
"""
from __future__ import annotations

from typing import Optional

from qcompiler.errors import InvalidModelError
from qcompiler.ir.graph import Graph
from qcompiler.ir.value import Value
from qcompiler.onnx_io.tensor_check import short

IDENTITY_HOPS = 64   # Identity nodes followed back from the body's condition output


def check_loops_end(graph: Graph) -> None:
    """Raise InvalidModelError for the first Loop (in `graph` or any body) that provably never ends."""
    for body in graph.subgraphs(True):
        node = body.parent
        if node is None or node.op_type != "Loop" or node.domain not in ("", "ai.onnx"):
            continue
        why = _never_ends(node, body)
        if why:
            raise InvalidModelError(f"graph '{short(_owner(node, graph).name)}': node '{short(node.name)}' (Loop) "
                                    f"never ends: {why}")


def _owner(node, graph: Graph) -> Graph:
    for g in graph.all_graphs():
        if node in g._nodes:
            return g
    return graph


def _input(node, i: int) -> Optional[Value]:
    return node.inputs[i] if i < len(node.inputs) else None


def _always_true(v: Optional[Value]) -> bool:
    """A constant (not an overridable graph input) whose every element is true."""
    if v is None or not v.is_constant():
        return False
    try:
        a = v.const_value()
    except Exception:   # noqa: BLE001 - a constant that cannot be read is for the other checks to name
        return False
    return a is not None and a.size >= 1 and bool(a.all())


def _never_ends(node, body: Graph) -> str:
    if _input(node, 0) is not None:
        return ""
    cond = _input(node, 1)
    # NOTE: with cond empty too the spec calls the body's condition "ignored" (an endless loop), but onnxruntime
    # stops on it all the same: an empty cond counts as true, and the body's condition decides, as there
    if cond is not None and not _always_true(cond):
        return ""
    if not body.outputs or len(body.inputs) < 2:
        return ""
    v = body.outputs[0]
    for _ in range(IDENTITY_HOPS):
        p = v.producer
        if p is None or p.op_type != "Identity" or p.domain not in ("", "ai.onnx") or not p.inputs \
                or p.inputs[0] is None:
            break
        v = p.inputs[0]
    if v is body.inputs[1] or _always_true(v):
        start = "is empty" if cond is None else f"'{short(cond.name)}' is constant true"
        return (f"input 0 (M, the trip count) is empty, input 1 (cond) {start} and the body passes its condition "
                f"on unchanged")
    return ""
