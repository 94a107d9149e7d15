"""Region search: the quantizers of one part of the graph, tried together, when quantizer-by-quantizer bisection
(search.py) leaves the output below the floor.

Some damage is spread over a module and only shows when its quantizers act together: a spectrum computed from
Convs, squares and sums before a Log, where every band's quantizers wipe its quiet bins; turning one quantizer
(or one band) off leaves the others wiping theirs. Regions are tried whole, smallest first, each in one trial:

- modules by name scope: every prefix of the producers' names (`/encoder/layer.0/attention/`, `encoder.layer.0.`);
- supergroups of the plan (their boundary quantizers);
- when none reaches the floor alone: the shortest contiguous stretch of quantizers in graph order that does,
  by bisection (the end moved down, then the start moved up, while the stretch still reaches the floor).

The first region that reaches the floor is kept (widened to 16 bits where that reaches it too and the target has
int16 activations, else float) and shrunk: chunks of its quantizers, halves then quarters down to one, are
turned back on while the output stays at the floor. Every trial is recorded (`Tried`) for the report.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from qcompiler.passes.quantize.safety_net.trials import _Trials, db

MAX_REGION_TRIALS = 400     # region trials at most (the run budget may end them first)


@dataclass(frozen=True)
class Region:
    kind: str                  # "scope" | "supergroup" | "stretch"
    label: str
    members: Tuple[int, ...]   # quantizer indices


@dataclass
class Tried:
    region: str
    kind: str
    quantizers: int
    sqnr_db: float
    action: str = "float"       # what the trial did to the region: "float" | "wide" | "shrink"
    kept: bool = False


def scope_prefixes(name: str) -> List[str]:
    """`/encoder/layer.0/attention/MatMul` -> `/encoder/`, `/encoder/layer.0/`, `/encoder/layer.0/attention/`;
    a dotted name (`encoder.layer.0.dense`) by its dots; a name with neither has no scope."""
    sep = "/" if "/" in name.strip("/") else "." if "." in name.strip(".") else None
    if sep is None:
        return []
    parts = name.split(sep)
    out = []
    for j in range(1, len(parts)):
        p = sep.join(parts[:j]) + sep
        if p.strip(sep):
            out.append(p)
    return out


def _node_names(z) -> List[str]:
    """The nodes a quantizer belongs to: its value's producer, or (a graph input) the nodes that read it."""
    x = z.q.inputs[0]
    if x.producer is not None:
        return [x.producer.name]
    return [u.user.name for u in z.dq.outputs[0].uses() if not u.is_graph_output]


def scope_regions(quants: Sequence) -> List[Region]:
    """One region per name scope holding at least two quantizers and not all of them (deepest label kept when
    two scopes hold the same quantizers)."""
    by_scope: Dict[str, set] = {}
    for i, z in enumerate(quants):
        for name in _node_names(z):
            for p in scope_prefixes(name or ""):
                by_scope.setdefault(p, set()).add(i)
    seen: Dict[Tuple[int, ...], str] = {}
    for p, members in by_scope.items():
        key = tuple(sorted(members))
        if 2 <= len(key) < len(quants) and len(p) > len(seen.get(key, "")):
            seen[key] = p
    return [Region("scope", p, key) for key, p in seen.items()]


def supergroup_regions(quants: Sequence, plan) -> List[Region]:
    """One region per supergroup: the quantizers its nodes produce or read (at least two)."""
    out = []
    for sg in getattr(plan, "supergroups", None) or ():
        nodes = set(sg.nodes)
        members = tuple(i for i, z in enumerate(quants)
                        if set(_node_names(z)) & nodes
                        or any(u.user.name in nodes for u in z.dq.outputs[0].uses() if not u.is_graph_output))
        if 2 <= len(members) < len(quants):
            out.append(Region("supergroup", f"{sg.kind} supergroup at '{sg.nodes[0]}'", members))
    return out


class RegionSearch:
    """Regions measured on `trials`, on top of the quantizer search's fixes (`fixed`: index -> "float"|"wide")."""

    def __init__(self, trials: _Trials, quants: Sequence, fixed: Dict[int, str], target: float,
                 wide_bits: Optional[int], no_wide=frozenset(), noun: str = "quantizers"):
        self.trials, self.quants, self.fixed, self.target = trials, quants, dict(fixed), target
        self.noun = noun
        self.wide_bits, self.no_wide = wide_bits, no_wide
        self.k = len(quants)
        self.tried: List[Tried] = []

    def setting(self, off=(), wide=()):
        """(on, wide) switch lists with `off` float and `wide` widened on top of the quantizer search's fixes."""
        off, wide = set(off), set(wide)
        on = [j for j in range(self.k) if j not in off and self.fixed.get(j) != "float"]
        return on, [j for j in range(self.k) if (self.fixed.get(j) == "wide" or j in wide) and j not in off]

    def measure(self, off=(), wide=()) -> float:
        return db(self.trials.harm(*self.setting(off, wide)))

    def _try(self, region: Region, members, action: str = "float") -> float:
        s = self.measure(wide=members) if action == "wide" else self.measure(off=members)
        self.tried.append(Tried(region.label, region.kind, len(members), s, action))
        return s

    def _label(self, lo: int, hi: int, rest: List[int]) -> str:
        return f"{self.noun} {lo + 1}-{hi} of {len(rest)} in graph order ('{self.quants[rest[lo]].key}' .. " \
               f"'{self.quants[rest[hi - 1]].key}')"

    def run(self, plan) -> Optional[Tuple[Region, List[int], str, float]]:
        """(region, the quantizers kept, "float"|"wide", the dB reached) or None when no region reaches."""
        rest = [j for j in range(self.k) if j not in self.fixed]
        if len(rest) < 2 or self.trials.left() <= 2:
            return None
        whole = Region("stretch", self._label(0, len(rest), rest), tuple(rest))
        if not self._try(whole, rest) >= self.target:
            return None          # every activation quantizer left float does not reach: the harm is elsewhere
        candidates = [Region(r.kind, r.label, tuple(j for j in r.members if j not in self.fixed))
                      for r in scope_regions(self.quants) + supergroup_regions(self.quants, plan)]
        candidates = sorted({r.members: r for r in candidates if 2 <= len(r.members) < len(rest)}.values(),
                            key=lambda r: (len(r.members), r.label))
        best = self._first_reaching(candidates)
        if best is None:
            best = self._stretch(rest) or whole
        members = list(best.members)
        action = "float"
        if self.wide_bits and not self.no_wide.intersection(members) and self.trials.left() > 2 \
                and self._try(best, members, "wide") >= self.target:
            action = "wide"
        members = self._shrink(best, members, action)
        reached = self.measure(**({"wide": members} if action == "wide" else {"off": members}))
        self.tried.append(Tried(best.label, best.kind, len(members), reached, action, kept=True))
        return best, members, action, reached

    def _first_reaching(self, candidates: List[Region]) -> Optional[Region]:
        """The first candidate (in order) that reaches the target, each turned float alone while more than two
        trials are left. The candidates are independent: with a pool they run a batch at a time (as many as it
        has workers); the trials after the first hit are refunded and left out of `tried`, so the choice, the
        record and the trial count are the serial run's (the run budget is checked before each batch)."""
        i = 0
        while i < len(candidates):
            n = min(self.trials.parallel(), self.trials.left() - 2)
            if n <= 0:
                return None
            batch = candidates[i:i + n]
            harms = self.trials.harm_many([self.setting(off=r.members) for r in batch])
            for j, (r, h) in enumerate(zip(batch, harms)):
                s = db(h)
                self.tried.append(Tried(r.label, r.kind, len(r.members), s, "float"))
                if s >= self.target:
                    self.trials.refund(len(batch) - j - 1)
                    return r
            i += n
        return None

    def _stretch(self, rest: List[int]) -> Optional[Region]:
        """The shortest stretch [lo, hi) of `rest` (graph order) found by bisection that reaches the target."""
        def reaches(lo, hi):
            if self.trials.left() <= 2:
                return False
            r = Region("stretch", self._label(lo, hi, rest), tuple(rest[lo:hi]))
            return self._try(r, r.members) >= self.target

        lo, hi = 0, len(rest)
        a, b = lo + 1, hi            # smallest end that still reaches (the whole reaches)
        while a < b:
            mid = (a + b) // 2
            if reaches(lo, mid):
                b = mid
            else:
                a = mid + 1
        hi = b
        a, b = 0, hi - 1             # largest start that still reaches
        while a < b:
            mid = (a + b + 1) // 2
            if reaches(mid, hi):
                a = mid
            else:
                b = mid - 1
        lo = a
        if (lo, hi) == (0, len(rest)):
            return None
        return Region("stretch", self._label(lo, hi, rest), tuple(rest[lo:hi]))

    def _shrink(self, region: Region, members: List[int], action: str) -> List[int]:
        """Chunks of `members` turned back on (halves, then quarters, ... down to one) while the rest still
        reaches the target."""
        chunk = len(members) // 2
        while chunk >= 1 and len(members) > 1:
            i = 0
            while i < len(members) and len(members) > 1:
                if self.trials.left() <= 1:
                    return members
                keep = members[:i] + members[i + chunk:]
                if not keep:
                    break
                s = self.measure(**({"wide": keep} if action == "wide" else {"off": keep}))
                self.tried.append(Tried(f"{region.label} without {len(members) - len(keep)} of its {self.noun} "
                                        f"('{self.quants[members[i]].key}' ..)", region.kind, len(keep), s,
                                        "shrink"))
                if s >= self.target:
                    members = keep
                else:
                    i += chunk
            chunk //= 2
        return members
