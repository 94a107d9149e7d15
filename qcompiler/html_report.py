"""The HTML report: one self-contained page a person reads, from the JSON report of `quantize` and, when given,
the per-value comparison of `qcompiler debug`.

`render_html(report, debug)` returns the page as a string: summary (target, scheme, recipe, output SQNR, size,
integer-kernel share), pass timings, the per-layer SQNR chart in graph order with the worst values marked (from
`debug`; without it, the plan's grids and kernels per layer), the plan per layer, each pass's effect on the
output SQNR as the report records it, the safety net's and the mixed-precision search's choices. The page makes
no network request: no script at all, CSS inline, charts are SVG data: URIs (html_charts.py). Every name comes
from a model and is hostile: the template autoescapes everything, and nothing from the report reaches an
attribute other than through that escaping.

jinja2 and matplotlib are the optional `html` extra (`pip install 'qcompiler[html]'`): `require_html_extra()`
raises one ArgumentError line naming the extra when either is missing, before any work is done.
"""
from __future__ import annotations

import datetime
import math
from importlib import resources
from typing import Dict, List, Optional

from qcompiler.errors import ArgumentError
from qcompiler.html_charts import db_number, grid_bits, pareto_chart, precision_chart, sqnr_chart, timing_chart
from qcompiler.onnx_io import write_atomic
from qcompiler.quant.core.pipeline import DEFAULT_PIPELINE, WEIGHT_ONLY_PIPELINE
from qcompiler.quant.settings.selection import warning_text

WORST_MARKED = 5            # worst values marked and named on the SQNR chart
WORST_LISTED = 20           # ... and listed in the table under it
VALUES_PER_REASON = 200     # a left-float reason lists at most this many values (the JSON report has all)
NAME_CHARS = 200            # a name from the model is cut to this many characters on the page (head…tail)
TEXT_CHARS = 1000           # ... and any other text (a reason, a note that quotes names) to this many
CHART_PREFIX = "data:image/svg+xml;base64,"
TEMPLATE = "templates/report.html.j2"
MISSING_EXTRA = "--report-html needs jinja2 and matplotlib: pip install 'qcompiler[html]'"


def require_html_extra() -> None:
    """Raise ArgumentError (one line, exit 2 on the command line) when the `html` extra is not installed."""
    try:
        import jinja2  # noqa: F401
        import matplotlib  # noqa: F401
    except ImportError:
        raise ArgumentError(MISSING_EXTRA) from None


def render_html(report: dict, debug: Optional[dict] = None, title: Optional[str] = None) -> str:
    """The page for `report` (quantize's JSON report as a dict) and, optionally, `debug` (`qcompiler debug`'s
    object: `values` ranked worst first, each with `name`, `sqnr_db`, `alone_sqnr_db`, `max_abs_error`, `order`,
    `node`, `op_type`; `modules` with `scope`, `sqnr_db`, `alone_sqnr_db`; `outputs`). `title`: the page's
    heading (the model's path); without a report (`{}`) the page holds the debug sections only."""
    require_html_extra()
    import jinja2
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True, finalize=_bounded_text)
    env.filters["db"] = _db_text
    env.filters["num"] = _num_text
    env.filters["cut"] = cut_name
    source = resources.files("qcompiler").joinpath(TEMPLATE).read_text(encoding="utf-8")
    return env.from_string(source).render(**page_context(report or {}, debug, title))


def write_html_report(path: str, report: dict, debug: Optional[dict] = None, title: Optional[str] = None,
                      protect: tuple = ()) -> None:
    """Render and write the page atomically (onnx_io.write_atomic: never over an input in `protect`)."""
    write_atomic(path, render_html(report, debug, title), protect=protect)


def page_context(report: dict, debug: Optional[dict], title: Optional[str] = None) -> dict:
    """Everything the template shows, as plain lists and dicts (the template only lays them out)."""
    layers = _layer_rows(report)
    values, worst = _debug_values(debug)
    return {
        "title": str(title or ""),
        "has_report": bool(report),
        "generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "summary": _summary_rows(report),
        "outputs": _output_rows(report),
        "pipeline": _pipeline(report),
        "passes": _pass_rows(report),
        "timing_chart": timing_chart(report["passes"]) if report.get("passes") else None,
        "effects": pass_effects(report),
        "sqnr_chart": sqnr_chart(values, worst[:WORST_MARKED]) if values else None,
        "worst": [_value_row(values[i], k + 1) for k, i in enumerate(worst[:WORST_LISTED])],
        "modules": _module_rows(debug),
        "debug_outputs": _debug_outputs(debug),
        "has_debug": debug is not None,
        "precision_chart": precision_chart(layers) if layers and not values else None,
        "layers": layers,
        "left_float": _left_float_groups(report),
        "widened": sorted((str(k), str(v)) for k, v in (report.get("widened") or {}).items()),
        "bodies": sorted((str(k), str(v)) for k, v in (report.get("bodies") or {}).items()),
        "safety_net": _safety_net(report),
        "mixed": _mixed(report),
        "notes": [str(n) for n in report.get("notes") or ()],
        "warnings": [_warning(w) for w in report.get("warnings") or ()],
    }


def _bounded_text(v):
    """Every value the page prints: a string over TEXT_CHARS is cut (head…tail); a chart is left whole."""
    if isinstance(v, str) and len(v) > TEXT_CHARS and not v.startswith(CHART_PREFIX):
        return cut_name(v, TEXT_CHARS)
    return v


def cut_name(v, limit: int = NAME_CHARS) -> str:
    """A name from the model, at most NAME_CHARS characters (head…tail, both ends show what it is): a hostile
    model's 100k-character names would otherwise fill the page."""
    s = "" if v is None else str(v)
    if len(s) <= limit:
        return s
    half = (limit - 1) // 2
    return s[:half] + "…" + s[-half:]


def _db_text(v) -> str:
    d = db_number(v)
    if d is None:
        return "–"
    return ("∞" if d > 0 else "−∞") if math.isinf(d) else f"{d:.2f} dB"


def _num_text(v, digits: int = 4) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return "–" if v is None else str(v)
    return f"{v:.{digits}g}"


def _mb(n) -> str:
    return f"{n / (1 << 20):.2f} MB" if isinstance(n, (int, float)) else "–"


def _summary_rows(r: dict) -> List[tuple]:
    rows = [("target", r.get("target")), ("scheme", r.get("scheme")), ("optimize", r.get("optimize")),
            ("calibration samples", r.get("calibration_samples")),
            ("SQNR measured on", r.get("sqnr_samples_note")),
            ("output SQNR floor", _db_text(r.get("min_sqnr_db")) if r.get("min_sqnr_db") is not None else None)]
    c = r.get("counts") or {}
    if c:
        rows.append(("quantized", f"{c.get('activations', 0)} activations, {c.get('params', 0)} weights and "
                                  f"biases; {c.get('left_float', 0)} values left float, {c.get('widened', 0)} "
                                  f"widened to 16 bits"))
    size = r.get("size") or {}
    if size.get("float_bytes"):
        ratio = size.get("ratio")
        rows.append(("file size", f"{_mb(size.get('quantized_bytes'))} against {_mb(size['float_bytes'])} float"
                                  + (f" ({ratio:.2f}x)" if isinstance(ratio, (int, float)) else "")))
    k = r.get("kernels") or {}
    if isinstance(k.get("integer_nodes"), int) and isinstance(k.get("float_nodes"), int):
        total = k["integer_nodes"] + k["float_nodes"]
        share = f"{100 * k['integer_nodes'] / total:.0f} %" if total else "–"
        rows.append(("integer-kernel share", f"{share} ({k['integer_nodes']} of {total} nodes in onnxruntime's "
                                             f"optimized graph)"))
    else:
        rows.append(("integer-kernel share", "not measured (quantize --measure-latency measures it)"))
    lat = r.get("latency") or {}
    if isinstance(lat.get("quant_ms"), (int, float)) and isinstance(lat.get("float_ms"), (int, float)):
        rows.append(("latency", f"{lat['quant_ms']:.3g} ms against {lat['float_ms']:.3g} ms float "
                                f"({lat.get('ratio', 0):.2f}x, median of {lat.get('runs')}, {lat.get('clock')} "
                                f"clock)"))
    seconds = r.get("seconds") or {}
    if isinstance(seconds.get("total"), (int, float)):
        rows.append(("total time", f"{seconds['total']:.2f} s"))
    return [(k, v) for k, v in rows if v is not None]


def _output_rows(r: dict) -> List[dict]:
    floor = db_number(r.get("min_sqnr_db"))
    maxerr = r.get("output_max_abs_error") or {}
    masked = set(r.get("sqnr_masked_outputs") or ())
    out = []
    for name, s in (r.get("output_sqnr_db") or {}).items():
        d = db_number(s)
        out.append({"name": name, "sqnr": s, "max_abs": maxerr.get(name), "masked": name in masked,
                    "low": d is not None and floor is not None and d < floor})
    return out


def _pipeline(r: dict) -> List[dict]:
    """The passes run, each marked when it is a recipe pass (not in the default pipeline)."""
    base = WEIGHT_ONLY_PIPELINE if r.get("weight_only") else DEFAULT_PIPELINE
    return [{"name": str(p), "recipe": p not in base} for p in r.get("pipeline") or ()]


def _pass_rows(r: dict) -> List[dict]:
    rows = []
    for p in r.get("passes") or ():
        stats = p.get("stats") or {}
        shown = ", ".join(f"{k} {v}" for k, v in stats.items() if isinstance(v, (int, float, str)))[:300]
        rows.append({"name": p.get("name"), "seconds": p.get("seconds"), "modified": bool(p.get("modified")),
                     "stats": shown})
    return rows


def pass_effects(r: dict) -> List[dict]:
    """Each pass's effect on the worst output SQNR, as far as the report records it: `measure-sqnr` right after
    the plan is written (every pass before it shapes that figure together: the model has no Q/DQ to measure
    until insert-qdq), then `latency-search` and `safety-net` (before -> after each), and `mixed-precision`'s
    measured drop."""
    rows = []
    for p in r.get("passes") or ():
        if p.get("name") == "measure-sqnr":
            rows.append({"pass": "measure-sqnr", "before": None,
                         "after": (p.get("stats") or {}).get("worst_sqnr_db"),
                         "what": "the plan as placed and written (every pass before it)"})
    ls = r.get("latency_search") or {}
    if ls.get("ran"):
        rows.append({"pass": "latency-search", "before": ls.get("sqnr_before_db"), "after": ls.get("sqnr_after_db"),
                     "what": f"{ls.get('removed', 0)} Q/DQ pairs taken out, {ls.get('narrowed_to_8_bits', 0)} "
                             f"values narrowed to 8 bits ({ls.get('trials', 0)} trials)"})
    sn = r.get("safety_net") or {}
    if sn.get("triggered"):
        rows.append({"pass": "safety-net", "before": sn.get("sqnr_before_db"), "after": sn.get("sqnr_after_db"),
                     "what": f"{len(sn.get('changed') or ())} quantizers widened or left float "
                             f"({sn.get('trials', 0)} trials)"})
    mp = r.get("mixed_precision") or {}
    if mp:
        drop, budget = mp.get("drop"), mp.get("budget")
        rows.append({"pass": "mixed-precision", "before": None, "after": None,
                     "what": f"drop {_percent(drop)} against a budget of {_percent(budget)} ({mp.get('metric', '')})"})
    if rows:
        worst = min((d for d in map(db_number, (r.get("output_sqnr_db") or {}).values()) if d is not None),
                    default=None)
        rows.append({"pass": "final", "before": None, "after": worst, "what": "worst output SQNR in the report"})
    return rows


def _percent(v) -> str:
    return f"{100 * v:.3g} %" if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v)


def _layer_rows(r: dict) -> List[dict]:
    """report['layers'] in graph order, numbered, with each weight and output grid's bits and the kernel."""
    nodes = (r.get("kernels") or {}).get("nodes") or {}
    rows = []
    for i, (name, d) in enumerate((r.get("layers") or {}).items()):
        d = d if isinstance(d, dict) else {}
        weights = [(k, str(v)) for k, v in d.items() if str(k).startswith("input")]
        outs = d.get("outputs")
        outs = [str(o) for o in (outs if isinstance(outs, list) else [outs] if outs is not None else [])]
        k = nodes.get(name) if isinstance(nodes, dict) else None
        rows.append({"index": i, "name": name, "weights": weights, "outputs": outs,
                     "precision": d.get("precision"), "rules": [str(x) for x in d.get("config_rules") or ()],
                     "weight_bits": max((grid_bits(v) for _, v in weights), default=None),
                     "output_bits": max((grid_bits(v) for v in outs), default=None),   # inside a group: -1
                     "integer": k.get("integer") if isinstance(k, dict) else None,
                     "kernel": (k.get("kernel") if isinstance(k, dict) else None),
                     "kernel_reason": (k.get("reason") if isinstance(k, dict) else None)})
    return rows


def _left_float_groups(r: dict) -> List[dict]:
    groups: Dict[str, List[str]] = {}
    for value, reason in (r.get("left_float") or {}).items():
        groups.setdefault(str(reason), []).append(str(value))
    return [{"reason": k, "count": len(v), "names": v[:VALUES_PER_REASON], "more": max(0, len(v) - VALUES_PER_REASON)}
            for k, v in sorted(groups.items(), key=lambda t: -len(t[1]))]


def _debug_values(debug: Optional[dict]):
    """`debug['values']` in graph order (by `order`), and the indices into that list of the worst, worst first
    (the debug list's own ranking)."""
    ranked = [v for v in (debug or {}).get("values") or () if isinstance(v, dict)]
    if not ranked:
        return [], []
    in_order = sorted(range(len(ranked)), key=lambda i: (_order(ranked[i]), i))
    position = {i: k for k, i in enumerate(in_order)}
    return [ranked[i] for i in in_order], [position[i] for i in range(len(ranked))]


def _value_row(v: dict, rank: int) -> dict:
    return {"rank": rank, "name": v.get("name", ""), "kind": v.get("kind") or "", "node": v.get("node") or "",
            "op_type": v.get("op_type") or "", "sqnr_db": v.get("sqnr_db"), "alone_sqnr_db": v.get("alone_sqnr_db"),
            "max_abs_error": v.get("max_abs_error")}


def _order(v: dict) -> float:
    o = v.get("order")
    return float(o) if isinstance(o, (int, float)) and not isinstance(o, bool) else math.inf


def _module_rows(debug: Optional[dict]) -> List[dict]:
    """debug['modules'], worst first: by SQNR, then by SQNR alone (a module whose quantizers reach no output
    measures infinite SQNR with every quantizer up to it)."""
    def db(m, key):
        d = db_number(m.get(key))
        return math.inf if d is None else d
    rows = [{"scope": m.get("scope", ""), "sqnr_db": m.get("sqnr_db"), "alone_sqnr_db": m.get("alone_sqnr_db"),
             "quantizers": m.get("quantizers")}
            for m in (debug or {}).get("modules") or () if isinstance(m, dict)]
    return sorted(rows, key=lambda m: (db(m, "sqnr_db"), db(m, "alone_sqnr_db")))


def _debug_outputs(debug: Optional[dict]) -> List[tuple]:
    """debug['outputs'] as (name, SQNR, max abs error) rows: a mapping name -> SQNR or -> {sqnr_db, ...}, or a
    list of such dicts with a `name`."""
    outs = (debug or {}).get("outputs")
    rows = []
    if isinstance(outs, dict):
        for name, v in outs.items():
            d = v if isinstance(v, dict) else {"sqnr_db": v}
            rows.append((name, d.get("sqnr_db"), d.get("max_abs_error")))
    elif isinstance(outs, list):
        for d in outs:
            if isinstance(d, dict):
                rows.append((d.get("name", d.get("output", "")), d.get("sqnr_db"), d.get("max_abs_error")))
    return rows


def _safety_net(r: dict) -> Optional[dict]:
    sn = r.get("safety_net")
    if not isinstance(sn, dict):
        return None
    return {"triggered": bool(sn.get("triggered")), "before": sn.get("sqnr_before_db"),
            "after": sn.get("sqnr_after_db"), "trials": sn.get("trials"), "seconds": sn.get("seconds"),
            "note": sn.get("note"), "floor": r.get("min_sqnr_db"),
            "changed": [c for c in sn.get("changed") or () if isinstance(c, dict)]}


def _mixed(r: dict) -> Optional[dict]:
    mp = r.get("mixed_precision")
    if not isinstance(mp, dict) or not mp:
        return None
    layers = []
    for name, l in (mp.get("layers") or {}).items():
        l = l if isinstance(l, dict) else {}
        sens = l.get("sensitivity") or {}
        layers.append({"name": name, "op": l.get("op"), "chosen": l.get("chosen"), "weights": l.get("weights"),
                       "alone": _percent(sens.get(l.get("chosen"))) if l.get("chosen") in sens else "–"})
    return {"budget": _percent(mp.get("budget")), "drop": _percent(mp.get("drop")),
            "held_out": _percent(mp.get("held_out_drop")) if mp.get("held_out_drop") is not None else None,
            "metric": mp.get("metric"), "weight_bytes": mp.get("weight_bytes"), "evaluations": mp.get("evaluations"),
            "layers": layers, "notes": [str(n) for n in mp.get("notes") or ()],
            "pareto": pareto_chart(mp) if mp.get("trials") else None}


def _warning(w) -> str:
    if isinstance(w, dict) and {"kind", "value", "problem"} <= set(w):
        return warning_text(w)
    return str(w)
