"""`qcompiler quantize`: a thin click wrapper over `qcompiler.quant.api.quantize`.

The switches' options (`--weight-bits`, `--optimize`, `--max-drop`, ...) come from the table in
qcompiler/quant/core/switches.py (`switch_options`); the options here are the data, the outputs and the terminal.
Register it on the main group with `main.add_command(quantize_cmd)` (qcompiler/cli.py); the group turns
QCompilerError into one line on stderr and exit code 2.

Streams: stdout carries the human summary, or exactly one JSON document (`--json`: the summary object;
`--report -`: the report), and then the human summary goes to stderr. Warnings (a selector, config rule or
frozen encoding that matches nothing) are `qcompiler: warning: ...` lines on stderr, even with `-q`; progress
bars go to stderr (qcompiler/progress.py).
"""
from __future__ import annotations

import json
import os
import math

import click

from qcompiler.cli_instruments import Instruments, examples, first_sample, instrument_options
from qcompiler.debugger import debug
from qcompiler.errors import ArgumentError
from qcompiler.html_report import require_html_extra, write_html_report
from qcompiler.onnx_io import save_model, write_atomic
from qcompiler.onnx_io.files import check_output_paths
from qcompiler.passes.quantize.mixed_precision.plot import write_pareto_png
from qcompiler.passes.quantize.mixed_precision.search import format_table
from qcompiler.passmanager.registry import parse_pipeline
from qcompiler.quant.api import quantize, resolve_early
from qcompiler.quant.core.pipeline import pipeline_for
from qcompiler.quant.core.switches import api_from_cli, check_switches, cli_switches
from qcompiler.quant.interop.report import format_summary
from qcompiler.quant.interop.verdict import verdict_line
from qcompiler.shorten import short_path
from qcompiler.quant.settings.selection import warning_text

# the API's warning kinds, named as the command line names them
FLAG_LABELS = {"exclude": "--exclude", "op_types": "--op-types", "nodes": "node", "config rule": "config rule",
               "config": "--config",
               "frozen encoding": "--load-encodings entry"}


def switch_options(f):
    """Add one option per switch of the table (qcompiler/quant/core/switches.py) that has a flag, in table order; the command
    receives each under the switch's keyword (`--block-size` as `weight_block`)."""
    for s in reversed(cli_switches()):
        fl = s.flag
        kw = dict(help=fl.help or None, default=s.cli_default, metavar=fl.metavar, show_default=fl.show_default,
                  multiple=fl.multiple)
        if fl.is_flag:
            kw["is_flag"] = True
        if fl.type is not None:
            kw["type"] = fl.type if isinstance(fl.type, type) else fl.type()
        f = click.option(*fl.decls, s.name, **kw)(f)
    return f


@click.command("quantize", epilog=examples(
    "qcompiler quantize model.onnx --calib calib.npz -o model.qdq.onnx",
    "qcompiler quantize model.onnx --calib calib.npz -o q.onnx --target trt --report report.json",
    "qcompiler quantize model.onnx --calib calib.npz -o q.onnx --op-types Conv,MatMul --exclude '^/head/'",
    "qcompiler quantize model.onnx --calib calib.npz -o q.onnx --encodings q.encodings --config quantsim.json "
    "--target aimet",
    "qcompiler quantize decoder.onnx -o decoder.int4.onnx --weight-only --weight-bits 4"))
@click.argument("model_path", metavar="MODEL")
@click.option("--calib", metavar="DATA", help="calibration data: .npz (one key per graph input, samples along axis 0; a sample may "
              "carry its own batch dim of 1), .npy (single-input model), or a folder of them; required except "
              "for --weight-only round-to-nearest")
@click.option("-o", "--output", required=True, metavar="OUT", help="where to write the QDQ model")
@switch_options
# --- outputs ---
@click.option("--encodings", "encodings_path", type=click.Path(), help="also write AIMET encodings JSON here")
@click.option("--encodings-version", type=click.Choice(["1.0.0", "2.0.0"]), default="1.0.0", show_default=True)
@click.option("--report", "report_path", type=click.Path(), help="write the JSON report here ('-': to stdout)")
@click.option("--report-html", "report_html", type=click.Path(),
              help="write the report as one self-contained HTML page here (pip install 'qcompiler[html]')")
@click.option("--allow-low-sqnr", is_flag=True, help="exit 0 even when an output's SQNR stays below the floor")
@click.option("--debug", "with_debug", is_flag=True, help="compare every quantized value with float (qcompiler debug): "
              "its table after the summary, the whole of it in the report under 'debug'")
# --- terminal ---
@click.option("--json", "as_json", is_flag=True, help="print one JSON summary object on stdout (nothing else)")
@click.option("-q", "--quiet", is_flag=True, help="no summary and no bars (warnings and errors still on stderr)")
@instrument_options
def quantize_cmd(model_path, calib, output, encodings_path, encodings_version, report_path, report_html,
                 allow_low_sqnr, with_debug, as_json, quiet, **flags):
    """Quantize MODEL to QDQ ONNX with one streaming calibration pass over --calib.

    The work is a pipeline of passes (`qcompiler list-passes`): the flags of `qcompiler run` (--time-passes,
    --print-after, --dump-dir, --stats, --verify-each) reach every one of them."""
    report_stdout = report_path == "-"
    if as_json and report_stdout:
        raise click.UsageError("--json and --report - both write to stdout; give --report a file")
    if report_html:
        require_html_extra()   # one line before any work, not after the quantization
    # the switches as quantize() takes them, checked here by the same table (one line naming the keyword)
    given = api_from_cli({s.name: flags.pop(s.name) for s in cli_switches()})
    if quiet:
        given["progress"] = False
    switches = check_switches(given)
    inputs = tuple(x for x in (model_path, calib, given["config"], given["load_encodings"], given["target"])
                   if x is not None)
    names = pipeline_for(**switches)
    passes = parse_pipeline(names)   # unknown names fail here, before any file is read
    pareto = f"{report_path}.pareto.png" if switches["max_drop"] is not None and report_path and not report_stdout \
        else None
    outputs = [("-o", output), ("--encodings", encodings_path),
               ("--report", None if report_stdout else report_path), ("--report (Pareto plot)", pareto),
               ("--report-html", report_html)] + \
        Instruments.dump_outputs(passes, flags["dump_dir"])
    check_output_paths(outputs, inputs, models=(model_path,),
                       new_folders={"--dump-dir": flags["dump_dir"]})
    # only now is the config read (no file is read before the outputs are checked): it may ask for weight-only,
    # whose pipeline differs
    weight_only = switches["weight_only"]
    switches = resolve_early(switches, given)
    given.update(config=switches["config"], weight_only=switches["weight_only"])
    if switches["weight_only"] != weight_only:
        names = pipeline_for(**switches)
        passes = parse_pipeline(names)
    instruments = Instruments(passes, inputs, feeds_name=calib, feeds_factory=first_sample(calib, "calibration data"),
                              **flags)
    res = quantize(model_path, calib, **dict(given, recipe=None, pipeline=names), instrumentations=instruments.list)
    save_model(res.model, output, protect=inputs)
    res.report["size"] = file_sizes(model_path, res.model, output)
    if encodings_path:
        res.write_encodings(encodings_path, encodings_version, protect=inputs)
    dbg = None
    if with_debug:
        if calib is None:
            raise ArgumentError("--debug compares on calibration samples: give --calib")
        dbg = debug(model_path, res.model, calib, limit=given.get("limit"), progress=given.get("progress"),
                    ray=given.get("ray"))
        res.report["debug"] = dbg.to_dict()
    _write_report(res.report, report_path, inputs)
    if report_html:
        write_html_report(report_html, res.report, res.report.get("debug"), title=short_path(model_path),
                          protect=inputs)
    mp_note = _mixed_precision_plot(res.report, pareto, inputs)
    instruments.report()
    for w in res.report.get("warnings", []):
        click.echo(f"qcompiler: warning: {warning_line(w)}", err=True)
    if as_json:
        click.echo(json.dumps(summary_object(res.report, output, encodings_path, report_path), indent=1))
    if not quiet:
        to_stderr = as_json or report_stdout
        click.echo(format_summary(res.report), err=to_stderr)
        _safety_net_line(res.report, to_stderr)
        if res.report.get("mixed_precision"):
            click.echo(format_table(res.report["mixed_precision"]), err=to_stderr)
            if mp_note:
                click.echo(f"  {mp_note}", err=to_stderr)
        if dbg is not None:
            click.echo(dbg.table(), err=to_stderr)
        click.echo(f"wrote {output}", err=to_stderr)
    _quality_gate(res.report, allow_low_sqnr)


def file_sizes(model_path: str, model, output: str) -> dict:
    """Bytes on disk of the float model (its file and the external data it read) and of the written output (its
    file and `OUTPUT.data` when it has one): the figure a user who quantizes to ship a smaller model wants."""
    def size(p):
        try:
            return os.path.getsize(p)
        except OSError:
            return 0
    float_bytes = size(model_path) + sum(size(p) for p in getattr(model, "external_files", ()) or ())
    out_bytes = size(output) + size(output + ".data")
    return {"float_bytes": float_bytes, "quantized_bytes": out_bytes,
            "ratio": round(out_bytes / float_bytes, 3) if float_bytes else None}


def _mixed_precision_plot(report: dict, path, inputs):
    """The Pareto PNG beside the report (`<report>.pareto.png`); a note when it is not written."""
    mp = report.get("mixed_precision")
    if not mp:
        return None
    if not path:
        return "mixed precision: no Pareto plot without --report FILE (it goes beside the report)"
    return write_pareto_png(mp, path, protect=inputs)


def _write_report(report: dict, path, inputs) -> None:
    if not path:
        return
    text = json.dumps(report, indent=1, default=_plain) + "\n"
    if path == "-":
        click.echo(text, nl=False)
        return
    write_atomic(path, text, protect=inputs)


def warning_line(w: dict) -> str:
    return warning_text(w, FLAG_LABELS)


def summary_object(report: dict, output: str, encodings_path=None, report_path=None) -> dict:
    """The `--json` summary: where things were written, counts, per-output SQNR, why values were left float
    (each reason whole, with its count), warnings and timings. Non-finite numbers are strings ("inf")."""
    reasons: dict = {}
    for r in report["left_float"].values():
        reasons[r] = reasons.get(r, 0) + 1
    out = {"model": output, "encodings": encodings_path, "report": report_path,
           "target": report.get("target"), "scheme": report.get("scheme"),
           "calibration_samples": report.get("calibration_samples"), "counts": report.get("counts"),
           "output_sqnr_db": report.get("output_sqnr_db"), "output_max_abs_error": report.get("output_max_abs_error"),
           "sqnr_samples": report.get("sqnr_samples"),
           "left_float_reasons": dict(sorted(reasons.items(), key=lambda t: -t[1])),
           "widened": report.get("widened"), "min_sqnr_db": report.get("min_sqnr_db"),
           "below_floor": report.get("below_floor"), "safety_net": report.get("safety_net"),
           "warnings": [warning_line(w) for w in report.get("warnings", [])],
           "notes": report.get("notes"), "seconds": report.get("seconds"), "size": report.get("size"),
           "kernel_share": report.get("kernel_share"), "verdict": verdict_line(report).strip() or None}
    if report.get("mixed_precision"):
        mp = report["mixed_precision"]
        out["mixed_precision"] = {"budget": mp["budget"], "drop": mp["drop"], "weight_bytes": mp["weight_bytes"],
                                  "layers": {k: v["chosen"] for k, v in mp["layers"].items()}}
    return _finite(out)


def _finite(o):
    if isinstance(o, float) and not math.isfinite(o):
        return "nan" if math.isnan(o) else ("inf" if o > 0 else "-inf")
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    if hasattr(o, "item") and not isinstance(o, (str, bytes)):
        try:
            return _finite(o.item())
        except (AttributeError, ValueError, TypeError):
            return str(o)
    return o


def _safety_net_line(report: dict, to_stderr: bool = False) -> None:
    sn = report.get("safety_net") or {}
    if sn.get("triggered"):
        acts = [c["action"] for c in sn.get("changed", ())]
        weights = sum(a.startswith("weight") for a in acts)
        click.echo(f"  safety net: output SQNR {sn.get('sqnr_before_db')} dB -> {sn.get('sqnr_after_db')} dB, "
                   f"{acts.count('widened')} quantizers widened to 16 bits and {acts.count('float')} left float"
                   + (f", {weights} weights on a finer grid " if weights else " ") +
                   f"({sn.get('trials')} trials, {sn.get('seconds')} s; see report 'safety_net')"
                   + (f"; {sn['note']}" if sn.get("note") else ""), err=to_stderr)
        if sn.get("summary"):
            click.echo(f"  safety net {sn['summary']}", err=to_stderr)


def _quality_gate(report: dict, allow: bool) -> None:
    """an output below the SQNR floor is a warning line on stderr each, then exit 3 (the model,
    encodings and report are already written) unless `--allow-low-sqnr`."""
    low = report.get("below_floor") or []
    for b in low:
        click.echo(f"qcompiler: warning: output '{b['output'][:80]}' SQNR {b['sqnr_db']} dB is below the floor "
                   f"{b['floor_db']:g} dB" + (" (--allow-low-sqnr: exit 0)" if allow else
                                              " (exit 3; --allow-low-sqnr keeps exit 0)"), err=True)
    if low and not allow:
        raise SystemExit(3)


def _plain(o):
    try:
        return o.item()
    except AttributeError:
        return str(o)
