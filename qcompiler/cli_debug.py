"""`qcompiler debug FLOAT.onnx QUANT.onnx --calib DATA`: where the QDQ model loses accuracy (qcompiler/debugger/).

stdout carries the table, or exactly one JSON object (`--json`); bars and notes go to stderr. With
`--target-sqnr DB --write-config FIX.yaml` it also searches the fewest nodes to keep float for that worst-output
SQNR and writes the config `quantize --config` takes.
"""
from __future__ import annotations

import json

import click

from qcompiler.cli_instruments import examples

from qcompiler.debugger import config_text, debug
from qcompiler.errors import ArgumentError
from qcompiler.html_report import require_html_extra, write_html_report
from qcompiler.onnx_io import write_atomic
from qcompiler.onnx_io.files import check_output_paths
from qcompiler.shorten import short_path


@click.command("debug", epilog=examples(
    "qcompiler debug model.onnx model.qdq.onnx --calib calib.npz",
    "qcompiler debug model.onnx model.qdq.onnx --calib calib.npz --target-sqnr 30 --write-config fix.yaml",
    "qcompiler debug model.onnx model.qdq.onnx --calib calib.npz --report-html debug.html"))
@click.argument("float_path", metavar="FLOAT")
@click.argument("quant_path", metavar="QUANT")
@click.option("--calib", required=True, help="calibration data (as for quantize)")
@click.option("--limit", type=click.IntRange(min=1), default=None,
              help="compare on the first N samples (default: all, as quantize measures its output SQNR: a fallback "
                   "found on fewer may miss the target on the rest)")
@click.option("--top", type=click.IntRange(min=1), default=20, show_default=True, help="rows of the value table")
@click.option("--depth", type=click.IntRange(min=1), default=None,
              help="module scope depth in node names (default: chosen from the names)")
@click.option("--no-modules", is_flag=True, help="skip the per-module runs")
@click.option("--target-sqnr", type=float, default=None, metavar="DB",
              help="search the fewest nodes to keep float so that the worst output reaches DB")
@click.option("--write-config", type=click.Path(), default=None, metavar="FIX.yaml",
              help="with --target-sqnr: write that choice as a config for quantize --config")
@click.option("--target", default=None, metavar="NAME|FILE",
              help="the backend profile QUANT was made for: on one with 16-bit activations the fallback widens "
                   "before keeping float")
@click.option("--report-html", "report_html", type=click.Path(), default=None,
              help="also write the result as one self-contained HTML page (pip install 'qcompiler[html]')")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of the table")
@click.option("--progress/--no-progress", default=None, help="bars on stderr (default: when it is a terminal)")
@click.option("--ray", default=None, metavar="auto|ADDRESS",
              help="run the one-quantizer and one-module runs on a Ray cluster (pip install 'qcompiler[ray]'); "
                   "default: local processes where they pay (docs/parallel.md)")
def debug_cmd(float_path, quant_path, calib, limit, top, depth, no_modules, target_sqnr, write_config, target,
              report_html, as_json, progress, ray):
    """Compare every quantized value of QUANT with FLOAT on the calibration samples, worst first."""
    if write_config and target_sqnr is None:
        raise ArgumentError("--write-config needs --target-sqnr DB (the output SQNR the config is for)")
    inputs = tuple(x for x in (float_path, quant_path, calib, target) if x is not None)
    if report_html:
        require_html_extra()   # one line before any work
    outputs = [("--write-config", write_config), ("--report-html", report_html)]
    if write_config or report_html:
        check_output_paths(outputs, inputs, models=(float_path, quant_path))
    res = debug(float_path, quant_path, calib, limit=limit, depth=depth, modules=not no_modules,
                progress=progress, target_sqnr=target_sqnr, target=target, ray=ray)
    if write_config:
        write_atomic(write_config, config_text(res.fallback, float_path, quant_path), protect=inputs)
    if report_html:
        write_html_report(report_html, {}, res.to_dict(), title=short_path(quant_path), protect=inputs)
    if as_json:
        click.echo(json.dumps(res.to_dict(), indent=1))
    else:
        click.echo(res.table(top))
    for flag, path in outputs:
        if path:
            click.echo(f"wrote {path}", err=True)
