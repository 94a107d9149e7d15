"""`quantize(...)`: float ONNX model + calibration data in, QDQ model + encodings + report out.

This module checks the arguments, loads the model (a private copy), makes the QuantContext (settings, profile,
output opset, samples) and runs the quantization pipeline (qcompiler/quant/core/pipeline.py: every step a registered
pass in passes/quantize/), then builds the report from the context. The report has per-output SQNR and max abs
error on the calibration samples (their float outputs are kept during calibration, up to
report.SQNR_MAX_SAMPLES samples / SQNR_KEEP_BYTES bytes).
"""
from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional, Sequence, Union

import onnx

from qcompiler.arguments import got, require_path
from qcompiler.errors import ArgumentError
from qcompiler.input_files import MAX_PATH_CHARS
from qcompiler.ir.model import Model
from qcompiler.onnx_io import load_model, model_from_proto, model_to_proto, save_model
from qcompiler.onnx_io.safe_write import model_input_files
from qcompiler.ort_session import model_label
from qcompiler.passmanager.instrumentation import Timing
from qcompiler.progress import bar
from qcompiler.quant.calibration.calibrate import clipped_fractions
from qcompiler.quant.calibration.data import input_specs, load_samples
from qcompiler.quant.calibration.observers import CLIP_WARN_FRACTION
from qcompiler.quant.core.context import Outcome, QuantContext, QuantSettings
from qcompiler.quant.core.float16 import check_bfloat16
from qcompiler.quant.core.opset import choose_opset
from qcompiler.quant.core.pipeline import (
    DEFAULT_PIPELINE,
    pipeline_for,
    quantization_manager,
    run_quantization,
)
from qcompiler.quant.core.schemes import DEFAULT_SCHEME, canonical_scheme
from qcompiler.quant.core.switches import BY_NAME, OPTIMIZE, api_doc, check_switches
from qcompiler.quant.interop.encodings_io import write_encodings
from qcompiler.quant.interop.report import (
    build_report,
    format_summary,
    output_error_fields,
    pass_stats,
    report_fields,
)
from qcompiler.quant.interop.verdict import integer_share
from qcompiler.quant.placement import PlacementOptions
from qcompiler.quant.settings.config import load_config
from qcompiler.quant.settings.selection import (
    Selection,
    check_unmatched,
    config_with_rules,
    selection_rules,
    unmatched_config_rules,
    warning,
)
from qcompiler.quant.targets.profiles import get_profile
from qcompiler.shorten import short_text

if TYPE_CHECKING:
    from qcompiler.quant.settings.config import QuantConfig

__all__ = ["quantize", "QuantizeResult", "DEFAULT_PIPELINE", "OPTIMIZE", "ModelSource", "CalibSource"]

# what `quantize` reads: a model file, an onnx.ModelProto or a qcompiler Model (never changed: a private copy)
ModelSource = Union[str, os.PathLike, onnx.ModelProto, Model]
# calibration data: an .npz/.npy path or a folder of them, feed dicts, or a reader with get_next() (onnxruntime's
# CalibrationDataReader); None only for weight-only quantization
CalibSource = Union[str, os.PathLike, Iterable[Mapping[str, Any]], Any, None]


@dataclass(repr=False)
class QuantizeResult:
    """What `quantize()` returns: the QDQ model (IR), its encodings `{"activations": {...}, "params": {...}}`,
    the report (a JSON-ready dict: counts, per-output SQNR, what stayed float and why, notes, warnings) and
    the pipeline's passes with their results. `print(result)` shows a few lines; `result.report` holds the rest.
    """

    model: Model
    encodings: dict
    report: dict
    stats: dict = field(default_factory=dict)
    plan: object = None
    passes: list = field(default_factory=list)   # [(pass, PassResult)] in pipeline order

    def __repr__(self) -> str:
        c, sqnr = self.report.get("counts", {}), self.report.get("output_sqnr_db", {})
        shown = ", ".join(f"{short_text(n, 40)}: {v} dB" for n, v in list(sqnr.items())[:4])
        more = ", ..." if len(sqnr) > 4 else ""
        return (f"<QuantizeResult target={self.report.get('target')} activations={c.get('activations', 0)} "
                f"params={c.get('params', 0)} left_float={c.get('left_float', 0)} output SQNR {{{shown}{more}}}>")

    def __str__(self) -> str:
        try:
            return format_summary(self.report)
        except (KeyError, TypeError, ValueError):   # a report an expert's pipeline left partial
            return repr(self)

    def save(self, path: str, external_data: Optional[bool] = None, protect: tuple = ()) -> None:
        """Write the QDQ model atomically; never over the float model it came from, its external data, or a file
        in `protect` (see `save_model`)."""
        save_model(self.model, path, external_data=external_data, protect=protect)

    def encodings_document(self, version: str = "1.0.0") -> dict:
        """The AIMET encodings document (`version` "1.0.0" or "2.0.0") as a dict, without writing it."""
        return self._encodings(None, version, ())

    def write_encodings(self, path: Optional[str], version: str = "1.0.0", protect: tuple = ()) -> Optional[dict]:
        """Write the AIMET encodings file atomically to `path`, never over the float model it came from, its
        external data, or a file in `protect`. (`path=None` returns the document instead, as
        `encodings_document` does.)"""
        if path is None:
            return self.encodings_document(version)
        self._encodings(path, version, tuple(protect) + tuple(model_input_files(self.model)))
        return None

    def _encodings(self, path: Optional[str], version: str, protect: tuple) -> dict:
        args = self.report.get("quantizer_args", {})
        return write_encodings(path, self.encodings["activations"], self.encodings["params"], version=version,
                               quantizer_args=args, excluded_layers=sorted(self.report["left_float"]),
                               protect=protect)


def _load(model_or_path):
    if isinstance(model_or_path, (str, os.PathLike)):
        return load_model(os.fspath(model_or_path))
    if hasattr(model_or_path, "SerializeToString"):
        return model_from_proto(model_or_path)
    # an IR Model: work on a private copy, the caller's model stays float
    m = model_from_proto(model_to_proto(model_or_path))
    m.base_dir = getattr(model_or_path, "base_dir", None)
    m.source_path = getattr(model_or_path, "source_path", None)   # the file save_model must never write over
    return m


def quantize(model_or_path: ModelSource, calib: CalibSource, target: Union[str, dict, None] = None,
             scheme: Optional[str] = None, per_channel: Optional[bool] = None,
             weight_bits: int = 8, act_bits: int = 8, config: Union[str, os.PathLike, "QuantConfig", None] = None,
             load_encodings: Union[str, os.PathLike, None] = None,
             progress: Optional[bool] = None, limit: Optional[int] = None,
             bias_correction: bool = False, weight_block: Optional[int] = None,
             min_sqnr: Optional[float] = None, exclude: Optional[Sequence[str]] = None,
             op_types: Optional[Sequence[str]] = None, nodes: Optional[Sequence[str]] = None,
             act_symmetric: Optional[bool] = None, weight_symmetric: Optional[bool] = None,
             recipe: Union[str, Sequence[str], None] = None, pipeline: Union[str, Sequence, None] = None,
             opset: Optional[int] = None, measure_latency: bool = False,
             optimize: str = "balanced", latency_budget_db: Optional[float] = None, untaken_branches: str = "float",
             smoothquant_alpha: Optional[float] = None, max_drop: Union[float, str, None] = None,
             metric: Optional[Callable] = None, ray: Optional[str] = None,
             executor: Optional[Any] = None, weight_only: bool = False, head_bits: Optional[int] = None,
             accuracy_level: Optional[int] = None,
             report_samples: Optional[int] = None, instrumentations: Iterable = ()) -> QuantizeResult:
    """Quantize a float model to QDQ ONNX.

    `calib`: an .npz path (one key per graph input, samples along axis 0; see qcompiler.quant.calibration.data for the
    batch-dim rule), an .npy path (single-input model), a folder of them, an iterable of feed dicts, or an object
    with `get_next()` (onnxruntime's CalibrationDataReader; read once, its len() is never asked); `config`: a
    path, a built-in preset's name (qcompiler/quant/settings/presets: `w8a8`) or a QuantConfig. `target`: None means the
    config's `target`, else ort_cpu (as the CLI).
    `instrumentations`: passmanager instrumentations (Timing, PrintIR, DumpONNX, Verifier, ...) run around
    every pass. The other keywords are the switches of qcompiler/quant/core/switches.py, one entry each (listed
    below; `qcompiler quantize` has a flag for each). A selector, config rule or frozen encoding that matches
    nothing is listed in report['warnings']. The work is a pipeline of registered passes
    (qcompiler.quant.core.pipeline.DEFAULT_PIPELINE); a switch that asks for a pass adds it like a `recipe` entry.

    Errors (all subclasses of qcompiler.errors.QCompilerError, one line naming the file, argument or sample):
    ArgumentError for an argument of the wrong type or out of range (the switch table's checks); UnknownPassError /
    PipelineError for an unknown pass name or a pipeline whose order breaks a pass's `requires`; ModelLoadError /
    InvalidModelError for a model that cannot be read or is not a valid graph; OnnxRuntimeError when
    onnxruntime refuses the model (its reason); DataError for calibration data that does not fit the model or
    that onnxruntime cannot run (names the sample); ConfigError for a bad config, profile or encodings file.
    Anything else is a bug.

    """
    given = {k: v for k, v in locals().items() if k in BY_NAME}   # the switches, as the caller gave them
    s = resolve_early(check_switches(given), given)
    _check_inputs(model_or_path, calib, s["weight_only"])
    # the pipeline first: an unknown pass name or a broken order fails before the model is read
    pm = quantization_manager(pipeline_for(**s), instrumentations)
    sel = Selection(exclude=s["exclude"] or (), op_types=s["op_types"], nodes=s["nodes"],
                    act_symmetric=s["act_symmetric"], weight_symmetric=s["weight_symmetric"])
    # paths as str from here on (a bytes or Path model, data, config, profile or encodings path)
    model_or_path, calib = (os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else a
                            for a in (model_or_path, calib))
    for k in ("target", "config", "load_encodings"):
        if isinstance(s[k], (bytes, os.PathLike)):
            s[k] = os.fsdecode(s[k])
    with model_label(model_or_path if isinstance(model_or_path, (str, os.PathLike)) else ""):
        return _quantize(model_or_path, calib, pm, QuantSettings(**s, selection=sel))


if quantize.__doc__:    # (python -OO strips docstrings)
    quantize.__doc__ += api_doc() + "\n"


def resolve_early(s: dict, given: dict) -> dict:
    """The checked switches with the config read (a path or preset name becomes a QuantConfig): a config may
    ask for weight-only quantization, which decides the pipeline, so it is read before the pipeline is built."""
    if s["config"] is not None and not hasattr(s["config"], "settings_for"):
        s["config"] = load_config(os.fsdecode(s["config"]))
    if getattr(s["config"], "weight_only", None) and "weight_only" not in _explicit(given):
        s["weight_only"] = True
    return s


def _explicit(given: dict) -> set:
    """The switches the caller set to something other than their default."""
    return {k for k, v in given.items() if v is not BY_NAME[k].default and v != BY_NAME[k].default}


def _check_inputs(model_or_path, calib, weight_only: bool = False) -> None:
    """The model and the data arguments of `quantize`, by type, before any work: one ArgumentError line.
    Weight-only quantization may go without calibration data (round-to-nearest needs none)."""
    if isinstance(model_or_path, bytes) and (b"\x00" in model_or_path or len(model_or_path) > MAX_PATH_CHARS):
        raise ArgumentError(f"model is {len(model_or_path)} bytes, and bytes are read as a file path; for a "
                            f"serialized model pass onnx.load_model_from_string(data)")
    if isinstance(model_or_path, (str, bytes, os.PathLike)):
        require_path(model_or_path, "model")
    elif not isinstance(model_or_path, (onnx.ModelProto, Model)):
        raise ArgumentError(f"model must be a path, an onnx.ModelProto or a qcompiler Model, got {got(model_or_path)}")
    if calib is None and weight_only:
        return
    if calib is None:
        raise ArgumentError("calib must be given (an .npz/.npy path, a folder, an iterable of feed dicts or a "
                            "reader); only weight-only quantization (weight_only=True) goes without it")
    if isinstance(calib, (str, bytes, os.PathLike)):
        require_path(calib, "calib")
    elif isinstance(calib, dict) or not (hasattr(calib, "__iter__") or callable(getattr(calib, "get_next", None))):
        hint = " (a single feed dict: wrap it in a list)" if isinstance(calib, dict) else ""
        raise ArgumentError(f"calib must be an .npz/.npy path, a folder, an iterable of feed dicts or a reader "
                            f"with get_next(), got {got(calib)}{hint}")


def _apply_selection(model, config, sel, profile, per_channel, weight_bits, act_bits, weight_block):
    """The config placement reads: the caller's (or one holding the arguments) plus the selection's rules and
    the symmetry overrides; warnings for what matches nothing go to `sel.warnings`."""
    rules = selection_rules(model, sel, len(config.rules) if config is not None else 0,
                            profile.fused_activations, profile.shares_input_encoding) \
        if not sel.empty else []
    sym = {k: v for k, v in (("act_symmetric", sel.act_symmetric), ("weight_symmetric", sel.weight_symmetric))
           if v is not None}
    if not rules and not sym:
        return config
    defaults = {"act_bits": act_bits, "weight_bits": weight_bits, "weight_per_channel": per_channel,
                "weight_block": weight_block,
                "act_symmetric": bool(profile.activation.symmetric),
                "weight_symmetric": bool(profile.weight.symmetric)}
    defaults.update(sym)
    return config_with_rules(config, rules, defaults, sym)


def _context(model_or_path, calib, s: QuantSettings) -> QuantContext:
    """Resolve the settings (config file, target, scheme), load the model and make the context: the profile,
    the output opset (decided here, once) and the calibration samples (read lazily by `calibrate`)."""
    if s.config is not None and not hasattr(s.config, "settings_for"):
        s.config = load_config(os.fspath(s.config))
    cfg = s.config
    aimet_on_default = s.target is None and cfg is not None and cfg.format == "aimet" and not cfg.target
    if s.target is None:
        s.target = cfg.target if cfg is not None and cfg.target else "ort_cpu"
    profile = get_profile(s.target)
    if s.scheme is None:
        s.scheme = cfg.scheme if cfg is not None and cfg.scheme else DEFAULT_SCHEME
    s.scheme = canonical_scheme(s.scheme)
    with bar("loading", 1, s.progress) as loading:
        model = _load(model_or_path)
        loading.update(1)
    check_bfloat16(model)   # onnxruntime CPU runs no bfloat16 MatMul/Conv: say so in the one line (qcompiler/quant/core/float16.py)
    sel = s.selection
    check_unmatched(model, sel)     # on the model as loaded: naming a node fold-batchnorm removes is no warning
    sel.warnings.extend(unmatched_config_rules(model, cfg))
    if aimet_on_default:
        sel.warnings.append(warning(
            "config", os.path.basename(cfg.source),
            f"is an AIMET quantsim config: on the default target ({s.target}) quantizers no integer kernel "
            f"reads are left out; --target aimet (or qnn_htp) applies it as AIMET does"))
    if s.weight_only:
        opset, fallback = _weight_only_opset(s, profile, model.opset), None
    else:
        opset, fallback = choose_opset(s, profile, model.opset)
    if s.max_drop is not None and not s.weight_only and s.opset is None and opset < 21:   # int4/int16 candidates (mixed_precision)
        opset, fallback = 21, opset
    ctx = QuantContext(model=model, settings=s, profile=profile, opset=opset, opset_fallback=fallback,
                       source=model_or_path)
    ctx.samples = None if calib is None else load_samples(calib, input_specs(model.graph), limit=s.limit)
    if s.weight_only and ctx.samples is not None and not isinstance(calib, (str, os.PathLike)):
        # weight-only passes read the samples several times (reference, GPTQ/AWQ chunks): an API iterator
        # can be read once, so its first samples are kept
        kept = list(itertools.islice(iter(ctx.samples), s.limit or WEIGHT_ONLY_MAX_SAMPLES))
        ctx.samples = load_samples(kept, input_specs(model.graph))
    if s.per_channel is None and not s.weight_only:   # weight-only reads None as "blocks" (plan-weights)
        s.per_channel = True
    per_channel = s.per_channel is not False
    config = _apply_selection(model, cfg, sel, profile, per_channel, s.weight_bits, s.act_bits, s.weight_block)
    ctx.options = PlacementOptions(per_channel=per_channel, weight_bits=s.weight_bits, act_bits=s.act_bits,
                                   config=config, supergroups=_supergroup_choice(config),
                                   weight_block=s.weight_block, act_symmetric=sel.act_symmetric,
                                   weight_symmetric=sel.weight_symmetric, optimize=s.optimize)
    return ctx


WEIGHT_ONLY_MAX_SAMPLES = 128   # samples an API iterator gives weight-only quantization (it reads them again)


def _weight_only_opset(s, profile, model_opset: int) -> int:
    """Weight-only needs no opset change for MatMulNBits (com.microsoft); a blocked DequantizeLinear needs 21."""
    if s.opset is not None:
        return s.opset
    form = profile.weight_only
    if form is None or form.matmul == "MatMulNBits":
        return model_opset
    return max(21, model_opset)


def _quantize(model_or_path, calib, pm, s: QuantSettings) -> QuantizeResult:
    t_start = time.perf_counter()
    ctx = _context(model_or_path, calib, s)
    seconds = {"load": time.perf_counter() - t_start}
    # NOTE: added last: its before_pass runs after, and its after_pass before, every other hook (hooks unwind
    # like a stack), so a verifier's onnxruntime runs are not counted in the report's seconds
    timing = Timing()
    pm.add_instrumentation(timing)
    results = run_quantization(ctx, pm)
    for name, t in timing.rows:
        seconds[name] = seconds.get(name, 0.0) + t
    seconds["total"] = time.perf_counter() - t_start
    # how the data was read (float64 converted, an unnamed member read as the input, a batch dim added)
    ctx.notes.extend(n for n in getattr(ctx.samples, "notes", ()) if n not in ctx.notes)
    # a loaded file's FLOAT entries have no quantizer; the encodings (and a file written from them) keep them
    encodings = {k: {**getattr(ctx, k), **ctx.float_encodings[k]} if ctx.float_encodings.get(k) else getattr(ctx, k)
                 for k in ("activations", "params")}
    report = _report(ctx, seconds, [p.name for p, _ in results])
    report["passes"] = pass_stats(results, timing.rows)
    return QuantizeResult(model=ctx.model, encodings=encodings, report=report, stats=_stats(ctx), plan=ctx.plan,
                          passes=results)


def _clip_warnings(ctx, report: dict) -> list:
    """Activations whose grid leaves out more than observers.CLIP_WARN_FRACTION of the range calibration saw
    (a clipping scheme cut a ReLU output to a fifth of its range): listed in report['clipped'], and a warning
    each, since values beyond the grid saturate."""
    if ctx.calibration is None or not ctx.activations:
        return []
    fractions = clipped_fractions(ctx.calibration, ctx.activations)
    report["clipped"] = {n: round(f, 3) for n, f in sorted(fractions.items(), key=lambda t: -t[1]) if f > 0}
    return [warning("activation", n, f"has {100 * f:.0f}% of its observed range outside its {ctx.settings.scheme} "
                                     f"grid (values there saturate; --scheme min_max keeps the whole range)")
            for n, f in report["clipped"].items() if f > CLIP_WARN_FRACTION]


def _stats(ctx) -> dict:
    cal = ctx.calibration
    if cal is None:
        return {}
    return {"calibration_seconds": cal.seconds, "samples": cal.samples, "observed_values": len(cal.observers)}


def _report(ctx, seconds: dict, ran: list) -> dict:
    """The report from the context; a pipeline without a plan or calibration (an expert's `--pipeline`) gets
    the fields it can have."""
    s, cal, plan = ctx.settings, ctx.calibration, ctx.plan
    if plan is None or cal is None:
        report = {"target": s.target if isinstance(s.target, str) else ctx.profile.name,
                  "scheme": s.scheme, "pipeline": ran, "notes": list(ctx.notes),
                  "seconds": {k: round(v, 3) for k, v in seconds.items()},
                  "output_sqnr_db": {}, "left_float": {}, "counts": {"activations": 0, "params": 0, "left_float": 0, "widened": 0}}
    else:
        report = build_report(plan, ctx.activations, ctx.params, cal, seconds,
                              s.target if isinstance(s.target, str) else ctx.profile.name,
                              s.scheme, ctx.notes, errors=ctx.errors, layers=ctx.layers)
        report["pipeline"] = ran
    if ctx.weight_plan is not None:
        _weight_only_report(report, ctx)
    if ctx.narrow_weights is not None:
        report["narrow_float_weights"] = ctx.narrow_weights.summary()
        readers = {r for j in ctx.narrow_weights.jobs.values() for r, _ in j.readers}
        report["left_float"] = {k: v for k, v in report["left_float"].items()
                                if k.split(":input")[0] not in readers and k not in ctx.narrow_weights.jobs}
        report["counts"]["left_float"] = len(report["left_float"])
    net = ctx.safety_net if ctx.safety_net is not None else Outcome()
    report_fields(report, net, s.min_sqnr, seconds.get("safety-net", 0.0))
    report["warnings"] = list(ctx.warnings) + _clip_warnings(ctx, report)
    report["prefolded_params"] = ctx.prefolded
    if ctx.latency_search is not None:
        report["latency_search"] = ctx.latency_search
    if ctx.latency is not None:
        report["latency"], report["kernels"] = ctx.latency, ctx.kernels
    report["optimize"] = s.optimize
    if plan is not None:
        report["kernel_share"] = integer_share(plan, ctx.model, ctx.profile.fusions,
                                               ctx.kernels["nodes"] if ctx.kernels else None)
    if ctx.smoothquant is not None:
        report["smoothquant"] = ctx.smoothquant
    if ctx.mixed_precision is not None:
        report["mixed_precision"] = ctx.mixed_precision
    report["quantizer_args"] = {"activation_bitwidth": s.act_bits, "param_bitwidth": s.weight_bits,
                                "dtype": "int", "is_symmetric": bool(ctx.profile.weight.symmetric),
                                "per_channel_quantization": s.per_channel is not False, "quant_scheme": s.scheme}
    return report


def _weight_only_report(report: dict, ctx) -> None:
    """The weight-only run's fields: its plan's summary (no per-block scales: those go to the encodings file),
    what stays float, and each output's SQNR against float on the reference samples."""
    plan = ctx.weight_plan
    report["weight_only"] = plan.summary()
    report["left_float"] = {name: f"weight: {why}" for name, why in plan.left_float.items()}
    report.update(output_error_fields(ctx.errors))
    report["sqnr_samples"] = len(ctx.reference or ())
    report["counts"] = {"activations": 0, "params": len(plan.jobs), "left_float": len(plan.left_float),
                        "widened": 0}


def _supergroup_choice(config):
    if config is None:
        return True
    sg = getattr(config, "supergroups", True)
    if isinstance(sg, (list, tuple)):
        names = [s for s in sg if isinstance(s, str)]
        return tuple(names) if names else True
    return bool(sg)
