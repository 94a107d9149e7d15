"""Matching: anchored on the root op type through `graph.nodes_by_op`, then a backtracking walk up the inputs.

No whole-graph isomorphism search: each candidate root (a node of the root's op type, in graph order) is
matched by walking producers. Choices (commuted inputs, Or alternatives, absent optional inputs) backtrack:
a later failure (a variable bound elsewhere, exclusive use, the check) retries the next choice.

A structural match is accepted only if
- every pattern node maps to a distinct graph node in the same graph;
- exclusive use: every value produced inside the match, except the pattern's outputs, is read only by nodes of
  the match and is no graph output (else removing the supergroup would break that reader);
- it shares no node with an earlier match of the same pattern group (non-overlapping, graph order);
- the pattern's `check` passes.
"""
from __future__ import annotations

import gc
from typing import Iterator
from typing import Optional as Opt

from qcompiler.patterns.dsl import (
    Const,
    NodeOut,
    Optional,
    OrValue,
    Through,
    Var,
    broadcast_only,
)
from qcompiler.patterns.library import all_patterns, resolve
from qcompiler.patterns.pattern import CheckFailure, Match, Pattern
from qcompiler.patterns.tracer import Tracer

FEASIBLE_DEPTH = 3  # producers looked at before the full search (2-4 measured alike on make_llm_graph)


class _State:
    """Partial match: pattern node -> graph node (and back), bindings, structural constants. Copied on extend."""

    __slots__ = ("nodes", "used", "bind", "consts")

    def __init__(self, nodes=None, used=None, bind=None, consts=None):
        self.nodes = nodes if nodes is not None else {}
        self.used = used if used is not None else {}
        self.bind = bind if bind is not None else {}
        self.consts = consts if consts is not None else {}

    def with_node(self, pn, gn) -> "_State":
        nodes = dict(self.nodes)
        nodes[pn] = gn
        used = dict(self.used)
        used[gn] = pn
        return _State(nodes, used, self.bind, self.consts)

    def with_used(self, gn, marker) -> "_State":
        used = dict(self.used)
        used[gn] = marker
        return _State(self.nodes, used, self.bind, self.consts)

    def with_bind(self, name, value, structural: bool = False) -> "_State":
        bind = dict(self.bind)
        bind[name] = value
        consts = self.consts
        if structural:
            consts = dict(consts)
            consts[name] = value
        return _State(self.nodes, self.used, bind, consts)


def _vname(v) -> str:
    return "<absent>" if v is None else f"'{v.name}'"


class Matcher:
    """Matches one compiled pattern at given roots; `tracer` (optional) collects the closest failure."""

    def __init__(self, pattern: Pattern, tracer: Opt[Tracer] = None, position: Opt[dict] = None):
        self.pattern = pattern
        self.cp = pattern.compiled
        self.tracer = tracer
        self.position = position  # node -> graph position, for ordering Match.nodes (computed if None)
        self.var_checks = getattr(pattern, "var_checks", None) or {}
        self.feasible = self.cp.__dict__.get("_feasible")
        if self.feasible is None:
            self.feasible = self.cp._feasible = _feasibility(self.cp.outputs[0], FEASIBLE_DEPTH)

    def _fail(self, st: _State, step: str, reason, culprit=None, bonus: float = 0.0) -> None:
        if self.tracer is not None:
            self.tracer.record(len(st.nodes) + bonus, step, reason() if callable(reason) else reason, culprit, st)

    # --- the search -----------------------------------------------------------------------------------------
    def _search(self, pv, gv, st: _State) -> Iterator[_State]:
        """Complete structural matches of `pv` against `gv`, first choice first.

        NOTE: an explicit stack of (state, to-do list) instead of nested generators: every choice point
        (Or alternative, commuted inputs) pushes its later options, and a failure pops the next one. Nested
        generators made each yielded state climb ~20 frames, which dominated matching time on big graphs.
        The to-do list is a linked list of (pattern value, graph value, step, input index) so a push is O(1).
        """
        stack = [(st, ((pv, gv, "root", 0), None))]
        fail = self._fail
        while stack:
            st, todo = stack.pop()
            while todo is not None:
                (pv, gv, step, idx), todo = todo
                t = type(pv)
                if t is NodeOut:
                    pn = pv.node
                    p = gv.producer if gv is not None else None
                    if p is None:
                        fail(st, pn.name, lambda: f"expected {'|'.join(pn.op_types)} output, got {_vname(gv)} "
                             f"({'graph input or constant' if gv is not None else 'empty input'}) feeding "
                             f"{step} input {idx}", gv)
                        break
                    if gv.index != pv.index:
                        fail(st, pn.name, f"expected output {pv.index} of '{p.name}', got output {gv.index}", gv)
                        break
                    have = st.nodes.get(pn)
                    if have is not None:
                        if have is p:
                            continue
                        fail(st, pn.name, f"reached as '{have.name}' and as '{p.name}'", p)
                        break
                    nxt = self._enter(pn, p, st)
                    if nxt is None:
                        break
                    st, pairs, swapped = nxt
                    if swapped is not None:  # commuted order, tried after the written order fails
                        alt = todo
                        for k in range(len(pairs) - 1, -1, -1):
                            alt = ((pairs[k][0], swapped[k], pn.name, k), alt)
                        stack.append((st, alt))
                    for k in range(len(pairs) - 1, -1, -1):
                        todo = ((pairs[k][0], pairs[k][1], pn.name, k), todo)
                elif t is Var:
                    if gv is None:
                        fail(st, step, f"input {idx} for '{pv.name}' is absent", None)
                        break
                    bound = st.bind.get(pv.name)
                    if bound is None:
                        vc = self.var_checks.get(pv.name)
                        if vc is not None:
                            why = vc(gv)
                            if why:
                                fail(st, step, f"'{pv.name}' = {_vname(gv)}: {why}", gv)
                                break
                        st = st.with_bind(pv.name, gv)
                    elif bound is not gv:
                        fail(st, step, lambda: f"'{pv.name}' is {_vname(bound)} elsewhere but {_vname(gv)} "
                             f"at input {idx}", gv)
                        break
                elif t is Const:
                    nst = self._const(pv, gv, st, step, idx)
                    if nst is None:
                        break
                    st = nst
                elif t is OrValue:
                    if pv.name:
                        bound = st.bind.get(pv.name)
                        if bound is None:
                            st = st.with_bind(pv.name, gv)
                        elif bound is not gv:
                            fail(st, step, f"'{pv.name}' bound to two different values", gv)
                            break
                    alts = pv.alternatives
                    for a in range(len(alts) - 1, 0, -1):
                        stack.append((st, ((alts[a], gv, step, idx), todo)))
                    todo = ((alts[0], gv, step, idx), todo)
                elif t is Optional:
                    if gv is not None:
                        todo = ((pv.inner, gv, step, idx), todo)
                elif t is Through:
                    p = gv.producer if gv is not None else None
                    if p is not None and p.op_type in pv.ops and p.domain in ("", "ai.onnx"):
                        owner = st.used.get(p)
                        if owner is None or owner is pv.marker:
                            why = broadcast_only(p)
                            if why is None:
                                # the shape op itself may be what `inner` wants: tried if skipping it fails
                                stack.append((st, ((pv.inner, gv, step, idx), todo)))
                                if owner is None:
                                    st = st.with_used(p, pv.marker)
                                todo = ((pv, p.inputs[0], p.name, 0), todo)
                                continue
                            fail(st, step, f"'{p.name}' ({p.op_type}) is not broadcast-only: {why}", p)
                    todo = ((pv.inner, gv, step, idx), todo)
                elif gv is not None:  # pv is None: the slot must be empty
                    fail(st, step, f"input {idx}: expected an empty input, got {_vname(gv)}", gv)
                    break
            else:
                yield st

    def _enter(self, pn, gn, st: _State):
        """Map pattern node `pn` to graph node `gn`: (new state, (pattern, graph) input pairs, commuted inputs)."""
        if gn in st.used:
            self._fail(st, pn.name, f"graph node '{gn.name}' already matched as step '{st.used[gn].name}'", gn)
            return None
        if gn.op_type not in pn.op_types or (gn.domain not in ("", "ai.onnx") if not pn.domain else gn.domain != pn.domain):
            self._fail(st, pn.name, lambda: f"expected {'|'.join(pn.op_types)}, graph node '{gn.name}' is {gn.op_type}", gn)
            return None
        if st.nodes and gn.graph is not next(iter(st.nodes.values())).graph:
            self._fail(st, pn.name, f"graph node '{gn.name}' is in another graph", gn)
            return None
        for k, want in pn.attrs.items():
            got = gn.attr(k)
            ok = want(got) if callable(want) else _attr_equal(got, want)
            if not ok:
                self._fail(st, pn.name, lambda: f"attribute {k}={got!r} on '{gn.name}' fails "
                           f"{getattr(want, '__name__', repr(want))}", gn)
                return None
        ins = gn.inputs
        np_ = len(pn.inputs)
        if len(ins) != np_:
            if len(ins) > np_ and any(v is not None for v in ins[np_:]):
                self._fail(st, pn.name, f"graph node '{gn.name}' has {len(ins)} inputs, pattern expects {np_}", gn)
                return None
            ins = (list(ins) + [None] * np_)[:np_]
        pairs = list(zip(pn.inputs, ins))
        swapped = (ins[1], ins[0]) if pn.commute and ins[0] is not ins[1] else None
        return st.with_node(pn, gn), pairs, swapped

    def _const(self, pv, gv, st: _State, step, idx) -> Opt[_State]:
        if gv is None or not gv.is_constant():
            self._fail(st, step, lambda: f"input {idx}: expected a constant"
                       f"{'' if pv.value is None else ' ' + str(pv.value.tolist())}, got {_vname(gv)} which is "
                       "not constant", gv)
            return None
        if pv.needs_values or gv.tensor is None:
            arr = gv.const_value()
            why = "cannot read its values" if arr is None else pv.test(arr)
        else:  # NOTE: dims only, so a 90k-node graph's weights are not decoded just to be matched
            why = pv.test_shape(gv.tensor.dims)
        if why is not None:
            self._fail(st, step, lambda: f"input {idx}: constant {_vname(gv)}: {why}", gv)
            return None
        if pv.name is None:
            return st.with_bind(f"_const{len(st.consts)}:{gv.name}", gv, True) if pv.structural else st
        bound = st.bind.get(pv.name)
        if bound is None:
            return st.with_bind(pv.name, gv, pv.structural)
        if bound is not gv:
            self._fail(st, step, f"constant '{pv.name}' bound to two different values", gv)
            return None
        return st

    # --- whole matches --------------------------------------------------------------------------------------
    def match_at(self, root, claimed: Opt[set] = None) -> Opt[Match]:
        """The first acceptable match whose first output is produced by `root`, or None."""
        out0 = self.cp.outputs[0]
        for gv in root.outputs:
            if gv is None:
                continue
            if self.tracer is None and not self.feasible(gv):
                continue  # NOTE: a cheap op-type look-ahead without bindings; the full walk below decides
            for st in self._search(out0, gv, _State()):
                if st.nodes.get(_root_pnode(out0, st)) is not root:
                    continue
                m = self._accept(st, claimed)
                if m is not None:
                    return m
        return None

    def _accept(self, st: _State, claimed: Opt[set]) -> Opt[Match]:
        cp = self.cp
        out_values = []
        for o in cp.outputs:
            pn = _root_pnode(o, st)
            out_values.append(st.nodes[pn].outputs[_out_index(o, st)])
        out_set = set(map(id, out_values))
        members = st.used
        for gn in members:
            for v in gn.outputs:
                if v is None or id(v) in out_set:
                    continue
                for u in v._uses:
                    if u.is_graph_output:
                        self._fail(st, members[gn].name, f"interior value '{v.name}' is a graph output "
                                   "(exclusive use)", v, 0.5)
                        return None
                    if u.user not in members:
                        self._fail(st, members[gn].name, f"interior value '{v.name}' is also read by "
                                   f"'{u.user.name}' ({u.user.op_type}) outside the match (exclusive use)", v, 0.5)
                        return None
        if claimed is not None:
            for gn in members:
                if gn in claimed:
                    self._fail(st, members[gn].name, f"graph node '{gn.name}' already belongs to an earlier match",
                               gn, 0.5)
                    return None
        root = st.nodes[_root_pnode(cp.outputs[0], st)]
        m = _build_match(self.pattern, root, st, out_values, self.position)
        why = self.pattern.check(m)
        if why:
            if not isinstance(why, CheckFailure):
                why = CheckFailure(str(why))
            self._fail(st, "check", str(why), why.culprit, 0.75)
            return None
        return m


def _feasibility(pv, depth: int):
    """A closure `f(graph_value) -> bool`: could the value match `pv`, judging by op types, constness and
    absence only, `depth` producers deep? Built once per pattern; closures avoid the per-call type dispatch
    that made a plain recursive check the hottest function on big graphs."""
    t = type(pv)
    if t is NodeOut:
        pn, index = pv.node, pv.index
        ops = frozenset(pn.op_types)
        if depth == 0:
            def node0(gv):
                if gv is None:
                    return False
                p = gv.producer
                return p is not None and p.op_type in ops and gv.index == index
            return node0
        subs = [_feasibility(i, depth - 1) for i in pn.inputs]
        n, commute = len(subs), pn.commute

        def node(gv):
            if gv is None:
                return False
            p = gv.producer
            if p is None or p.op_type not in ops or gv.index != index:
                return False
            gins = p.inputs
            if len(gins) != n:
                if len(gins) > n and any(v is not None for v in gins[n:]):
                    return False
                gins = (list(gins) + [None] * n)[:n]
            for k in range(n):
                if not subs[k](gins[k]):
                    break
            else:
                return True
            return commute and subs[0](gins[1]) and subs[1](gins[0])
        return node
    if t is Var:
        return _present
    if t is Const:
        return _constant
    if t is OrValue:
        alts = [_feasibility(a, depth) for a in pv.alternatives]
        return lambda gv: any(f(gv) for f in alts)
    if t is Optional:
        inner = _feasibility(pv.inner, depth)
        return lambda gv: gv is None or inner(gv)
    if t is Through:
        inner, ops = _feasibility(pv.inner, depth), pv.ops
        return lambda gv: (gv is not None and gv.producer is not None and gv.producer.op_type in ops) or inner(gv)
    return _absent


def _present(gv):
    return gv is not None


def _constant(gv):
    return gv is not None and gv.is_constant()


def _absent(gv):
    return gv is None


def _root_pnode(pv, st: _State):
    if isinstance(pv, NodeOut):
        return pv.node
    for a in pv.alternatives:  # OrValue: the alternative that matched is the one whose node is mapped
        n = _root_pnode(a, st)
        if n in st.nodes:
            return n
    return None


def _out_index(pv, st: _State) -> int:
    if isinstance(pv, NodeOut):
        return pv.index
    for a in pv.alternatives:
        n = _root_pnode(a, st)
        if n in st.nodes:
            return _out_index(a, st)
    return 0


def _attr_equal(got, want) -> bool:
    if isinstance(got, bytes) and isinstance(want, str):
        return got.decode() == want
    if isinstance(want, (list, tuple)) and got is not None:
        return list(got) == list(want)
    if isinstance(want, float) and isinstance(got, (int, float)):
        return abs(got - want) <= 1e-6 * max(1.0, abs(want))
    return got == want


def _build_match(pattern: Pattern, root, st: _State, out_values: list, position: Opt[dict]) -> Match:
    bindings = {k: v for k, v in st.bind.items() if not k.startswith("_const")}
    for pn, gn in st.nodes.items():
        bindings[pn.name] = gn
    constants = {(k.split(":", 1)[1] if k.startswith("_const") else k): v for k, v in st.consts.items()}
    return Match(pattern.name, root, st.used, bindings, out_values, constants, position)


def find_matches(graph, pattern, recurse: bool = True) -> list:
    """All non-overlapping matches of a pattern (a Pattern, list of Patterns, or registered name) in graph order.

    A group (list) is matched variant by variant in list order, larger variants first, each claiming its nodes,
    so a smaller variant never steals part of a larger one. With `recurse`, If/Loop/Scan bodies are searched
    too (field notes: bodies are graphs like any other); their matches follow the main graph's.
    """
    pats = resolve(pattern)
    out = []
    # NOTE: matching allocates many short-lived dicts and generators; with a 90k-node graph alive, the cyclic
    # GC's full collections cost more than the matching itself (measured 3x on matmul_add), and nothing here
    # creates cycles, so it is paused for the duration.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for g in ([graph] + _bodies(graph) if recurse else [graph]):
            out.extend(_find_in_graph(g, pats))
    finally:
        if was_enabled:
            gc.enable()
    return out


class _LazyPosition(dict):
    """node -> position in graph order, computed on first lookup (most groups never need it)."""

    def __init__(self, graph):
        super().__init__()
        self._graph = graph

    def __missing__(self, node):
        if not self and self._graph is not None:
            nodes = self._graph.nodes
            self.update(zip(nodes, range(len(nodes))))
            self._graph = None
            if node in self:
                return dict.__getitem__(self, node)
        raise KeyError(node)


def _find_in_graph(g, pats) -> list:
    position = _LazyPosition(g)
    claimed: set = set()
    found = []
    for p in pats:
        matcher = Matcher(p, None, position)
        roots, kinds = [], 0
        for op in p.compiled.root_ops:
            rs = g.nodes_by_op(op)
            kinds += bool(rs)
            roots.extend(rs)
        if kinds > 1:
            roots.sort(key=position.__getitem__)
        for r in roots:
            if r in claimed:
                continue
            m = matcher.match_at(r, claimed)
            if m is not None:
                claimed.update(m.members)
                found.append(m)
    if len(found) > 1:
        found.sort(key=lambda m: position[m.root])
    return found


def _bodies(graph) -> list:
    """Bodies of If/Loop/Scan nodes (recursively), found through the op index instead of a node scan."""
    out = []
    for op in ("If", "Loop", "Scan"):
        for n in graph.nodes_by_op(op):
            for sg in n.subgraphs():
                out.append(sg)
                out.extend(_bodies(sg))
    return out


def structural_constants(graph, patterns=None) -> dict:
    """Constant values that belong to some supergroup (GELU 0.5, LayerNorm ε, ...) -> the matches using them.

    Field notes §4: a pass (SmoothQuant, BN folding) asks this before writing into a constant, and refuses or
    copies on write. `patterns` defaults to every registered group.
    """
    out: dict = {}
    for name in (patterns if patterns is not None else list(all_patterns())):
        for m in find_matches(graph, name):
            for v in m.constants.values():
                out.setdefault(v, []).append(m)
    return out
