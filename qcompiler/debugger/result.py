"""What `qcompiler debug` found: per value, per module, per output; a dict for JSON and the HTML report, and a
table for a terminal.

The dict's keys are the contract with the HTML report and `quantize --debug`'s report entry:
  values:  ranked worst first (by `alone_sqnr_db`, then `sqnr_db`), each {name, kind, sqnr_db, alone_sqnr_db,
           local_sqnr_db, max_abs_error, order, node, op_type, bits}: `sqnr_db` the value in the QDQ model
           against float; `alone_sqnr_db` the worst graph output's SQNR with only this quantizer on (the rest
           float: what it costs the model); `local_sqnr_db` the value itself through its own grid, the rest float
           (what it costs where it sits; a weight's two figures are the same)
  modules: {scope, sqnr_db, alone_sqnr_db, quantizers}, in graph order
  outputs: {name: sqnr_db}
Non-finite numbers become the strings "inf", "-inf", "nan" (JSON has none).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional


def finite(x):
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return x


def _db(x) -> float:
    return round(float(x), 2) if math.isfinite(x) else float(x)


def _sort_db(x) -> float:
    return float("inf") if x is None or (isinstance(x, float) and math.isnan(x)) else x


@dataclass
class ValueReport:
    name: str
    kind: str
    sqnr_db: float
    alone_sqnr_db: float
    max_abs_error: float
    order: int
    node: str
    op_type: str
    bits: Optional[int] = None
    local_sqnr_db: float = float("nan")
    matched: bool = True     # False: no float counterpart; `name` is the QDQ model's, only `alone_sqnr_db` known

    def to_dict(self) -> dict:
        return {"name": self.name, "kind": self.kind, "matched": self.matched, "sqnr_db": finite(_db(self.sqnr_db)),
                "alone_sqnr_db": finite(_db(self.alone_sqnr_db)), "local_sqnr_db": finite(_db(self.local_sqnr_db)),
                "max_abs_error": finite(float(f"{self.max_abs_error:.4g}")),
                 "order": self.order,
                "node": self.node, "op_type": self.op_type, "bits": self.bits}


@dataclass
class ModuleReport:
    scope: str
    sqnr_db: float
    alone_sqnr_db: Optional[float]
    quantizers: int

    def to_dict(self) -> dict:
        return {"scope": self.scope, "sqnr_db": finite(_db(self.sqnr_db)),
                "alone_sqnr_db": None if self.alone_sqnr_db is None else finite(_db(self.alone_sqnr_db)),
                "quantizers": self.quantizers}


@dataclass
class DebugResult:
    """Per-value and per-module SQNR of a QDQ model against its float model (qcompiler.debug)."""

    values: list                       # ValueReport, ranked worst first
    modules: list                      # ModuleReport, in graph order
    outputs: dict                      # graph output -> SQNR (dB) of the QDQ model
    samples: int = 0
    seconds: float = 0.0
    unmatched: list = field(default_factory=list)   # quantizers with no float counterpart (QDQ-side names)
    notes: list = field(default_factory=list)
    fallback: Optional[dict] = None    # the --target-sqnr suggestion, when asked for

    def __repr__(self) -> str:
        worst = self.values[0] if self.values else None
        w = f", worst {worst.name!r} {_db(worst.alone_sqnr_db)} dB alone" if worst else ""
        outs = ", ".join(f"{k}: {_db(v)} dB" for k, v in list(self.outputs.items())[:3])
        return f"DebugResult({len(self.values)} values, {len(self.modules)} modules{w}; outputs {outs})"

    def to_dict(self) -> dict:
        d = {"values": [v.to_dict() for v in self.values], "modules": [m.to_dict() for m in self.modules],
             "outputs": {k: finite(_db(v)) for k, v in self.outputs.items()}, "samples": self.samples,
             "seconds": round(self.seconds, 2), "unmatched": list(self.unmatched), "notes": list(self.notes)}
        if self.fallback is not None:
            d["fallback"] = {k: finite(v) for k, v in self.fallback.items() if k != "unquantized_outputs"}
        return d

    def table(self, limit: int = 20) -> str:
        """The worst `limit` values, the modules and the outputs, as text."""
        lines = [f"{'#':>3} {'SQNR dB':>8} {'alone dB':>8} {'local dB':>8} {'max|err|':>9} {'bits':>4}  "
                 f"{'op':<14} value (node)"]
        for i, v in enumerate(self.values[:limit], 1):
            lines.append(f"{i:>3} {_db(v.sqnr_db):>8} {_db(v.alone_sqnr_db):>8} {_db(v.local_sqnr_db):>8} "
                         f"{v.max_abs_error:>9.3g} "
                         f"{v.bits if v.bits else '-':>4}  {v.op_type[:14]:<14} {v.name}"
                         + (f" ({v.node})" if v.node and v.node != v.name else "")
                         + (" [weight]" if v.kind == "weight" else "") + ("" if v.matched else " [no float twin]"))
        if len(self.values) > limit:
            lines.append(f"    ... {len(self.values) - limit} more (--top N shows them, --json lists all)")
        if self.modules:
            lines.append("")
            lines.append(f"{'SQNR dB':>8} {'alone dB':>8} {'quant':>5}  module (alone: output SQNR with only its "
                         f"quantizers)")
            for m in self.modules:
                alone = "-" if m.alone_sqnr_db is None else _db(m.alone_sqnr_db)
                lines.append(f"{_db(m.sqnr_db):>8} {alone:>8} {m.quantizers:>5}  {m.scope}")
        lines.append("")
        for k, v in self.outputs.items():
            lines.append(f"output '{k}': SQNR {_db(v)} dB")
        lines.append(f"({self.samples} samples, {self.seconds:.1f} s"
                     + (f"; {len(self.unmatched)} quantizers with no float counterpart" if self.unmatched else "")
                     + ")")
        for n in self.notes:
            lines.append(f"note: {n}")
        if self.fallback:
            fb = self.fallback
            wide = f" and widen {len(fb['widened'])} to 16 bits" if fb.get("widened") else ""
            lines.append(f"fallback: keep {len(fb['nodes'])} node(s) float{wide} -> output SQNR {_db(fb['sqnr_after_db'])} "
                         f"dB (target {fb['target_sqnr_db']:g} dB, {'reached' if fb['reached'] else 'NOT reached'}, "
                         f"{fb['trials']} trials)")
        return "\n".join(lines)


def ranked(values: list) -> list:
    """Worst first: the quantizer's own damage (alone), then the damage it carries (sqnr)."""
    return sorted(values, key=lambda v: (_sort_db(v.alone_sqnr_db), _sort_db(v.sqnr_db), v.order))
