"""`qcompiler quantize`: a thin click wrapper over `qcompiler.quant.api.quantize`.

Register it on the main group with `main.add_command(quantize_cmd)` (qcompiler/cli.py); the group turns
QCompilerError into one line on stderr and exit code 2.
"""
from __future__ import annotations

import json

import click


@click.command("quantize")
@click.argument("model_path", metavar="MODEL")
@click.option("--calib", required=True, help="calibration data: .npz (one key per graph input, samples along "
              "axis 0; a sample may carry its own batch dim of 1) or a folder of .npz files")
@click.option("-o", "--output", required=True, help="where to write the QDQ model")
@click.option("--config", "config_path", type=click.Path(), help="AIMET quantsim JSON or qcompiler YAML/JSON config")
@click.option("--target", default=None, help="backend profile: ort_cpu (default), trt, qnn_htp, or a profile YAML")
@click.option("--scheme", default=None, help="min_max (alias post_training_tf, default), tf_enhanced, percentile, "
              "entropy, mse")
@click.option("--per-channel/--per-tensor", default=True, help="weights per output channel (default) or per tensor")
@click.option("--weight-bits", type=int, default=8, show_default=True)
@click.option("--act-bits", type=int, default=8, show_default=True)
@click.option("--block-size", type=int, default=None, help="per-block weight scales: this many elements along "
              "each weight's reduction axis (MatMul K); opset 21 DequantizeLinear block_size")
@click.option("--encodings", "encodings_path", type=click.Path(), help="also write AIMET encodings JSON here")
@click.option("--encodings-version", type=click.Choice(["1.0.0", "2.0.0"]), default="1.0.0", show_default=True)
@click.option("--load-encodings", type=click.Path(), help="AIMET encodings to freeze; the rest is calibrated")
@click.option("--report", "report_path", type=click.Path(), help="write the JSON report here")
@click.option("--limit", type=int, default=None, help="use at most this many calibration samples")
# issue 11 items 2-3: the output SQNR floor (safety net below it; exit 3 when an output stays below it)
@click.option("--min-sqnr", "min_sqnr", type=float, default=None, metavar="DB",
              help="output SQNR floor in dB (default 15): below it the safety net keeps float or widens the "
              "quantizers that break the output, and an output still below it exits 3 (after writing)")
@click.option("--allow-low-sqnr", is_flag=True, help="exit 0 even when an output's SQNR stays below the floor")
def quantize_cmd(model_path, calib, output, config_path, target, scheme, per_channel, weight_bits, act_bits,
                 block_size, encodings_path, encodings_version, load_encodings, report_path, limit,
                 min_sqnr=None, allow_low_sqnr=False):
    """Quantize MODEL to QDQ ONNX with one streaming calibration pass over --calib."""
    from ..onnx_io import save_model, write_atomic
    from ..onnx_io.files import check_output_paths
    from .api import quantize
    from .report import format_summary
    inputs = (model_path, calib, config_path, load_encodings, target)
    check_output_paths({"-o": output, "--encodings": encodings_path, "--report": report_path}, inputs,
                       models=(model_path,))
    res = quantize(model_path, calib, target=target, scheme=scheme, per_channel=per_channel,
                   weight_bits=weight_bits, act_bits=act_bits, config=config_path, load_encodings=load_encodings,
                   limit=limit, weight_block=block_size, min_sqnr=min_sqnr)
    save_model(res.model, output, protect=inputs)
    if encodings_path:
        res.write_encodings(encodings_path, encodings_version, protect=inputs)
    if report_path:
        write_atomic(report_path, json.dumps(res.report, indent=1, default=_plain) + "\n",
                     protect=inputs)
    click.echo(format_summary(res.report))
    _safety_net_line(res.report)
    click.echo(f"wrote {output}")
    _quality_gate(res.report, allow_low_sqnr)


def _safety_net_line(report: dict) -> None:
    sn = report.get("safety_net") or {}
    if sn.get("triggered"):
        acts = [c["action"] for c in sn.get("changed", ())]
        click.echo(f"  safety net: output SQNR {sn.get('sqnr_before_db')} dB -> {sn.get('sqnr_after_db')} dB, "
                   f"{acts.count('widened')} quantizers widened to 16 bits and {acts.count('float')} left float "
                   f"({sn.get('trials')} trials, {sn.get('seconds')} s; see report 'safety_net')"
                   + (f"; {sn['note']}" if sn.get("note") else ""))


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
