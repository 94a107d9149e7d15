"""The HTML report (`quantize --report-html`, qcompiler/html_report.py): hostile names are escaped in the page and
in its charts, the page names no URL it could fetch, `debug`'s per-value data is charted in graph order with the
worst first in the table, the safety net's and the mixed-precision search's choices are shown, a missing extra is
one line with exit 2; and the page of a real quantize run loads in headless Chromium with no console error, no
network request and a screenshot that is not blank (skipped where no Chromium is installed)."""
from __future__ import annotations

import base64
import os
import json
import re
import sys
from html.parser import HTMLParser

import pytest
from click.testing import CliRunner

from qcompiler.cli import main
from qcompiler.errors import ArgumentError
from qcompiler.html_charts import grid_bits
from qcompiler.html_report import MISSING_EXTRA, page_context, pass_effects, render_html
from tests.browser import find_chromium, is_blank, load_page, network_requests
from tests.corpus import corpus_file

HOSTILE = ['<script>alert(1)</script>', '"><img src=http://evil.example/x.png>', "$\\frac{1}{$ --> <!--",
           "a' onload='fetch(\"//evil.example\")", "<style>@import url(https://evil.example/a.css)</style>"]
URL_ATTRS = {"src", "href", "srcset", "action", "formaction", "poster", "data", "background", "xlink:href"}


def _report(names=HOSTILE) -> dict:
    """A report in the JSON report's shape whose every name is hostile."""
    layers = {n: {"input1": "int8 per-channel (axis 0)", "outputs": f"float (inside Conv+Relu supergroup {n})"}
              for n in names}
    return {
        "target": "ort_cpu", "scheme": "min_max", "optimize": "balanced", "calibration_samples": 8,
        "sqnr_samples_note": "all 8 calibration samples", "min_sqnr_db": 15.0,
        "output_sqnr_db": {names[0]: 12.5, names[1]: "inf"}, "output_max_abs_error": {names[0]: 0.25},
        "layers": layers, "left_float": {n: f"reason {n}" for n in names}, "widened": {names[2]: "16 bits: x"},
        "bodies": {names[3]: "no integer kernel"},
        "counts": {"activations": 4, "params": 2, "left_float": len(names), "widened": 1},
        "pipeline": ["calibrate", "place", "smoothquant", "insert-qdq", "measure-sqnr", "safety-net", names[0]],
        "passes": [{"name": "calibrate", "seconds": 0.5, "modified": False, "stats": {"samples": 8}},
                   {"name": "measure-sqnr", "seconds": 0.1, "modified": False, "stats": {"worst_sqnr_db": 9.0}},
                   {"name": names[0], "seconds": 0.2, "modified": True, "stats": {names[1]: names[2]}}],
        "safety_net": {"triggered": True, "seconds": 1.5, "sqnr_before_db": 9.0, "sqnr_after_db": 12.5, "trials": 3,
                       "changed": [{"value": names[4], "action": "float", "sqnr_before_db": 9.0,
                                    "sqnr_after_db": 12.5, "reason": f"left float by the safety net {names[0]}"}]},
        "latency_search": {"ran": True, "sqnr_before_db": 12.5, "sqnr_after_db": 12.1, "removed": 2, "trials": 4},
        "mixed_precision": {"budget": 0.01, "drop": 0.008, "metric": "relative output error", "weight_bytes": 1000,
                            "evaluations": 5, "layers": {names[0]: {"op": "Conv", "chosen": "W8A8", "weights": 9,
                                                                    "sensitivity": {"W8A8": 0.002}}},
                            "trials": [{"what": f"all W8A8 {names[1]}", "weight_bytes": 1000, "drop": 0.008},
                                       {"what": f"layers float: {names[0]}", "weight_bytes": 4000, "drop": 0.0}]},
        "kernels": {"integer_nodes": 1, "float_nodes": 3, "nodes": {names[0]: {"integer": True, "kernel": "QLinearConv"},
                                                                    names[1]: {"integer": False, "reason": names[2]}}},
        "size": {"float_bytes": 4 << 20, "quantized_bytes": 1 << 20, "ratio": 0.25},
        "notes": [f"note {names[0]}"], "warnings": [{"kind": "exclude", "value": names[1], "problem": "matches no node"}],
    }


def _debug(n_values: int = 30, bad: int = 10) -> dict:
    """`qcompiler debug`'s shape: values ranked worst first, each with its graph `order`; value `bad` (in graph
    order) is the one outlier, and hostile names are among the values."""
    values = []
    for i in range(n_values):
        name = HOSTILE[i % len(HOSTILE)] + f"#{i}" if i % 7 == 3 else f"/block{i // 10}/conv{i}/output_0"
        sqnr = 40.0 - 0.3 * i if i != bad else 6.0
        values.append({"name": name, "sqnr_db": sqnr if i != 0 else "inf", "alone_sqnr_db": sqnr + 3.0,
                       "max_abs_error": 0.01 * (i + 1), "order": i, "node": f"node{i}", "op_type": "Conv",
                       "kind": "activation", "local_sqnr_db": sqnr})
    del values[5]["node"]       # an entry without a field the page shows: a blank cell, not an error
    ranked = sorted(values, key=lambda v: v["sqnr_db"] if isinstance(v["sqnr_db"], float) else 1e9)
    return {"values": ranked,
            "modules": [{"scope": "/block1/", "sqnr_db": "inf", "alone_sqnr_db": 20.0, "quantizers": 7},
                        {"scope": "/block0/", "sqnr_db": 30.0, "alone_sqnr_db": 38.0},
                        {"scope": HOSTILE[0], "sqnr_db": 7.0, "alone_sqnr_db": 8.0}],
            "outputs": {"logits": 12.0}, "samples": 8, "unmatched": [], "notes": []}


def _svgs(page: str) -> list:
    return [base64.b64decode(m).decode("utf-8")
            for m in re.findall(r'src="data:image/svg\+xml;base64,([A-Za-z0-9+/=]+)"', page)]


class _Tags(HTMLParser):
    """Every start tag with its attributes, and the text of <style> elements, as a browser's parser sees them."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.styles, self._in_style = [], [], False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.styles.append(data)


def _no_fetchable_url(page: str) -> None:
    """No element that loads anything from outside: no script, link, iframe, object or embed; every URL-valued
    attribute a data: URI or an in-page #reference; no url() or @import in CSS; nothing in the charts either."""
    p = _Tags()
    p.feed(page)
    tags = {t for t, _ in p.tags}
    assert not tags & {"script", "link", "iframe", "object", "embed", "base", "frame", "audio", "video"}, tags
    for tag, attrs in p.tags:
        for k, v in attrs.items():
            if k in URL_ATTRS:
                assert (v or "").startswith(("data:", "#")), (tag, k, v)
            assert not k.startswith("on"), (tag, k)
            if k == "style":
                assert "url(" not in v, (tag, v)
    assert all("url(" not in css and "@import" not in css for css in p.styles)
    for svg in _svgs(page):     # inside the charts: only internal references
        assert not re.search(r"""(?:href|src)\s*=\s*["'](?!#)""", svg)
        assert "<script" not in svg and "<foreignObject" not in svg


def test_hostile_names_are_escaped_everywhere():
    page = render_html(_report(), _debug(), title=HOSTILE[0])
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    for raw in ("<script>", "<img src=http", "<style>@import", "onload='fetch"):
        assert raw not in page, raw
    _no_fetchable_url(page)
    svgs = _svgs(page)
    assert len(svgs) == 3           # SQNR chart, timings, Pareto
    for svg in svgs:
        assert "<script" not in svg and "<img" not in svg and "<style>@import" not in svg
    # the hostile name marked on the SQNR chart is written escaped in the SVG's comments, never raw
    assert any("&lt;script&gt;" in svg for svg in svgs)


def test_a_huge_name_is_cut_on_the_page():
    huge = "n" * 50_000 + "<script>" + "m" * 50_000
    page = render_html(_report(names=[huge] + HOSTILE[1:]), None, title=huge)
    assert len(page) < 400_000 and "n" * 500 not in page and "m" * 500 not in page   # the charts' labels too
    assert '<td class="name">' + "n" * 99 + "…" + "m" * 99 + "</td>" in page


def test_a_clean_report_names_no_url_at_all():
    page = render_html(_report(names=[f"conv{i}" for i in range(5)]), None)
    assert "http:" not in page and "https:" not in page
    for svg in _svgs(page):
        assert "http:" not in svg.split(">", 1)[1]     # past the root element's xmlns
    _no_fetchable_url(page)


def test_debug_values_are_charted_in_graph_order_and_listed_worst_first():
    debug = _debug()
    ctx = page_context(_report(), debug)
    assert ctx["sqnr_chart"] and ctx["precision_chart"] is None
    assert [v["name"] for v in ctx["worst"]] == [v["name"] for v in debug["values"][:len(ctx["worst"])]]
    assert ctx["worst"][0]["name"] == HOSTILE[0] + "#10" and ctx["worst"][0]["rank"] == 1
    page = render_html(_report(), debug)
    rows = re.findall(r'<tr><td class="n">(\d+)</td><td class="name">([^<]*)</td>', page)
    assert [int(r[0]) for r in rows[:5]] == [1, 2, 3, 4, 5]
    assert rows[0][1] == "&lt;script&gt;alert(1)&lt;/script&gt;#10" and rows[1][1] == "/block2/conv29/output_0"
    # the chart marks the worst and names them (escaped); modules are listed worst first
    sqnr_svg = _svgs(page)[0]
    assert "/block2/conv29/output_0" in sqnr_svg and "&lt;script&gt;alert(1)&lt;/script&gt;#10" in sqnr_svg
    assert "/block0/conv1/output_0" not in sqnr_svg              # a good value is drawn, not named
    assert page.index("&lt;script&gt;alert(1)&lt;/script&gt;</td><td class=\"n\">7.00 dB") < \
        page.index("/block0/</td>") < page.index("/block1/</td>")
    assert '<td class="name">logits</td><td class="n">12.00 dB</td>' in page


def test_debug_alone_makes_a_debug_page():
    page = render_html({}, _debug(), title="f.onnx")
    assert "<h1>qcompiler debug report" in page and 'alt="per-value SQNR' in page
    assert "Summary" not in page and "Safety net" not in page and "Mixed-precision" not in page
    _no_fetchable_url(page)


def test_without_debug_the_plan_is_charted_and_debug_is_named():
    page = render_html(_report(names=[f"conv{i}" for i in range(5)]), None)
    assert "qcompiler debug FLOAT.onnx QUANT.onnx" in page
    ctx = page_context(_report(names=[f"conv{i}" for i in range(5)]), None)
    assert ctx["precision_chart"] and ctx["sqnr_chart"] is None
    assert [r["weight_bits"] for r in ctx["layers"]] == [8] * 5
    assert [r["output_bits"] for r in ctx["layers"]] == [-1] * 5        # inside a Conv+Relu group
    assert ctx["layers"][0]["integer"] is True and ctx["layers"][1]["integer"] is False


@pytest.mark.parametrize("text, bits", [("uint8 per-tensor", 8), ("int4 per-block 32 (axis 1)", 4),
                                        ("int16 per-channel (axis 0) [full range (float kernel)]", 16),
                                        ("float (no integer kernel on ort_cpu reads or writes it)", 0),
                                        ("float (inside Conv+Relu supergroup (quantizers only at its boundary))", -1)])
def test_grid_bits_reads_the_reports_grid_text(text, bits):
    assert grid_bits(text) == bits


def test_summary_safety_net_mixed_precision_and_pass_effects():
    r = _report(names=[f"conv{i}" for i in range(5)])
    page = render_html(r, None)
    assert "0.25x" in page and "25 %" in page                # file size against float, integer-kernel share
    assert '<span class="pill recipe">smoothquant</span>' in page
    assert '<span class="pill">calibrate</span>' in page
    assert "9.00 dB → 12.50 dB" in page                      # the safety net's before and after
    assert 'alt="Pareto plot' in page and "W8A8" in page
    assert "below the floor" in page                         # 12.5 dB < 15 dB
    effects = {e["pass"]: e for e in pass_effects(r)}
    assert effects["measure-sqnr"]["after"] == 9.0
    assert (effects["latency-search"]["before"], effects["latency-search"]["after"]) == (12.5, 12.1)
    assert (effects["safety-net"]["before"], effects["safety-net"]["after"]) == (9.0, 12.5)
    assert effects["final"]["after"] == 12.5


def test_missing_extra_is_one_line_and_exit_2(monkeypatch, tiny, tmp_path):
    monkeypatch.setitem(sys.modules, "jinja2", None)        # `import jinja2` raises ImportError
    with pytest.raises(ArgumentError, match=re.escape(MISSING_EXTRA)):
        render_html(_report(), None)
    r = CliRunner().invoke(main, ["quantize", str(tiny / "tiny_cnn.onnx"), "--calib", str(tiny / "tiny_cnn_calib.npz"),
                                  "-o", str(tmp_path / "q.onnx"), "--report-html", str(tmp_path / "r.html")])
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines() == [f"qcompiler: error: {MISSING_EXTRA}"]
    assert not (tmp_path / "q.onnx").exists()                # refused before any work


def test_report_html_is_written_and_refuses_to_land_on_an_input(tiny, tmp_path):
    r = CliRunner().invoke(main, ["quantize", str(tiny / "tiny_cnn.onnx"), "--calib", str(tiny / "tiny_cnn_calib.npz"),
                                  "-o", str(tmp_path / "q.onnx"), "--report-html", str(tiny / "tiny_cnn_calib.npz")])
    assert r.exit_code == 2 and "--report-html" in r.stderr
    out = tmp_path / "r.html"
    r = CliRunner().invoke(main, ["quantize", str(tiny / "tiny_cnn.onnx"), "--calib", str(tiny / "tiny_cnn_calib.npz"),
                                  "-o", str(tmp_path / "q.onnx"), "--report-html", str(out), "--report",
                                  str(tmp_path / "r.json"), "-q"], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    page = out.read_text(encoding="utf-8")
    report = json.loads((tmp_path / "r.json").read_text())
    (name, sqnr), = report["output_sqnr_db"].items()
    assert f'<td class="name">{name}</td><td class="n ok">{sqnr:.2f} dB</td>' in page
    assert "tiny_cnn.onnx" in page
    _no_fetchable_url(page)


# ------------------------------------------------------------------------------------------- in a browser

needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="no Chromium installed (Debian: apt-get install "
                                    "-y chromium; or set QC_CHROMIUM to a Chromium/Chrome binary)")


def _assert_renders(path) -> dict:
    got = load_page(str(path))
    assert got["console_errors"] == [] and got["exceptions"] == [], (got["console_errors"], got["exceptions"])
    assert network_requests(got["requests"]) == []
    assert got["requests"][0].startswith("file:")
    assert got["broken_images"] == 0                         # every chart decoded
    assert got["title"].startswith("qcompiler: ")
    assert not is_blank(got["png"]) and got["height"] > 1000
    return got


@needs_chromium
def test_the_browser_check_sees_errors_requests_and_a_blank_page(tmp_path):
    """The checks below can fail: a page that logs an error, throws, fetches from outside and shows nothing."""
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><head><title>t</title></head><body style="background:#fff">'
                   '<img src="http://127.0.0.1:9/x.png" style="display:none">'
                   '<script>console.error("boom"); undefined_function();</script></body></html>', encoding="utf-8")
    got = load_page(str(bad))
    assert [e["args"][0]["value"] for e in got["console_errors"] if e.get("args")] == ["boom"]
    assert got["exceptions"] and network_requests(got["requests"]) == ["http://127.0.0.1:9/x.png"]
    assert is_blank(got["png"])


@needs_chromium
def test_the_page_of_a_quantize_run_renders_in_chromium(tiny, tmp_path):
    out = tmp_path / "r.html"
    r = CliRunner().invoke(main, ["quantize", str(tiny / "tiny_cnn.onnx"), "--calib", str(tiny / "tiny_cnn_calib.npz"),
                                  "-o", str(tmp_path / "q.onnx"), "--report-html", str(out), "--max-drop", "1%",
                                  "-q"], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    _assert_renders(out)


@needs_chromium
def test_a_hostile_page_with_debug_data_renders_in_chromium(tmp_path):
    out = tmp_path / "hostile.html"
    out.write_text(render_html(_report(), _debug(), title=HOSTILE[1]), encoding="utf-8")
    got = _assert_renders(out)
    assert got["title"] == f"qcompiler: {HOSTILE[1]}"         # shown as text, not parsed as markup


@needs_chromium
@pytest.mark.skipif(not os.path.exists(corpus_file("ppocr_cls")), reason="no shared corpus")
def test_the_page_of_ppocr_cls_renders_in_chromium(tmp_path):
    out = tmp_path / "ppocr_cls.html"
    r = CliRunner().invoke(main, ["quantize", corpus_file("ppocr_cls"), "--calib", corpus_file("ppocr_cls", "calib.npz"),
                                  "-o", str(tmp_path / "q.onnx"), "--report-html", str(out), "--measure-latency",
                                  "-q"], catch_exceptions=False)
    assert r.exit_code == 0, r.stderr
    got = _assert_renders(out)
    assert "integer-kernel share" in out.read_text(encoding="utf-8")
    assert got["height"] > 2000
