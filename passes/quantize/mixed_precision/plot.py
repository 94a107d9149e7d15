"""The Pareto plot of a mixed-precision search: weight bytes against measured drop of every assignment tried
(report['mixed_precision']['trials']), the Pareto front, the budget line and the chosen point, as a PNG.

matplotlib is an optional extra (`pip install 'qcompiler[plot]'`): without it `write_pareto_png` returns a
note and writes nothing. The PNG goes through onnx_io.write_atomic like every other output.
"""
from __future__ import annotations

import io
from typing import Optional

from qcompiler.onnx_io import write_atomic


def pareto_front(points):
    """The points no other point beats on both bytes and drop, sorted by bytes."""
    front, best = [], float("inf")
    for b, d in sorted(points):
        if d < best:
            front.append((b, d))
            best = d
    return front


def pareto_png(mp: dict) -> Optional[bytes]:
    """PNG bytes of the plot, or None when matplotlib is not installed."""
    fig = pareto_figure(mp)
    if fig is None:
        return None
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def pareto_figure(mp: dict):
    """The plot as a matplotlib Figure (the PNG here, an SVG in the HTML report), or None without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg", force=False)
        from matplotlib.figure import Figure
    except ImportError:
        return None
    trials = [t for t in mp.get("trials", []) if isinstance(t.get("drop"), (int, float))]
    fig = Figure(figsize=(6.4, 4.2), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    pts = [(t["weight_bytes"], 100 * t["drop"]) for t in trials]
    if pts:
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=18, color="tab:blue", label="assignments tried")
        for t, (b, d) in zip(trials, pts):
            if t["what"].startswith("all") or t["what"].startswith("layers float"):
                ax.annotate(t["what"], (b, d), fontsize=7, xytext=(3, 3), textcoords="offset points")
        front = pareto_front(pts)
        ax.plot([p[0] for p in front], [p[1] for p in front], color="tab:blue", lw=1, alpha=0.6,
                label="Pareto front")
    if isinstance(mp.get("drop"), (int, float)):
        ax.scatter([mp["weight_bytes"]], [100 * mp["drop"]], s=60, marker="*", color="tab:red", zorder=3,
                   label="chosen")
    ax.axhline(100 * mp["budget"], color="tab:gray", ls="--", lw=1, label=f"budget {100 * mp['budget']:g} %")
    ax.set_xlabel("weight bytes")
    ax.set_ylabel(f"drop % ({mp.get('metric', '')[:40]})")
    ax.set_title("mixed precision: weight bytes vs drop")
    ax.legend(fontsize=7)
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.12, top=0.92)   # tight_layout draws it twice more
    return fig


def write_pareto_png(mp: dict, path: str, protect: tuple = ()) -> str:
    """Write the plot to `path`; returns a one-line note (written, or why not)."""
    data = pareto_png(mp)
    if data is None:
        return "mixed precision: matplotlib is not installed, no Pareto plot (pip install 'qcompiler[plot]')"
    write_atomic(path, data, protect=protect)
    return f"mixed precision: Pareto plot written to {path}"
