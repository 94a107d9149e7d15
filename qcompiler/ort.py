"""A drop-in for `onnxruntime.quantization.quantize_static`: switch an existing pipeline with one import line.

    # from onnxruntime.quantization import quantize_static
    from qcompiler.ort import quantize_static

Same signature, argument order and meaning as onnxruntime 1.32's `quantize_static` for what qcompiler supports;
onnxruntime's enums (`QuantFormat`, `QuantType`, `CalibrationMethod`) and their names as strings ("QDQ",
"QUInt8", "MinMax") are accepted. What cannot be honoured is one `ArgumentError` line naming the argument, never
a silently different model. The output is a QDQ model for onnxruntime's CPU provider (qcompiler's `ort_cpu`
target: placement, supergroups and the report are qcompiler's own); the function returns the QuantizeResult
(onnxruntime returns None) so the report is at hand.

Mapping:
- `quant_format`: QDQ only (QOperator: ArgumentError).
- `activation_type` / `weight_type`: QInt8/QUInt8 -> 8 bits, QInt16/QUInt16 -> 16, QInt4/QUInt4 -> 4 (16 and 4
  raise the model to opset 21); float8 -> ArgumentError. Storage signedness follows the target (uint8
  asymmetric activations, int8 symmetric weights on ort_cpu): a signed and an unsigned grid of the same width,
  symmetry and range quantize identically, only the stored zero point differs.
- `per_channel`, `reduce_range` (True: weights on a 7-bit range inside int8; False: the full 8 bits, as asked,
  although qcompiler's own ort_cpu target always narrows: on an AVX2 CPU without VNNI onnxruntime's integer
  kernels can saturate u8 x s8 sums, and ppocr_cls per channel measured 0.975 with False against 0.9925 with True),
  `op_types_to_quantize`, `nodes_to_quantize`, `nodes_to_exclude` (exact node names), `use_external_data_format`
  (weights beside the model as `NAME.onnx.data`).
- `calibrate_method`: MinMax -> min_max, Entropy -> entropy, Percentile -> percentile (99.999th, ORT's default);
  Distribution (onnxruntime's float8 calibration) -> ArgumentError.
- `calibration_providers`: accepted and unused (calibration runs on onnxruntime's CPU provider).
- `calibration_cache_path`: ArgumentError (not supported).
- `extra_options`: `ActivationSymmetric`, `WeightSymmetric`, `CalibTensorRangeSymmetric` (as
  ActivationSymmetric), `OpTypesToExcludeOutputQuantization`, `TensorQuantOverrides` (per tensor: `quant_type`,
  `symmetric`, `rmin`+`rmax`, `scale`+`zero_point` on activations; `quant_type` and `symmetric` on weights) are
  honoured. Keys that only tune onnxruntime's own placement or memory use and change nothing qcompiler does
  (`ForceQuantizeNoInputCheck`, `DedicatedQDQPair`, `QDQKeepRemovableActivations`, `AddQDQPairToWeight`,
  `MatMulConstBOnly`, `EnableSubgraph`, `CalibMaxIntermediateOutputs`, `CalibStridedMinMax`,
  `QDQDisableWeightAdjustForInt32Bias`, `extra.Sigmoid.nnapi`) are ignored. Keys asking for something
  qcompiler does not do (`CalibMovingAverage`, `SmoothQuant`, `ActivationRestrictedAsymmetric`,
  `MinimumRealRange`, `UseQDQContribOps`, `QDQOpTypePerChannelSupportToAxis`, `CalibPercentile`,
  `CalibNumBins`, ...) are an ArgumentError when set to anything but their off value; an unknown key is a
  warning (onnxruntime ignores unknown keys too).

Warnings (a node name, op type or tensor override that matches nothing) are Python `UserWarning`s naming
onnxruntime's argument.
"""
from __future__ import annotations

import enum
import math
import os
import re
import warnings as _warnings
from typing import Optional

from qcompiler.arguments import got, require_path
from qcompiler.errors import ArgumentError
from qcompiler.onnx_io import load_model, model_from_proto
from qcompiler.quant.api import quantize
from qcompiler.quant.core.schemes import canonical_scheme
from qcompiler.quant.settings.config import parse_config
from qcompiler.quant.settings.selection import check_names, warning_text

_FORMATS = {"qdq": "QDQ", "qoperator": "QOperator"}
_TYPES = {"qint8": "QInt8", "quint8": "QUInt8", "qfloat8e4m3fn": "QFLOAT8E4M3FN", "qint16": "QInt16",
          "quint16": "QUInt16", "qint4": "QInt4", "quint4": "QUInt4"}
_TYPE_BITS = {"qint8": 8, "quint8": 8, "qint16": 16, "quint16": 16, "qint4": 4, "quint4": 4}
_TYPE_RANGE = {"qint8": (-128, 127), "quint8": (0, 255), "qint16": (-32768, 32767), "quint16": (0, 65535),
               "qint4": (-8, 7), "quint4": (0, 15)}
_METHOD_NAMES = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile", "distribution": "Distribution"}
_IGNORED = ("ForceQuantizeNoInputCheck", "DedicatedQDQPair", "QDQKeepRemovableActivations", "AddQDQPairToWeight",
            "MatMulConstBOnly", "EnableSubgraph", "CalibMaxIntermediateOutputs", "CalibStridedMinMax",
            "QDQDisableWeightAdjustForInt32Bias", "extra.Sigmoid.nnapi")
# key -> its "off" value(s): anything else is refused
_REFUSED = {"CalibMovingAverage": (False,), "CalibMovingAverageConstant": None, "SmoothQuant": (False,),
            "SmoothQuantAlpha": None, "SmoothQuantFolding": None, "ActivationRestrictedAsymmetric": (False,),
            "MinimumRealRange": (None,), "UseQDQContribOps": (False,), "QDQOpTypePerChannelSupportToAxis": ({},),
            "CalibPercentile": None, "CalibNumBins": None, "CalibNumQuantizedBins": None,
            "CalibTensorRangeSymmetric": (False, True)}
_HANDLED = ("ActivationSymmetric", "WeightSymmetric", "TensorQuantOverrides", "OpTypesToExcludeOutputQuantization")
_LABELS = {"exclude": "nodes_to_exclude", "op_types": "op_types_to_quantize", "nodes": "nodes_to_quantize"}


def _enum_name(value, enum_type: str, what: str, known: dict) -> str:
    """The lower-case name of an onnxruntime enum member, or of its name given as a string ("QInt8",
    "QuantType.QInt8"); `known` maps lower-case names to display names."""
    if isinstance(value, enum.Enum):
        if type(value).__name__ != enum_type:
            raise ArgumentError(f"{what} must be a {enum_type}, got {type(value).__name__}.{value.name}")
        name = value.name
    elif isinstance(value, str):
        name = value.split(".")[-1]
    else:
        raise ArgumentError(f"{what} must be a {enum_type} or its name, got {got(value)}")
    if name.lower() not in known:
        raise ArgumentError(f"{what}: unknown {enum_type} '{name[:40]}' (known: {', '.join(known.values())})")
    return name.lower()


def _type_bits(value, what: str) -> tuple:
    key = _enum_name(value, "QuantType", what, _TYPES)
    if key not in _TYPE_BITS:
        raise ArgumentError(f"{what}: {_TYPES[key]} is not supported: qcompiler emits integer grids of 4, 8 or 16 "
                            f"bits (QInt8, QUInt8, QInt16, QUInt16, QInt4, QUInt4)")
    return _TYPE_BITS[key], key


def _bool(v, what: str) -> bool:
    if not isinstance(v, bool):
        raise ArgumentError(f"{what} must be True or False, got {got(v)}")
    return v


def _names(v, what: str) -> Optional[list]:
    t = check_names(v, what)
    return None if t is None else list(t)


def quantize_static(model_input, model_output, calibration_data_reader=None, quant_format="QDQ",
                    op_types_to_quantize=None, per_channel=False, reduce_range=False, activation_type="QInt8",
                    weight_type="QInt8", nodes_to_quantize=None, nodes_to_exclude=None,
                    use_external_data_format=False, calibrate_method="MinMax", calibration_providers=None,
                    extra_options=None, calibration_cache_path=None):
    """Quantize `model_input` (a path or an onnx.ModelProto) to a QDQ model at `model_output`, calibrated on
    `calibration_data_reader` (an onnxruntime CalibrationDataReader, any object with `get_next()`, an iterable
    of feed dicts, or an .npz/.npy path or folder). Arguments as onnxruntime's `quantize_static`; see the module
    docstring for what each maps to and what is refused. Returns the QuantizeResult (report in `.report`)."""
    if calibration_data_reader is None:
        raise ArgumentError("calibration_data_reader is required (calibration caches are not supported)")
    if calibration_cache_path is not None:
        raise ArgumentError("calibration_cache_path is not supported by qcompiler: pass "
                            "calibration_data_reader only")
    fmt = _enum_name(quant_format, "QuantFormat", "quant_format", _FORMATS)
    if fmt != "qdq":
        raise ArgumentError("quant_format: QOperator is not supported by qcompiler; use QuantFormat.QDQ "
                            "(onnxruntime's recommended format, run by the same integer kernels)")
    act_bits, act_key = _type_bits(activation_type, "activation_type")
    weight_bits, _ = _type_bits(weight_type, "weight_type")
    method = _enum_name(calibrate_method, "CalibrationMethod", "calibrate_method", _METHOD_NAMES)
    if method == "distribution":
        raise ArgumentError("calibrate_method: Distribution (onnxruntime's float8 calibration) is not supported; "
                            "use MinMax, Entropy or Percentile")
    scheme = canonical_scheme(method, error=ArgumentError)  # MinMax, Entropy, Percentile: schemes.py
    per_channel = _bool(per_channel, "per_channel")
    reduce_range = _bool(reduce_range, "reduce_range")
    use_external_data_format = _bool(use_external_data_format, "use_external_data_format")
    if calibration_providers is not None and (not isinstance(calibration_providers, (list, tuple)) or
                                              not all(isinstance(p, str) for p in calibration_providers)):
        raise ArgumentError(f"calibration_providers must be a list of provider names, got "
                            f"{got(calibration_providers)}")
    if isinstance(model_output, (str, bytes, os.PathLike)):
        model_output = require_path(model_output, "model_output")
    else:
        raise ArgumentError(f"model_output must be a path, got {got(model_output)}")
    op_types = _names(op_types_to_quantize, "op_types_to_quantize")
    nodes = _names(nodes_to_quantize, "nodes_to_quantize")
    excluded = _names(nodes_to_exclude, "nodes_to_exclude") or []

    opts = _extra_options(extra_options)
    target = {"base": "ort_cpu", "weight": {"bits": 8, "symmetric": True, "range_bits": 7 if reduce_range else 8}}
    rules = []
    if opts.get("OpTypesToExcludeOutputQuantization"):
        ops = _names(opts["OpTypesToExcludeOutputQuantization"], "extra_options['OpTypesToExcludeOutputQuantization']")
        rules.append({"match": {"op_type": ops}, "output_quantized": False})
    overrides = opts.get("TensorQuantOverrides") or {}
    overridden = []     # activation names given an override
    if overrides:
        rules += _override_rules(model_input, overrides, act_key, overridden)
    w_sym = opts.get("WeightSymmetric", True)
    a_sym = opts.get("ActivationSymmetric", False) or opts.get("CalibTensorRangeSymmetric", False)
    config = parse_config({"weights": {"bits": weight_bits, "symmetric": w_sym, "per_channel": per_channel},
                           "activations": {"bits": act_bits, "symmetric": a_sym}, "rules": rules},
                          source="extra_options")
    # NOTE: ORT's node names are exact; qcompiler's `exclude` takes names or regexes, so each name is anchored
    anchored = {f"^{re.escape(n)}$": n for n in excluded}
    res = quantize(model_input, calibration_data_reader, target=target, scheme=scheme, per_channel=per_channel,
                   weight_bits=weight_bits, act_bits=act_bits, config=config, exclude=list(anchored) or None,
                   op_types=op_types, nodes=nodes, act_symmetric=a_sym, weight_symmetric=w_sym)
    for w in res.report.get("warnings", []):
        if w["kind"] == "exclude":
            w = dict(w, value=anchored.get(w["value"], w["value"]))
        if w["kind"] == "config rule":
            continue    # the rules built here from extra_options: reported as overrides below
        _warnings.warn(f"qcompiler.ort.quantize_static: {warning_text(w, _LABELS)}", UserWarning, stacklevel=2)
    for name in overridden:
        if name not in res.encodings["activations"]:
            why = res.report["left_float"].get(name, "not quantized")
            _warnings.warn(f"qcompiler.ort.quantize_static: TensorQuantOverrides '{name[:60]}' not applied: the "
                           f"tensor is left float ({why})", UserWarning, stacklevel=2)
    res.save(model_output, external_data=True if use_external_data_format else None)
    return res


def _extra_options(extra) -> dict:
    if extra is None:
        return {}
    if not isinstance(extra, dict):
        raise ArgumentError(f"extra_options must be a dict, got {got(extra)}")
    out = {}
    for k, v in extra.items():
        if not isinstance(k, str):
            raise ArgumentError(f"extra_options: keys must be strings, got {got(k)}")
        if k in _HANDLED:
            if k in ("ActivationSymmetric", "WeightSymmetric"):
                v = _bool(v, f"extra_options['{k}']")
            elif k == "TensorQuantOverrides" and not isinstance(v, dict):
                raise ArgumentError(f"extra_options['TensorQuantOverrides'] must be a dict, got {got(v)}")
            out[k] = v
        elif k in _IGNORED:
            continue
        elif k in _REFUSED:
            off = _REFUSED[k]
            if k == "CalibTensorRangeSymmetric":
                out[k] = _bool(v, f"extra_options['{k}']")
                continue
            if off is None or not any(v is o or (v == o and type(v) is type(o)) for o in off):
                raise ArgumentError(f"extra_options['{k}'] = {got(v)}: not supported by qcompiler "
                                    f"(remove the key{'' if off is None else ' or set it to ' + repr(off[0])})")
        else:
            _warnings.warn(f"qcompiler.ort.quantize_static: extra_options key '{k[:60]}' is unknown and ignored",
                           UserWarning, stacklevel=3)
    return out


def _override_rules(model_input, overrides: dict, act_key: str, overridden: list) -> list:
    """Config rules for TensorQuantOverrides: activations by their producer node, weights by their readers."""
    model = model_from_proto(model_input) if hasattr(model_input, "SerializeToString") else \
        load_model(os.fspath(model_input))
    producers, readers, inputs = {}, {}, set()
    for g in model.graph.all_graphs():
        for n in g.nodes:
            for v in n.outputs:
                if v is not None:
                    producers[v.name] = n.name
            for v in n.inputs:
                if v is not None:
                    readers.setdefault(v.name, []).append(n.name)
        inputs.update(v.name for v in g.inputs if not v.is_initializer)
    weights = {v.name for g in model.graph.all_graphs() for v in g.initializers.values()}
    rules = []
    for tensor, entries in overrides.items():
        where = f"extra_options['TensorQuantOverrides']['{str(tensor)[:60]}']"
        if not isinstance(entries, list) or not entries or not all(isinstance(e, dict) for e in entries):
            raise ArgumentError(f"{where} must be a list of dicts, got {got(entries)}")
        if len(entries) > 1:
            raise ArgumentError(f"{where}: per-channel overrides are not supported (one dict per tensor)")
        e = dict(entries[0])
        is_weight = tensor in weights
        if tensor not in producers and not is_weight:
            if tensor in inputs:
                raise ArgumentError(f"{where}: overrides of a graph input are not supported")
            _warnings.warn(f"qcompiler.ort.quantize_static: TensorQuantOverrides '{str(tensor)[:60]}' matches no "
                           f"tensor", UserWarning, stacklevel=3)
            continue
        sec, key = {}, act_key
        if "quant_type" in e:
            bits, key = _type_bits(e.pop("quant_type"), f"{where}['quant_type']")
            sec["bits"] = bits
        if "symmetric" in e:
            sec["symmetric"] = _bool(e.pop("symmetric"), f"{where}['symmetric']")
        if is_weight:
            if e:
                raise ArgumentError(f"{where}: key '{sorted(e)[0]}' is not supported on a weight (quant_type and "
                                    f"symmetric are)")
            if sec and readers.get(tensor):
                rules.append({"match": {"name": sorted(set(readers[tensor]))}, "weights": sec})
            continue
        rule = {"match": {"name": producers[tensor]}}
        if sec:
            rule["activations"] = sec
        if "scale" in e or "zero_point" in e:
            if "scale" not in e or "zero_point" not in e or sec.get("symmetric") is not None:
                raise ArgumentError(f"{where}: 'scale' needs 'zero_point' (and neither goes with 'symmetric')")
            scale, zp = e.pop("scale"), e.pop("zero_point")
            try:
                scale, zp = float(scale), int(zp)
            except (TypeError, ValueError, OverflowError):
                raise ArgumentError(f"{where}: scale must be a number and zero_point an integer") from None
            if not (math.isfinite(scale) and scale > 0):
                raise ArgumentError(f"{where}: scale must be a positive finite number")
            qmin, qmax = _TYPE_RANGE[key]
            rule["encoding_constraints"] = {"min": (qmin - zp) * scale, "max": (qmax - zp) * scale}
        if "rmin" in e or "rmax" in e:
            if "rmin" not in e or "rmax" not in e:
                raise ArgumentError(f"{where}: qcompiler needs both 'rmin' and 'rmax'")
            rule["encoding_constraints"] = {"min": e.pop("rmin"), "max": e.pop("rmax")}
        if e:
            raise ArgumentError(f"{where}: key '{sorted(e)[0]}' is not supported (quant_type, symmetric, "
                                f"rmin/rmax and scale/zero_point are)")
        if len(rule) > 1:
            rules.append(rule)
            overridden.append(tensor)
    return rules


__all__ = ["quantize_static"]
