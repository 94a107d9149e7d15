"""`quantize(...)`: float ONNX model + calibration data in, QDQ model + encodings + report out.

Steps: load (a private copy), prepare (constant-to-initializer so Constant-node weights are weights,
fold-batchnorm, canonicalize; opset raised to 13 for per-channel Q/DQ, to 21 for int16/int4), one streaming
calibration pass, placement into a QuantPlan, encodings (frozen ones from `load_encodings` win), QDQ
insertion, and a report with per-output SQNR and max abs error on the calibration samples (the float
outputs are kept during calibration, up to report.SQNR_MAX_SAMPLES samples / SQNR_KEEP_BYTES bytes).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..errors import ArgumentError, QCompilerError, UnknownPassError
from ..ir import verify
from ..onnx_io import load_model, model_from_proto, model_to_proto
from .calibrate import assign_encodings, calibrate
from .placement import PlacementOptions, build_plan, observed_names
from .profiles import get_profile
from .placement import decide_storage
from .float16 import apply_float16, float16_nodes
from .memory import release
from .qdq import apply_plan, assign_block_encodings, bias_correction_inputs, correct_biases
from .report import SQNR_KEEP_BYTES, SQNR_MAX_SAMPLES, build_report, layer_choices, output_errors

PREPARE_PASSES = ("constant-to-initializer", "fold-batchnorm", "simplify-shape-of", "canonicalize")
PER_CHANNEL_OPSET = 13   # DequantizeLinear `axis`
WIDE_INT_OPSET = 21      # int16/int4 QuantizeLinear in the standard domain (anchors B; ORT runs them)


@dataclass
class QuantizeResult:
    """The QDQ model (IR), its encodings `{"activations": {...}, "params": {...}}`, the report and stats."""

    model: object
    encodings: dict
    report: dict
    stats: dict = field(default_factory=dict)
    plan: object = None

    def save(self, path: str, external_data: Optional[bool] = None, protect: tuple = ()) -> None:
        """Write the QDQ model atomically; never over the float model it came from, its external data, or a file
        in `protect` (see `save_model`)."""
        from ..onnx_io import save_model
        save_model(self.model, path, external_data=external_data, protect=protect)

    def write_encodings(self, path: Optional[str], version: str = "1.0.0", protect: tuple = ()) -> dict:
        """The encodings document; written atomically to `path` when given, never over the float model it came
        from, its external data, or a file in `protect`."""
        from .encodings_io import write_encodings
        if path is not None:
            from ..onnx_io.safe_write import model_input_files
            protect = tuple(protect) + tuple(model_input_files(self.model))
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


def _prepare(model, notes: list) -> None:
    from ..passmanager import run_pipeline
    for name in PREPARE_PASSES:
        try:
            run_pipeline(model, name)
        except UnknownPassError:
            notes.append(f"pass '{name}' not available; skipped")


def _raise_opset(model, opset: int, notes: list):
    """A new model at `opset` (onnx's version converter), or the same model when already there."""
    if model.opset >= opset:
        return model
    from onnx import version_converter
    # NOTE: the converter copies the model several times over (minilm: +540 MB for 90 MB); its adapters read
    # no initializer data, so it gets the graph with large initializers as stubs (no data), and the new model
    # takes the old model's Tensor objects back: no copy of the weights is made at all
    proto = model_to_proto(model, stub_over=_STUB_BYTES)
    try:
        conv = version_converter.convert_version(proto, opset)
    except Exception as e:
        raise QCompilerError(f"cannot raise the model's opset {model.opset} to {opset} (needed for "
                             f"per-channel/int16 Q/DQ): {str(e).splitlines()[0][:200]}") from None
    del proto
    new = model_from_proto(conv, data_stubs=True)   # stubs: the weights are put back below
    del conv
    for name, v in model.graph.initializers.items():
        t = v.tensor
        if t.nbytes <= _STUB_BYTES:
            continue
        w = new.graph.initializers.get(name)
        if w is None or tuple(w.tensor.dims) != tuple(t.dims) or w.tensor.dtype != t.dtype:
            raise QCompilerError(f"raising the opset to {opset} changed initializer '{name}'; cannot restore it")
        w.tensor = t   # the stub's Tensor, replaced before anyone reads it (as the importer sets it)
    notes.append(f"opset raised from {model.opset} to {opset}")
    new.base_dir = model.base_dir
    new.source_path = getattr(model, "source_path", None)   # the file save_model must never write over
    return new


_STUB_BYTES = 4096   # initializers above this size go to the version converter without their data
COLLECT_OVER_BYTES = 16 << 20   # below this, a full gc (~15 ms) costs more than the replaced model holds


def _weight_bytes(model) -> int:
    return sum(v.tensor.nbytes for v in model.graph.initializers.values())


def _config_updates(cfg) -> list:
    """Every settings dict of a config: its defaults, its per-op-type entries and its rules' updates."""
    if cfg is None:
        return []
    return [vars(cfg.defaults)] + list(cfg.op_type.values()) + [r.updates for r in cfg.rules]


def _config_blocks(cfg) -> bool:
    """Does any config setting ask for per-block weights (DequantizeLinear block_size: opset 21)?"""
    return any(u.get("weight_block") for u in _config_updates(cfg))


def _config_bits(cfg) -> set:
    """Every activation or weight bit width a config setting asks for."""
    return {int(u[k]) for u in _config_updates(cfg) for k in ("act_bits", "weight_bits") if k in u}


def quantize(model_or_path, calib, target: str = "ort_cpu", scheme: Optional[str] = None, per_channel: bool = True,
             weight_bits: int = 8, act_bits: int = 8, config=None, load_encodings=None,
             progress: Optional[bool] = None, limit: Optional[int] = None,
             bias_correction: bool = False, weight_block: Optional[int] = None,
             min_sqnr: Optional[float] = None, exclude=None, op_types=None, nodes=None,
             act_symmetric: Optional[bool] = None, weight_symmetric: Optional[bool] = None) -> QuantizeResult:
    """Quantize a float model to QDQ ONNX.

    `calib`: an .npz path (one key per graph input, samples along axis 0; see qcompiler.quant.data for the
    batch-dim rule), an .npy path (single-input model), a folder of them, an iterable of feed dicts, or an object
    with `get_next()` (onnxruntime's CalibrationDataReader; read once, its len() is never asked). `config`: a
    path or a QuantConfig (when given, its settings replace the per_channel/weight_bits/act_bits arguments).
    `exclude`: node names or regexes whose nodes stay float; `op_types` / `nodes`: only nodes of these op types /
    with these names are quantized (qcompiler.quant.selection; added after the config's rules, so they win).
    `act_symmetric` / `weight_symmetric`: symmetric grids (None: the target's choice); they also override a
    config. A selector, config rule or frozen encoding that matches nothing is listed in report['warnings'].
    `load_encodings`: an AIMET encodings file whose encodings are frozen; everything else is calibrated.
    `bias_correction`:
    empirical bias correction of Conv/Gemm weights (qdq.correct_biases); off by default because on ppocr_cls it
    helped weight-only quantization (49 -> 56 dB) but hurt W8A8 (43 -> 32 dB output SQNR). `weight_block`:
    per-block weight scales of this many elements along the reduction axis (placement.block_axis; opset 21).
    `min_sqnr`: the output SQNR floor in dB (default safety_net.DEFAULT_MIN_SQNR_DB; -inf turns it off): below
    it the safety net keeps float or widens the quantizers that break the output, and the outputs still below
    it are listed in report['below_floor'] (never raised: the CLI exits 3 on them).

    Errors (all subclasses of qcompiler.errors.QCompilerError, one line naming the file, argument or sample):
    ArgumentError for an argument of the wrong type or out of range (`_check_arguments`); ModelLoadError /
    InvalidModelError for a model that cannot be read or is not a valid graph; OnnxRuntimeError when
    onnxruntime refuses the model (its reason); DataError for calibration data that does not fit the model or
    that onnxruntime cannot run (names the sample); ConfigError for a bad config, profile or encodings file.
    Anything else is a bug.
    """
    _check_arguments(model_or_path, calib, target, scheme, per_channel, weight_bits, act_bits, config,
                     load_encodings, progress, limit, bias_correction, weight_block)
    from .safety_net import check_min_sqnr
    min_sqnr = check_min_sqnr(min_sqnr)
    sel = _check_selection(exclude, op_types, nodes, act_symmetric, weight_symmetric)
    # paths as str from here on (a bytes or Path model, data, config, profile or encodings path)
    model_or_path, calib, target, config, load_encodings = (
        os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else a
        for a in (model_or_path, calib, target, config, load_encodings))
    from ..ort_session import model_label
    with model_label(model_or_path if isinstance(model_or_path, (str, os.PathLike)) else ""):
        return _quantize(model_or_path, calib, target, scheme, per_channel, weight_bits, act_bits, config,
                         load_encodings, progress, limit, bias_correction, weight_block, min_sqnr, sel=sel)


def _check_arguments(model_or_path, calib, target, scheme, per_channel, weight_bits, act_bits, config,
                     load_encodings, progress, limit, bias_correction, weight_block) -> None:
    """Every argument of `quantize`, by type and range, before any work: one ArgumentError line naming it."""
    from ..arguments import got, require_bool, require_int, require_path
    from ..ir.model import Model
    from .bitwidths import check_bits
    from .schemes import canonical_scheme
    import onnx
    if isinstance(model_or_path, (str, bytes, os.PathLike)):
        require_path(model_or_path, "model")
    elif not isinstance(model_or_path, (onnx.ModelProto, Model)):
        raise ArgumentError(f"model must be a path, an onnx.ModelProto or a qcompiler Model, got {got(model_or_path)}")
    if isinstance(calib, (str, bytes, os.PathLike)):
        require_path(calib, "calib")
    elif isinstance(calib, dict) or not (hasattr(calib, "__iter__") or callable(getattr(calib, "get_next", None))):
        hint = " (a single feed dict: wrap it in a list)" if isinstance(calib, dict) else ""
        raise ArgumentError(f"calib must be an .npz/.npy path, a folder, an iterable of feed dicts or a reader "
                            f"with get_next(), got {got(calib)}{hint}")
    if target is not None and not isinstance(target, (str, dict, os.PathLike)):
        raise ArgumentError(f"target must be a profile name, a profile YAML path or a dict, got {got(target)}")
    if scheme is not None and not isinstance(scheme, str):
        raise ArgumentError(f"scheme must be a scheme name (e.g. 'min_max'), got {got(scheme)}")
    if scheme is not None:
        canonical_scheme(scheme, error=ArgumentError)
    require_bool(per_channel, "per_channel")
    check_bits(weight_bits, "weight_bits", error=ArgumentError)
    check_bits(act_bits, "act_bits", error=ArgumentError)
    if config is not None and not hasattr(config, "settings_for"):
        require_path(config, "config")
    if load_encodings is not None:
        require_path(load_encodings, "load_encodings")
    if progress is not None:
        require_bool(progress, "progress")
    if limit is not None:
        require_int(limit, "limit", lo=1)
    require_bool(bias_correction, "bias_correction")
    if weight_block is not None and (isinstance(weight_block, bool) or not isinstance(weight_block, int)
                                     or weight_block < 1):
        raise ArgumentError(f"block size {got(weight_block)}: must be a positive number of elements")


def _check_selection(exclude, op_types, nodes, act_symmetric, weight_symmetric):
    """The selection and symmetry arguments of `quantize`, checked: one ArgumentError line naming the argument."""
    from ..arguments import require_bool
    from .selection import Selection, check_names
    for v, what in ((act_symmetric, "act_symmetric"), (weight_symmetric, "weight_symmetric")):
        if v is not None:
            require_bool(v, what)
    return Selection(exclude=check_names(exclude, "exclude") or (), op_types=check_names(op_types, "op_types"),
                     nodes=check_names(nodes, "nodes"), act_symmetric=act_symmetric,
                     weight_symmetric=weight_symmetric)


def _apply_selection(model, config, sel, profile, per_channel, weight_bits, act_bits, weight_block):
    """The config placement reads: the caller's (or one holding the arguments) plus the selection's rules and
    the symmetry overrides; warnings for what matches nothing go to `sel.warnings`."""
    from .selection import config_with_rules, selection_rules
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


def _quantize(model_or_path, calib, target, scheme, per_channel, weight_bits, act_bits, config, load_encodings,
              progress, limit, bias_correction, weight_block, min_sqnr=None, sel=None) -> QuantizeResult:
    t_start = time.perf_counter()
    timings, notes = {}, []
    if config is not None and not hasattr(config, "settings_for"):
        from .config import load_config
        config = load_config(os.fspath(config))
    if target is None:
        target = (config.target if config is not None and config.target else "ort_cpu")
    profile = get_profile(target)
    from .schemes import DEFAULT_SCHEME, canonical_scheme
    if scheme is None:
        scheme = config.scheme if config is not None and config.scheme else DEFAULT_SCHEME
    scheme = canonical_scheme(scheme)

    from ..progress import bar
    from .selection import Selection, check_unmatched, unmatched_config_rules
    sel = sel if sel is not None else Selection()
    with bar("loading", 2, progress) as loading:
        model = _load(model_or_path)
        loading.update(1)
        check_unmatched(model, sel)     # on the model as loaded: naming a node fold-batchnorm removes is no warning
        sel.warnings.extend(unmatched_config_rules(model, config))
        t = time.perf_counter()
        _prepare(model, notes)
        loading.update(1)
    opset_before = model.opset
    bits = _config_bits(config) | {weight_bits, act_bits}
    blocked = bool(weight_block) or _config_blocks(config)
    need = WIDE_INT_OPSET if blocked or any(b != 8 for b in bits) else PER_CHANNEL_OPSET
    if need < WIDE_INT_OPSET and profile.wide_activation_bits:
        # NOTE: raise now if int16 widening may need opset 21 later: onnx's version converter holds ~4 copies of
        # the model, which on top of calibration's leftovers set the peak (minilm 896 -> ~530 MB); a model the
        # converter cannot take still quantizes at opset 13 (then only 8-bit widening fails later)
        try:
            model = _raise_opset(model, WIDE_INT_OPSET, notes)
        except QCompilerError:
            pass
    model = _raise_opset(model, need, notes)
    if model.opset != opset_before and _weight_bytes(model) > COLLECT_OVER_BYTES:
        release(collect=True)   # the replaced model: one big cycle, gone only at a full collection (memory.py)
    timings["prepare"] = time.perf_counter() - t

    from .data import input_specs, load_samples
    samples = load_samples(calib, input_specs(model.graph), limit=limit)
    t = time.perf_counter()
    config = _apply_selection(model, config, sel, profile, per_channel, weight_bits, act_bits, weight_block)
    opts = PlacementOptions(per_channel=per_channel, weight_bits=weight_bits, act_bits=act_bits, config=config,
                            supergroups=_supergroup_choice(config), weight_block=weight_block,
                            act_symmetric=sel.act_symmetric, weight_symmetric=sel.weight_symmetric)
    act_sym = profile.activation.symmetric if sel.act_symmetric is None else sel.act_symmetric
    cal = calibrate(model, samples, scheme=scheme, bits=act_bits, symmetric=act_sym,
                    progress=progress, names=observed_names(model, profile, opts),
                    keep_samples=SQNR_MAX_SAMPLES, keep_bytes=SQNR_KEEP_BYTES,
                    channel_axes=_bias_correction_inputs(model, profile, opts) if bias_correction else None)
    release()   # the calibration session's freed heap (memory.py)
    timings["calibrate"] = time.perf_counter() - t

    t = time.perf_counter()
    stats = cal.stats()
    plan = build_plan(model, profile, cal.dtypes, stats, opts)
    if plan.needs_opset() > model.opset:
        # NOTE: value names survive onnx's version converter, so the name-keyed statistics still apply
        model = _raise_opset(model, plan.needs_opset(), notes)
        release(collect=True)
        plan = build_plan(model, profile, cal.dtypes, stats, opts)
    if load_encodings is not None:
        from .freeze import freeze_encodings
        freeze_encodings(plan, model, load_encodings, notes, sel.warnings)
    assign_encodings(plan, model, cal, scheme)
    assign_block_encodings(plan, model, scheme)
    layers = layer_choices(model, plan, config)
    if bias_correction:
        n = correct_biases(model, plan, cal.channel_mean)
        if n:
            notes.append(f"bias correction on {n} Conv/Gemm nodes")
    fp16 = float16_nodes(model, config, plan.dtypes)
    decide_storage(plan, model)
    acts, params = apply_plan(model, plan)
    if fp16:
        done = apply_float16(model, fp16, probe_ort=profile.name.startswith("ort"))
        for name, what in done.items():
            layers.setdefault(name, {})["float16"] = what
        notes.append(f"{sum(w.startswith('float16') for w in done.values())} of {len(done)} nodes marked "
                     f"precision: float16 run in fp16 (see report 'layers')")
    prefolded = plan.stored_on_grid()
    if prefolded:
        notes.append(f"{len(prefolded)} weights/biases stored fake-quantized (float on their int grid): their "
                     f"node has no integer kernel on {profile.name}, a DQ would run every inference")
    verify(model.graph)
    timings["place_and_insert"] = time.perf_counter() - t

    t = time.perf_counter()
    errors = output_errors(model, cal.kept, progress)
    release()
    timings["report_sqnr"] = time.perf_counter() - t
    # issue 11 items 2-3: the safety net (only below the floor) and the quality gate's below_floor list
    from .safety_net import report_fields, run_safety_net
    t = time.perf_counter()
    net, fixed_errors = run_safety_net(model, plan, acts, cal.kept, errors, min_sqnr, profile)
    errors = errors if fixed_errors is None else fixed_errors
    timings["safety_net"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - t_start
    report = build_report(plan, acts, params, cal, timings, target, scheme, notes, errors=errors,
                          layers=layers)
    report_fields(report, net, min_sqnr, timings["safety_net"])
    report["warnings"] = list(sel.warnings)
    report["prefolded_params"] = prefolded
    report["quantizer_args"] = {"activation_bitwidth": act_bits, "param_bitwidth": weight_bits,
                                "dtype": "int", "is_symmetric": bool(profile.weight.symmetric),
                                "per_channel_quantization": bool(per_channel), "quant_scheme": scheme}
    stats = {"calibration_seconds": cal.seconds, "samples": cal.samples, "observed_values": len(cal.observers)}
    return QuantizeResult(model=model, encodings={"activations": acts, "params": params}, report=report,
                          stats=stats, plan=plan)


def _bias_correction_inputs(model, profile, opts) -> dict:
    """Which inputs need per-channel means: those of the Conv/Gemm nodes whose weights the plan quantizes."""
    plan = build_plan(model, profile, _float_dtypes_guess(model), {}, opts)
    return bias_correction_inputs(model, plan)


def _float_dtypes_guess(model) -> dict:
    """Before calibration: treat every non-constant value as float (only weight slots matter here)."""
    out = {}
    for n in model.graph.nodes:
        for v in n.outputs:
            if v is not None:
                out[v.name] = np.dtype(np.float32)
    for v in model.graph.inputs:
        out[v.name] = np.dtype(np.float32)
    return out


def _supergroup_choice(config):
    if config is None:
        return True
    sg = getattr(config, "supergroups", True)
    if isinstance(sg, (list, tuple)):
        names = [s for s in sg if isinstance(s, str)]
        return tuple(names) if names else True
    return bool(sg)
