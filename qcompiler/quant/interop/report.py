"""The quantization report: every quantized value's encoding, per-output SQNR against float, and every value left
float with its reason (field notes §1 and §6 ask that nothing is left float silently)."""
from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional

import numpy as np

from qcompiler.errors import OnnxRuntimeError, ProducedModelError
from qcompiler.progress import bar
from qcompiler.quant.calibration.calibrate import make_session
from qcompiler.quant.core.encoding import Encoding, per_tensor, scalar
from qcompiler.quant.interop.verdict import verdict_line
from qcompiler.quant.placement import weight_nodes
from qcompiler.shorten import short_text
from qcompiler.sqnr import db_from_powers, powers


REPORT_MAX_LIST = 256   # a per-channel/per-block encoding with more scales is summarised in the report (the
#                         encodings file holds every one): a decoder's per-block scales made a 524 MB report


def encoding_summary(enc: Encoding) -> dict:
    """A JSON-friendly view of an encoding (scalars per tensor, lists per channel). Per-tensor fields may hold
    one number in any shape numpy gives it ((), (1,), (1, 1), a numpy scalar): `scalar` reads them all. Over
    REPORT_MAX_LIST scales (per block), `scale`/`zero_point` become a summary: count, min, max, mean."""
    if per_tensor(enc):
        d = {"bits": int(enc.bits), "signed": bool(enc.signed), "symmetric": bool(enc.symmetric),
             "scale": float(scalar(enc.scale, "scale")), "zero_point": int(scalar(enc.zero_point, "zero point")),
             "min": float(scalar(enc.min, "min")), "max": float(scalar(enc.max, "max"))}
    else:
        scale, zp = np.asarray(enc.scale, np.float64), np.asarray(enc.zero_point)
        if scale.size > REPORT_MAX_LIST:
            d = {"bits": int(enc.bits), "signed": bool(enc.signed), "symmetric": bool(enc.symmetric),
                 "scale": _summary(scale), "zero_point": _summary(zp), "axis": int(enc.axis)}
        else:
            d = {"bits": int(enc.bits), "signed": bool(enc.signed), "symmetric": bool(enc.symmetric),
                 "scale": scale.tolist(), "zero_point": zp.tolist(), "axis": int(enc.axis)}
        if enc.block_size:
            d["block_size"] = int(enc.block_size)
        lo, hi = np.asarray(enc.min, np.float64), np.asarray(enc.max, np.float64)
        d["min"], d["max"] = float(lo.min()), float(hi.max())
    if enc.meta.get("range_bits"):
        d["range_bits"] = int(enc.meta["range_bits"])
    if enc.frozen:
        d["frozen"] = True
    return d


def _summary(a: np.ndarray) -> dict:
    a = np.asarray(a, np.float64)
    return {"count": int(a.size), "min": float(a.min()), "max": float(a.max()), "mean": float(a.mean()),
            "summarised": True}


SQNR_MAX_SAMPLES = 256          # the report's SQNR uses at most this many calibration samples
SQNR_KEEP_BYTES = 256 << 20     # ... and keeps at most this many bytes of their feeds and float outputs


class OutputError:
    """Streaming error of one graph output: Σref², Σ(ref-q)², max|ref-q| (float64), never the arrays."""

    __slots__ = ("signal", "noise", "max_abs", "count")

    def __init__(self):
        self.signal = self.noise = self.max_abs = 0.0
        self.count = 0

    def update(self, ref, got, feed=None) -> None:
        """Add one sample. With its `feed`, an output laid out [batch, sequence, ...] under a 0/1 attention
        mask input of shape [batch, sequence] is compared on the positions the mask keeps (`valid_positions`)."""
        keep = valid_positions(feed, ref) if feed is not None else None
        if keep is not None:
            ref, got = np.asarray(ref)[keep], np.asarray(got)[keep]
        signal, noise = powers(ref, got)
        self.signal += signal
        self.noise += noise
        with np.errstate(all="ignore"):   # inf - inf (a model whose outputs overflow): no RuntimeWarning lines
            d = np.asarray(ref, np.float64).reshape(-1) - np.asarray(got, np.float64).reshape(-1)
            if d.size:
                self.max_abs = max(self.max_abs, float(np.abs(d).max()))
        self.count += 1

    def sqnr_db(self) -> float:
        return db_from_powers(self.signal, self.noise)


def valid_positions(feed: dict, ref):
    """The boolean [batch, sequence] selector of an attention mask in `feed` that fits output `ref`, or None.

    A padded position's output is not read by anything downstream (a tokenizer's padding: the encoder's
    last_hidden_state rows under attention_mask 0, which every reader pools or slices away), yet its error
    counted alike: minilm_l6 W8A8's last_hidden_state read 6.8 dB over all positions against 20.3 dB over the
    valid ones, and the quality gate failed a model whose sentence embeddings kept cosine 0.996. The mask is a
    graph input whose name says mask, of integer or bool type, rank 2, holding only 0 and 1 with at least one
    1; the output must start with the mask's two dims. Anything else: None (every position counts)."""
    ref = np.asarray(ref)
    if ref.ndim < 2:
        return None
    for name, m in feed.items():
        if "mask" not in name.lower():
            continue
        m = np.asarray(m)
        if m.ndim != 2 or m.shape != ref.shape[:2] or not (m.dtype == bool or np.issubdtype(m.dtype, np.integer)):
            continue
        keep = m != 0
        if keep.all() or not keep.any() or not np.isin(m, (0, 1)).all():
            continue
        return keep
    return None


def output_errors(quant_model, kept: list, progress=False, refusals: Optional[list] = None) -> Dict[str, OutputError]:
    """Per float graph output, the quantized model's error against the float outputs kept during calibration.

    `quant_model`: the quantized IR model (or a ModelProto). The float references come from the calibration
    pass itself (no second float run); only the quantized model runs here, and each sample's error is reduced
    into sums as it arrives. Two single-threaded runs in flight beat one run on two intra-op threads (minilm,
    64 samples: 3.4 s vs 7.1 s on a busy 2-core box). When onnxruntime's default session options fail on the
    model (one of its graph fusions), it is measured at ORT_ENABLE_BASIC and, given a `refusals` list, the
    failure's first line is appended to it.
    """
    if not kept:
        return {}
    sess = None
    try:
        sess = make_session(quant_model, threads=1, role="quantized")
        return _output_errors(sess, kept, progress)
    except Exception as e:   # noqa: BLE001 - onnxruntime's own fusions can fail where the plain QDQ graph runs
        if refusals is not None:   # a user's default session would fail the same way: the caller says so
            refusals.append((str(e).splitlines() or [type(e).__name__])[0][:160])
    # NOTE: the failed session is dropped before the second one is built (outside the except block, whose
    # traceback would keep it alive): two sessions at once doubled the model in memory
    sess = None
    import onnxruntime as ort
    # NOTE: ORT 1.31 fuses int8 blocked DQ->MatMul into QLinearMatMul, which rejects block scales at run
    # time (other runtimes take the QDQ graph as is): measure the QDQ graph without those fusions
    try:
        sess = make_session(quant_model, threads=1, role="quantized",
                            opt_level=ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    except OnnxRuntimeError as e:   # the input ran in calibration: a model we made that onnxruntime refuses is ours
        raise ProducedModelError(f"{e} (a bug in qcompiler: the float model ran, the quantized one it made does not)"
                                 ) from None
    return _output_errors(sess, kept, progress)


def _output_errors(sess, kept: list, progress=False) -> Dict[str, OutputError]:
    names = [o.name for o in sess.get_outputs()]
    errs: Dict[str, OutputError] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1))) as pool, \
            bar("report pass", len(kept), progress, unit="sample") as b:
        runs = pool.map(lambda item: sess.run(names, item[0]), kept)
        for (feed, ref), outs in zip(kept, runs):
            for n, a in zip(names, outs):
                r = ref.get(n)
                if r is not None and np.issubdtype(np.asarray(r).dtype, np.floating):
                    errs.setdefault(n, OutputError()).update(r, a, feed)
            b.update(1)
    return errs


def output_error_fields(errors) -> dict:
    """The report's `output_sqnr_db` (2 decimals, +-inf kept) and `output_max_abs_error` of output_errors()."""
    errors = errors or {}
    sqnr = {n: e.sqnr_db() for n, e in errors.items()}
    return {"output_sqnr_db": {k: (round(v, 2) if np.isfinite(v) else v) for k, v in sqnr.items()},
            "output_max_abs_error": {n: float(f"{e.max_abs:.4g}") for n, e in errors.items()}}


def build_report(plan, activations: Dict[str, Encoding], params: Dict[str, Encoding], calib, timings: dict,
                 target: str, scheme: str, notes=(), errors=None, layers=None) -> dict:
    """The report dict (JSON-serialisable). `errors`: output_errors() (SQNR and max abs error per output);
    `layers`: per-node precision choices (mixed precision, field notes §5)."""
    floats = plan.float_values()
    for (node, slot), spec in plan.uses.items():
        if spec.keep_float and spec.kind in ("weight", "bias"):
            reason = spec.reason or ""
            # a reason that already names the kind ("bias left float") is not prefixed again
            floats[f"{node}:input{slot}"] = reason if reason.startswith(spec.kind + " ") else f"{spec.kind}: {reason}"
    dtypes = plan.dtypes or calib.dtypes
    integers = sorted(n for n, dt in dtypes.items() if not np.issubdtype(dt, np.floating))
    return {
        "target": target, "scheme": scheme, "calibration_samples": calib.samples,
        **output_error_fields(errors),
        "sqnr_samples": len(calib.kept),
        "sqnr_samples_note": _sqnr_samples_note(len(calib.kept), calib.samples),
        "sqnr_masked_outputs": _masked_outputs(calib.kept),
        "layers": dict(layers or {}),
        "quantized_activations": {n: encoding_summary(e) for n, e in activations.items()},
        "quantized_params": {n: encoding_summary(e) for n, e in params.items()},
        "left_float": floats,
        "bodies": {b.key: b.reason for b in plan.bodies},   # every If/Loop/Scan body
        "widened": {n: f"{s.bits} bits: {s.widened}" for n, s in plan.values.items()
                    if s.widened and not s.keep_float},
        "integer_tensors_never_quantized": integers,
        "supergroups": [{"kind": s.kind, "nodes": s.nodes} for s in plan.supergroups
                        if "+" not in s.kind],
        "fused_pairs": sum(1 for s in plan.supergroups if "+" in s.kind),
        "tie_groups": [m for m in plan.tie_groups().values()],
        "counts": {"activations": len(activations), "params": len(params), "left_float": len(floats),
                   "widened": sum(1 for s in plan.values.values() if s.widened and not s.keep_float)},
        "seconds": {k: round(v, 3) for k, v in timings.items()},
        "notes": list(notes),
    }


def _masked_outputs(kept: list) -> list:
    """The outputs whose SQNR counts only the positions an attention mask keeps (valid_positions), on the first
    kept sample that has padding."""
    for feed, ref in kept or ():
        found = sorted(n for n, r in ref.items() if np.issubdtype(np.asarray(r).dtype, np.floating)
                       and valid_positions(feed, r) is not None)
        if found:
            return found
    return []


PASS_STATS_MAX_ITEMS = 50      # a pass's list or mapping in report['passes'] keeps at most this many entries


def pass_stats(results, rows) -> list:
    """report['passes']: per pass run, in pipeline order, its name, wall seconds (`rows`: Timing.rows), whether it
    changed the model and its counters (PassResult.stats: what it changed, what it kept and why; the same
    numbers `--stats` prints), made JSON-friendly and bounded (PASS_STATS_MAX_ITEMS entries per list or mapping).
    A pass that leaves some nodes alone names them by op type with the reason in `skipped_op_types`."""
    out = []
    for (p, r), (_, seconds) in zip(results, rows):
        out.append({"name": p.name, "seconds": round(seconds, 3), "modified": bool(r.modified),
                    "stats": _bounded(r.stats)})
    return out


def _bounded(o, depth: int = 0):
    """A JSON-friendly copy of a pass's stats: numbers, strings, lists and mappings (long ones cut, the cut
    counted), anything else as a short string."""
    if isinstance(o, (bool, int, str)) or o is None:
        return o
    if isinstance(o, float):
        return round(o, 6)
    if hasattr(o, "item") and not isinstance(o, (list, tuple, dict)):
        try:
            return _bounded(o.item(), depth)
        except (AttributeError, ValueError, TypeError):
            pass
    if depth > 3:
        return str(o)[:80]
    if isinstance(o, dict):
        items = list(o.items())
        d = {str(k)[:80]: _bounded(v, depth + 1) for k, v in items[:PASS_STATS_MAX_ITEMS]}
        if len(items) > PASS_STATS_MAX_ITEMS:
            d["..."] = f"{len(items) - PASS_STATS_MAX_ITEMS} more"
        return d
    if isinstance(o, (list, tuple, set, frozenset)):
        items = list(o)
        out = [_bounded(v, depth + 1) for v in items[:PASS_STATS_MAX_ITEMS]]
        if len(items) > PASS_STATS_MAX_ITEMS:
            out.append(f"... {len(items) - PASS_STATS_MAX_ITEMS} more")
        return out
    return str(o)[:80]


def skipped_op_types(model, plan, handled_ops, what: str) -> Dict[str, str]:
    """{op type: why, with how many}: the nodes with a quantized weight that a pass handling only `handled_ops`
    in the main graph leaves with their assigned grids (`what`: the pass's name, for the reason), e.g.
    {"Conv": "3 nodes: seq-mse handles MatMul, Gemm only; their weights keep the assigned grids"}.
    Nodes inside If/Loop/Scan bodies are counted under "<op type> in bodies"."""
    main = {id(n) for n in model.graph.nodes}
    counts: Dict[str, int] = {}
    for g in model.graph.all_graphs():
        for n in g.nodes:
            spec = plan.uses.get((n.name, 1))
            if spec is None or spec.kind != "weight" or spec.keep_float or spec.encoding is None:
                continue
            if id(n) in main and n.op_type in handled_ops:
                continue
            key = n.op_type if id(n) in main else f"{n.op_type} in bodies"
            counts[key] = counts.get(key, 0) + 1
    out = {}
    for key, k in sorted(counts.items()):
        why = (f"{what} does not reach into If/Loop/Scan bodies" if key.endswith(" in bodies")
               else f"{what} handles {', '.join(handled_ops)} only")
        out[key] = f"{k} node{'s' if k > 1 else ''}: {why}; their weights keep the assigned grids"
    return out


def _grid(enc: Encoding) -> str:
    kind = f"{'int' if enc.signed else 'uint'}{enc.bits}"
    if enc.block_size:
        return f"{kind} per-block {enc.block_size} (axis {enc.axis})"
    return f"{kind} per-channel (axis {enc.axis})" if enc.per_channel else f"{kind} per-tensor"


def layer_choices(model, plan, config=None) -> Dict[str, dict]:
    """Per node with weights or a matching config rule: its weight grid, output grid and precision, so a mixed
    precision plan (field notes §5: W4A8 here, W8A16 there, a float BatchNorm) reads back node by node.
    Call after encodings are assigned and before QDQ insertion (names are the float model's)."""
    out: Dict[str, dict] = {}
    for n in weight_nodes(model.graph):     # If/Loop/Scan body nodes too (their weights are quantized)
        settings = config.settings_for(n) if config is not None else None
        rules = list(getattr(settings, "matched_rules", ()))
        weights = {slot: s for (name, slot), s in plan.uses.items() if name == n.name and s.kind == "weight"}
        if not weights and not rules:
            continue
        d: dict = {}
        for slot, s in sorted(weights.items()):
            what = f"float ({s.reason})" if s.keep_float or s.encoding is None else _grid(s.encoding)
            if ";" in s.source:
                what += f" [{s.source.split(';', 1)[1].strip()}]"
            d[f"input{slot}"] = what
        outs = []
        for v in n.outputs:
            s = plan.values.get(v.name) if v is not None else None
            if s is None:
                continue
            outs.append(f"float ({s.reason})" if s.keep_float or s.encoding is None else _grid(s.encoding))
        if outs:
            d["outputs"] = outs if len(outs) > 1 else outs[0]
        if settings is not None:
            d["precision"] = settings.precision
        if rules:
            d["config_rules"] = rules
        out[n.name] = d
    return out


def _sqnr_samples_note(used: int, total: int) -> str:
    if used >= total:
        return f"all {total} calibration samples"
    return (f"first {used} of {total} calibration samples (bounded: at most {SQNR_MAX_SAMPLES} samples and "
            f"{SQNR_KEEP_BYTES >> 20} MB of kept float outputs)")


def _values_named(names: list, show: int = 3) -> str:
    """The values a summary line speaks of: `'x'` for one, `x5 ('a', 'b', 'c', ...)` for more."""
    quoted = [f"'{short_text(n, 40)}'" for n in names[:show]]
    if len(names) == 1:
        return quoted[0]
    return f"x{len(names)} ({', '.join(quoted)}{', ...' if len(names) > show else ''})"


def format_summary(report: dict) -> str:
    """A few human lines for the CLI."""
    c = report["counts"]
    wo = report.get("weight_only")
    if wo:
        mb = 1 << 20
        lines = [f"weight-only: {wo['weights']} weights stored narrow for {report['target']} "
                 f"({', '.join(f'{k} x{v}' for k, v in wo['algorithms'].items())}; {wo['form']['matmul']}"
                 f"{', ' + wo['form']['gather'] if wo['form']['gather'] else ''}): "
                 f"{wo['float_bytes_of_quantized'] / mb:.1f} MB of float weights -> {wo['stored_bytes'] / mb:.1f} MB; "
                 f"{c['left_float']} weights left float; activations float"]
        if wo["tied"]:
            lines.append(f"  tied embedding and head stored once: {', '.join(t[:60] for t in wo['tied'])}")
    else:
        lines = [f"quantized {c['activations']} activations and {c['params']} params for {report['target']} "
                 f"({report['scheme']}, {report.get('calibration_samples', 0)} samples); {c['left_float']} values "
                 f"left float"]
    if c.get("widened"):
        named = _values_named(list(report["widened"])) if report.get("widened") else f"x{c['widened']}"
        lines.append(f"  widened to 16 bits {named}: an 8-bit grid would give < 30 dB, or the safety net found them "
                     f"breaking the output (report 'widened' has each reason)")
    maxerr = report.get("output_max_abs_error", {})
    for n, s in report["output_sqnr_db"].items():
        extra = f", max |error| {maxerr[n]:.3g}" if n in maxerr else ""
        if n in report.get("sqnr_masked_outputs", ()):
            extra += ", positions the attention mask keeps"
        lines.append(f"  output '{n}': SQNR {s} dB{extra} ({report.get('sqnr_samples_note', '')})")
    reasons: Dict[str, list] = {}
    for name, r in report["left_float"].items():
        key = r.split(":")[0] if r.startswith("inside") else r     # whole: a cut reason reads as a different one
        reasons.setdefault(key, []).append(name)
    for r, names in sorted(reasons.items(), key=lambda t: -len(t[1]))[:8]:
        lines.append(f"  float {_values_named(names)}: {r}")
    for p in report.get("passes", ()):
        for op, why in (p["stats"].get("skipped_op_types") or {}).items():
            lines.append(f"  {p['name']} left alone {op}: {why}")
    if verdict_line(report):
        lines.append(verdict_line(report))
    lat, kern = report.get("latency"), report.get("kernels")
    if lat:
        lines.append(f"  latency: quantized {lat['quant_ms']:.3g} ms, float {lat['float_ms']:.3g} ms "
                     f"({lat['ratio']:.2f}x, {lat['clock']} clock, median of {lat['runs']}, interleaved); "
                     f"{kern['integer_nodes']} nodes on integer kernels, {kern['float_nodes']} float")
        for r, k in list(kern["float_reasons"].items())[:5]:
            lines.append(f"    float kernel x{k}: {r}")
    return "\n".join(lines)


def below_floor(report: dict, floor: float) -> List[dict]:
    """The outputs whose SQNR in `report` is below `floor` (what the quality gate reports)."""
    out = []
    for name, s in report.get("output_sqnr_db", {}).items():
        if isinstance(s, (int, float)) and s < floor:
            out.append({"output": name, "sqnr_db": s, "floor_db": floor})
    return out


def rounded_db(v: float):
    """A dB figure for JSON: 2 decimals, None for NaN, +-inf kept."""
    return round(v, 2) if np.isfinite(v) else (None if math.isnan(v) else v)


def report_fields(report: dict, outcome, floor: float, seconds: float) -> None:
    """Add the safety net's outcome and the quality gate's `below_floor` list to `report`."""
    report["min_sqnr_db"] = floor if np.isfinite(floor) else None   # None: no floor (-inf)
    sn = {"triggered": outcome.triggered, "seconds": round(seconds, 3)}
    if outcome.triggered:
        sn.update({"sqnr_before_db": rounded_db(outcome.before_db), "sqnr_after_db": rounded_db(outcome.after_db),
                   "trials": outcome.trials, "samples_per_trial": outcome.samples, "changed": outcome.changed})
        if outcome.note:
            sn["note"] = outcome.note
        sn.update({"summary": outcome.summary, "budget_runs": outcome.runs_budget, "runs": outcome.runs,
                   "budget_seconds": outcome.seconds_budget,
                   "executor": outcome.executor, "parallel_trials": outcome.parallel_trials,
                   "quantizer_search_db": None if outcome.quantizer_search_db is None
                   else rounded_db(outcome.quantizer_search_db), "tried": outcome.tried})
        report.setdefault("notes", []).append(
            f"safety net: output SQNR {outcome.before_db:.1f} dB below the floor {floor:g} dB; "
            f"{len(outcome.changed)} quantizers turned float or widened ({outcome.trials} trials), now "
            f"{outcome.after_db:.1f} dB" + (f" ({outcome.note})" if outcome.note else ""))
    report["safety_net"] = sn
    report["below_floor"] = below_floor(report, floor)
