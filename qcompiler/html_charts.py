"""Static SVG charts for the HTML report, drawn by matplotlib (the `html` extra) and embedded as data: URIs.

A data: URI image keeps the page one file that makes no network request, and it isolates each chart: matplotlib's
SVG carries a global `*{...}` style and element ids (`figure_1`, glyph and clip-path ids) that would clash
between several charts inlined in one page. Text is drawn as paths (`svg.fonttype: path`), so no font is loaded;
mathtext is off (`text.parse_math`), so a node name holding `$` is drawn as it is and never parsed.
"""
from __future__ import annotations

import base64
import io
import math
import re
from typing import Iterable, List, Optional

from qcompiler.passes.quantize.mixed_precision.plot import pareto_figure

CHART_RC = {"text.parse_math": False, "svg.fonttype": "path", "svg.hashsalt": "qcompiler", "font.size": 8}
LABEL_CHARS = 36            # a marked layer's name on a chart is cut to this many characters
GRID_COLOURS = {0: "#c8c8c8", 4: "#7b3294", 8: "#2c7bb6", 16: "#1a9641"}   # float, int4, int8, int16
INSIDE_GROUP = -1           # an output inside a supergroup: float there, its grid is at the group's boundary
INSIDE_COLOUR = "#abd9e9"
KERNEL_COLOURS = {True: "#404040", False: "#ececec"}


def _figure(width: float, height: float):
    import matplotlib
    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure
    return Figure(figsize=(width, height), dpi=100)


def _rc():
    import matplotlib
    return matplotlib.rc_context(CHART_RC)


def data_uri(fig) -> str:
    """The figure as an SVG data: URI (no metadata: matplotlib's names its web site in it)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]          # the DOCTYPE names the W3C's DTD by URL: not needed by any browser
    return "data:image/svg+xml;base64," + base64.b64encode(svg.encode("utf-8")).decode("ascii")


def db_number(v) -> Optional[float]:
    """A dB figure from a report (a number, "inf", None) as a float, or None when there is none."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v) if not math.isnan(v) else None
    if isinstance(v, str) and v.strip().lstrip("+-") in ("inf", "Infinity"):
        return -math.inf if v.strip().startswith("-") else math.inf
    return None


def _short(name) -> str:
    s = str(name)
    return s if len(s) <= LABEL_CHARS else s[:LABEL_CHARS - 1] + "…"


def sqnr_chart(values: List[dict], marked: Iterable[int]) -> str:
    """Per-value SQNR in graph order: with the quantizers up to it (`sqnr_db`) and that quantizer alone
    (`alone_sqnr_db`); the entries at indices `marked` (of `values`, already in graph order; worst first) are red,
    numbered and named. An exact value (infinite SQNR) is a triangle at the top edge."""
    with _rc():
        fig = _figure(10, 3.6)
        ax = fig.add_subplot(1, 1, 1)
        ys = [db_number(v.get("sqnr_db")) for v in values]
        alone = [db_number(v.get("alone_sqnr_db")) for v in values]
        finite = [y for y in ys + alone if y is not None and math.isfinite(y)]
        top = (max(finite) if finite else 60.0) + 5.0
        bottom = min(finite) if finite else 0.0

        def shown(y):
            if y is None:
                return math.nan
            return top if y == math.inf else (bottom - 5.0 if y == -math.inf else y)
        xs = list(range(len(values)))
        line = [shown(y) if y is None or math.isfinite(y) else math.nan for y in ys]
        ax.plot(xs, line, color="#2c7bb6", lw=1, marker=".", ms=3, label="SQNR with every quantizer up to it")
        exact = [i for i, y in enumerate(ys) if y == math.inf]
        if exact:
            ax.scatter(exact, [top] * len(exact), marker="^", s=14, color="#2c7bb6", label="exact (no error)")
        if any(a is not None for a in alone):
            ax.plot(xs, [shown(a) for a in alone], color="#fdae61", lw=0.8, marker=".", ms=2,
                    label="that quantizer alone")
        marked = [i for i in marked if 0 <= i < len(values)]
        if marked:
            ax.scatter(marked, [shown(ys[i]) for i in marked], s=40, color="#d7191c", zorder=3,
                       label="worst (numbered as in the table)")
            for rank, i in enumerate(marked, 1):
                right_half = i > len(values) / 2
                low = shown(ys[i]) < (bottom + top) / 2        # labels go towards the middle of the chart
                dy = 12 + 10 * (rank - 1)
                ax.annotate(f"{rank} {_short(values[i].get('name', ''))}", (i, shown(ys[i])), fontsize=7,
                            color="#d7191c", ha="right" if right_half else "left",
                            xytext=(-6 if right_half else 6, dy if low else -dy), textcoords="offset points",
                            arrowprops={"arrowstyle": "-", "color": "#d7191c", "lw": 0.5})
        ax.set_xlabel("value, in graph order")
        ax.set_ylabel("SQNR (dB)")
        ax.set_ylim(bottom - 8.0, top + 2.0)
        ax.grid(True, axis="y", color="#e0e0e0", lw=0.5)
        ax.legend(fontsize=7, loc="best")
        fig.subplots_adjust(left=0.06, right=0.99, bottom=0.14, top=0.97)
        return data_uri(fig)


def grid_bits(text) -> int:
    """Bits of a grid as report['layers'] writes it ("int8 per-channel (axis 0) [...]" -> 8); 0 for float,
    INSIDE_GROUP for a value inside a supergroup ("float (inside Conv+Relu supergroup ...)")."""
    m = re.match(r"u?int(\d+)", str(text))
    if m:
        return int(m.group(1))
    return INSIDE_GROUP if str(text).startswith("float (inside ") and "supergroup" in str(text) else 0


def precision_chart(rows: List[dict]) -> str:
    """The plan in graph order without debug data: per layer, its weight grid, its output grid and (when the
    report measured kernels) whether onnxruntime runs it on an integer kernel. `rows`: dicts with `weight_bits`,
    `output_bits` (None: none) and `integer` (None: not measured)."""
    with _rc():
        fig = _figure(10, 1.9)
        ax = fig.add_subplot(1, 1, 1)
        from matplotlib.patches import Patch
        from matplotlib.ticker import MaxNLocator
        lanes = [("weights", "weight_bits"), ("output", "output_bits")]
        if any(r.get("integer") is not None for r in rows):
            lanes.append(("kernel", "integer"))
        for lane, (_, key) in enumerate(reversed(lanes)):
            for i, r in enumerate(rows):
                v = r.get(key)
                if v is None:
                    continue
                colour = KERNEL_COLOURS[bool(v)] if key == "integer" else \
                    INSIDE_COLOUR if v == INSIDE_GROUP else GRID_COLOURS.get(v, "#fdae61")
                ax.broken_barh([(i, 0.9)], (lane + 0.1, 0.8), facecolors=colour)
        ax.set_yticks([k + 0.5 for k in range(len(lanes))], [name for name, _ in reversed(lanes)])
        ax.set_xlim(0, max(len(rows), 1))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylim(0, len(lanes))
        ax.set_xlabel("layer (#), in graph order")
        handles = [Patch(color=c, label="float" if b == 0 else f"{b}-bit") for b, c in GRID_COLOURS.items()]
        handles.append(Patch(color=INSIDE_COLOUR, label="inside a fused group (its quantizer, if any, at the end)"))
        if len(lanes) == 3:
            handles += [Patch(color=KERNEL_COLOURS[True], label="integer kernel"),
                        Patch(color=KERNEL_COLOURS[False], label="float kernel")]
        ax.legend(handles=handles, fontsize=7, ncol=len(handles), loc="upper center", bbox_to_anchor=(0.5, 1.32),
                  frameon=False)
        fig.subplots_adjust(left=0.07, right=0.99, bottom=0.25, top=0.8)
        return data_uri(fig)


def timing_chart(passes: List[dict]) -> str:
    """Wall seconds of each pass run, in pipeline order."""
    with _rc():
        fig = _figure(7, 0.6 + 0.18 * max(len(passes), 1))
        ax = fig.add_subplot(1, 1, 1)
        names = [_short(p.get("name", "")) for p in passes]
        secs = [p.get("seconds") if isinstance(p.get("seconds"), (int, float)) else 0.0 for p in passes]
        ys = list(range(len(passes)))[::-1]
        ax.barh(ys, secs, color="#2c7bb6", height=0.7)
        ax.set_yticks(ys, names)
        ax.set_xlabel("seconds")
        ax.grid(True, axis="x", color="#e0e0e0", lw=0.5)
        fig.subplots_adjust(left=0.28, right=0.98, bottom=0.5 / (0.6 + 0.18 * max(len(passes), 1)), top=0.98)
        return data_uri(fig)


def pareto_chart(mp: dict) -> Optional[str]:
    """The mixed-precision search's Pareto plot (the same figure as REPORT.pareto.png)."""
    trials = [dict(t, what=_short(t.get("what", ""))) for t in mp.get("trials", ()) if isinstance(t, dict)]
    with _rc():
        fig = pareto_figure(dict(mp, trials=trials))
        return None if fig is None else data_uri(fig)
