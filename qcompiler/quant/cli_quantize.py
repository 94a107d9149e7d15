"""`qcompiler quantize`: a thin click wrapper over `qcompiler.quant.api.quantize`.

Register it on the main group with `main.add_command(quantize_cmd)` (qcompiler/cli.py); the group turns
QCompilerError into one line on stderr and exit code 2.

Streams: stdout carries the human summary, or exactly one JSON document (`--json`: the summary object;
`--report -`: the report), and then the human summary goes to stderr. Warnings (a selector, config rule or
frozen encoding that matches nothing) are `qcompiler: warning: ...` lines on stderr, even with `-q`; progress
bars go to stderr (qcompiler/progress.py).
"""
from __future__ import annotations

import json
import math

import click

from ..cli_instruments import Instruments, first_sample, instrument_options
from ..passmanager.registry import parse_pipeline
from .pipeline import pipeline_for

# the API's warning kinds, named as the command line names them
FLAG_LABELS = {"exclude": "--exclude", "op_types": "--op-types", "nodes": "node", "config rule": "config rule",
               "frozen encoding": "--load-encodings entry"}


@click.command("quantize")
@click.argument("model_path", metavar="MODEL")
@click.option("--calib", required=True, help="calibration data: .npz (one key per graph input, samples along "
              "axis 0; a sample may carry its own batch dim of 1), .npy (single-input model), or a folder of them")
@click.option("-o", "--output", required=True, help="where to write the QDQ model")
@click.option("--config", "config_path", type=click.Path(), help="AIMET quantsim JSON or qcompiler YAML/JSON config")
@click.option("--target", default=None, help="backend profile: ort_cpu (default), trt, qnn_htp, aimet (encodings "
              "for AIMET's default config), or a profile YAML")
@click.option("--scheme", default=None, help="min_max (default; aliases post_training_tf, tf), tf_enhanced "
              "(post_training_tf_enhanced), percentile, entropy (kl), mse")
@click.option("--per-channel/--per-tensor", default=True, help="weights per output channel (default) or per tensor")
@click.option("--weight-bits", type=int, default=8, show_default=True)
@click.option("--act-bits", type=int, default=8, show_default=True)
@click.option("--block-size", type=int, default=None, help="per-block weight scales: this many elements along "
              "each weight's reduction axis (MatMul K); opset 21 DequantizeLinear block_size")
# --- what is quantized (issue 11 item 7) ---
@click.option("--exclude", multiple=True, metavar="NODE|REGEX", help="keep this node float: a node name, or "
              "(when no node has that name) a regular expression searched in node names; repeatable")
@click.option("--op-types", default=None, metavar="OP[,OP...]", help="quantize only nodes of these op types "
              "(comma list, e.g. Conv,MatMul); the others keep float weights and outputs")
@click.option("--symmetric-activations", is_flag=True, default=False,
              help="symmetric activation grids (zero point 0), whatever the target's default")
@click.option("--bias-correction/--no-bias-correction", default=False, show_default=True,
              help="empirical bias correction of Conv/Gemm weights (helps weight-only, may hurt W8A8); the same as "
              "--recipe bias-correction")
# --- the pipeline (issue 12): passes, recipes, opset ---
@click.option("--recipe", default=None, metavar="PASS[,PASS...]", help="optional quantization passes to add, "
              "each where it belongs in the default pipeline (see `qcompiler list-passes`)")
@click.option("--pipeline", "pipeline", default=None, metavar="PASS[,PASS...]",
              help="replace the whole default pipeline (experts; each pass's requirements are checked first)")
@click.option("--optimize", type=click.Choice(["accuracy", "balanced", "latency"]), default="balanced",
              show_default=True, help="accuracy: every quantizer; balanced: no 16-bit quantizer where no integer "
              "kernel reads or writes it (float is exact and free); latency: a search takes out Q/DQ pairs between "
              "float kernels and narrows 16-bit values to 8 bits for integer kernels while the output SQNR loses "
              "at most --latency-budget-db")
@click.option("--latency-budget-db", "latency_budget_db", type=float, default=None, metavar="DB",
              help="with --optimize latency: output SQNR (dB) the search may give up for speed (default 1)")
@click.option("--untaken-branches", type=click.Choice(["float", "mirror"]), default="float", show_default=True,
              help="an If branch the calibration data never takes: float activations, or mirror: calibrated from "
              "the other branch where the values are the same tensors (the report's notes say which)")
@click.option("--smoothquant-alpha", type=click.FloatRange(0.0, 1.0, min_open=True, max_open=True), default=None,
              metavar="ALPHA", help="SmoothQuant's alpha for every layer (adds --recipe smoothquant; without it the "
              "recipe searches alpha per layer on the calibration data)")
@click.option("--measure-latency", is_flag=True, help="time the quantized model against float in onnxruntime "
              "(default session options, interleaved) and list which nodes run on integer kernels and why not")
@click.option("--max-drop", "max_drop", default=None, metavar="X%", help="mixed precision: the cheapest per-layer "
              "precision (W4A8 .. float) whose drop on the calibration samples stays within X%% (relative output "
              "error; see qcompiler.quant.mixed_precision); a table is printed, a Pareto PNG written beside --report")
@click.option("--ray", default=None, metavar="auto|ADDRESS", help="run the --max-drop evaluations on a Ray cluster "
              "(pip install 'qcompiler[ray]'); default: local processes")
@click.option("--opset", type=int, default=None, help="pin the output opset (default: 13, or 21 when int4/int16 "
              "grids, per-block weights or the target's 16-bit widening need it)")
# --- outputs ---
@click.option("--encodings", "encodings_path", type=click.Path(), help="also write AIMET encodings JSON here")
@click.option("--encodings-version", type=click.Choice(["1.0.0", "2.0.0"]), default="1.0.0", show_default=True)
@click.option("--load-encodings", type=click.Path(), help="AIMET encodings to freeze; the rest is calibrated")
@click.option("--report", "report_path", type=click.Path(), help="write the JSON report here ('-': to stdout)")
@click.option("--limit", type=int, default=None, help="use at most this many calibration samples")
# --- the output SQNR floor: the safety net below it; exit 3 when an output stays below it ---
@click.option("--min-sqnr", "min_sqnr", type=float, default=None, metavar="DB",
              help="output SQNR floor in dB (default 15): below it the safety net keeps float or widens the "
              "quantizers that break the output, and an output still below it exits 3 (after writing)")
@click.option("--allow-low-sqnr", is_flag=True, help="exit 0 even when an output's SQNR stays below the floor")
# --- terminal ---
@click.option("--json", "as_json", is_flag=True, help="print one JSON summary object on stdout (nothing else)")
@click.option("--progress/--no-progress", default=None, help="progress bars on stderr for loading, calibration "
              "and the report pass (default: on a terminal only; plain lines in logs)")
@click.option("-q", "--quiet", is_flag=True, help="no summary and no bars (warnings and errors still on stderr)")
@instrument_options
def quantize_cmd(model_path, calib, output, config_path, target, scheme, per_channel, weight_bits, act_bits,
                 block_size, exclude, op_types, symmetric_activations, bias_correction, recipe, pipeline, optimize,
                 latency_budget_db, measure_latency, opset, untaken_branches, smoothquant_alpha, max_drop, ray,
                 encodings_path, encodings_version, load_encodings, report_path, limit, min_sqnr, allow_low_sqnr,
                 as_json, progress, quiet, **flags):
    """Quantize MODEL to QDQ ONNX with one streaming calibration pass over --calib.

    The work is a pipeline of passes (`qcompiler list-passes`): the flags of `qcompiler run` (--time-passes,
    --print-after, --dump-dir, --stats, --verify-each) reach every one of them."""
    from ..onnx_io import save_model
    from ..onnx_io.files import check_output_paths
    from .api import quantize
    report_stdout = report_path == "-"
    if as_json and report_stdout:
        raise click.UsageError("--json and --report - both write to stdout; give --report a file")
    ops = _op_types(op_types)
    inputs = (model_path, calib, config_path, load_encodings, target)
    from .mixed_precision.budget import parse_max_drop
    max_drop = parse_max_drop(max_drop)
    names = pipeline_for(recipe, pipeline, bias_correction=bias_correction, load_encodings=load_encodings,
                         measure_latency=measure_latency, untaken_branches=untaken_branches == "mirror",
                         smoothquant_alpha=smoothquant_alpha, max_drop=max_drop)
    passes = parse_pipeline(names)   # unknown names fail here, before any file is read
    pareto = f"{report_path}.pareto.png" if max_drop is not None and report_path and not report_stdout else None
    outputs = [("-o", output), ("--encodings", encodings_path),
               ("--report", None if report_stdout else report_path), ("--report (Pareto plot)", pareto)] + \
        Instruments.dump_outputs(passes, flags["dump_dir"])
    check_output_paths(outputs, inputs, models=(model_path,),
                       new_folders={"--dump-dir": flags["dump_dir"]})
    instruments = Instruments(passes, inputs, feeds_name=calib, feeds_factory=first_sample(calib, "calibration data"),
                              **flags)
    res = quantize(model_path, calib, target=target, scheme=scheme, per_channel=per_channel,
                   weight_bits=weight_bits, act_bits=act_bits, config=config_path, load_encodings=load_encodings,
                   progress=False if quiet else progress, limit=limit, weight_block=block_size,
                   exclude=list(exclude) or None, op_types=ops,
                   act_symmetric=True if symmetric_activations else None, min_sqnr=min_sqnr,
                   pipeline=names, opset=opset, optimize=optimize, latency_budget_db=latency_budget_db,
                   smoothquant_alpha=smoothquant_alpha, max_drop=max_drop, ray=ray,
                   instrumentations=instruments.list)
    save_model(res.model, output, protect=inputs)
    if encodings_path:
        res.write_encodings(encodings_path, encodings_version, protect=inputs)
    _write_report(res.report, report_path, inputs)
    mp_note = _mixed_precision_plot(res.report, pareto, inputs)
    instruments.report()
    for w in res.report.get("warnings", []):
        click.echo(f"qcompiler: warning: {warning_line(w)}", err=True)
    if as_json:
        click.echo(json.dumps(summary_object(res.report, output, encodings_path, report_path), indent=1))
    if not quiet:
        from .report import format_summary
        to_stderr = as_json or report_stdout
        click.echo(format_summary(res.report), err=to_stderr)
        _safety_net_line(res.report, to_stderr)
        if res.report.get("mixed_precision"):
            from .mixed_precision import format_table
            click.echo(format_table(res.report["mixed_precision"]), err=to_stderr)
            if mp_note:
                click.echo(f"  {mp_note}", err=to_stderr)
        click.echo(f"wrote {output}", err=to_stderr)
    _quality_gate(res.report, allow_low_sqnr)


def _mixed_precision_plot(report: dict, path, inputs):
    """The Pareto PNG beside the report (`<report>.pareto.png`); a note when it is not written."""
    mp = report.get("mixed_precision")
    if not mp:
        return None
    if not path:
        return "mixed precision: no Pareto plot without --report FILE (it goes beside the report)"
    from .mixed_precision.plot import write_pareto_png
    return write_pareto_png(mp, path, protect=inputs)


def _op_types(text):
    if text is None:
        return None
    ops = [t.strip() for t in text.split(",") if t.strip()]
    if not ops:
        raise click.BadParameter("expected a comma list of op types, e.g. Conv,MatMul", param_hint="--op-types")
    return ops


def _write_report(report: dict, path, inputs) -> None:
    if not path:
        return
    text = json.dumps(report, indent=1, default=_plain) + "\n"
    if path == "-":
        click.echo(text, nl=False)
        return
    from ..onnx_io import write_atomic
    write_atomic(path, text, protect=inputs)


def warning_line(w: dict) -> str:
    from .selection import warning_text
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
           "notes": report.get("notes"), "seconds": report.get("seconds")}
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
        click.echo(f"  safety net: output SQNR {sn.get('sqnr_before_db')} dB -> {sn.get('sqnr_after_db')} dB, "
                   f"{acts.count('widened')} quantizers widened to 16 bits and {acts.count('float')} left float "
                   f"({sn.get('trials')} trials, {sn.get('seconds')} s; see report 'safety_net')"
                   + (f"; {sn['note']}" if sn.get("note") else ""), err=to_stderr)


def _quality_gate(report: dict, allow: bool) -> None:
    """Issue 11 item 3: an output below the SQNR floor is a warning line on stderr each, then exit 3 (the model,
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
