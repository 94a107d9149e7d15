"""Freeze encodings read from an AIMET encodings file onto a plan (`quantize(load_encodings=...)`).

Frozen values keep the file's encodings; everything else is calibrated as usual.
"""
from __future__ import annotations

import os
from typing import Optional

from ..errors import ConfigError


def freeze_encodings(plan, model, path, notes: list, warnings: Optional[list] = None) -> None:
    """Freeze encodings from an AIMET file: those values keep them; everything else is calibrated.

    Each entry used is first checked against the model (encodings_io.fit_param_encoding /
    check_activation_encoding: axis, channel and block counts against the weight's shape; activations per
    tensor; only float tensors); a bad entry is one ConfigError line naming the file and the entry. FLOAT
    entries (float16/float32) leave their tensor unquantized.
    """
    from .encodings_io import check_activation_encoding, fit_param_encoding, read_encodings
    from .profiles import weight_axis
    path = os.fspath(path)
    g = model.graph
    param_names = [v.name for sg in g.all_graphs() for v in sg.initializers.values()] + \
        [n.outputs[0].name for sg in g.all_graphs() for n in sg.nodes_by_op("Constant")]
    acts, params = read_encodings(path, param_names=param_names)
    unknown = []
    for name, enc in acts.items():
        spec = plan.values.get(name)
        if spec is None:
            unknown.append(name)
            continue
        check_activation_encoding(path, name, enc)
        dt = plan.dtypes.get(name)
        if dt is not None and getattr(dt, "kind", "f") != "f":
            raise ConfigError(f"{path}: encoding '{name[:60]}': the model's tensor holds {dt}, not floats; "
                              f"only float tensors are quantized")
        enc.frozen = True
        if enc.dtype == "float":
            spec.encoding, spec.frozen = None, True
            spec.float_(f"float{enc.bits} in the encodings file")
            continue
        spec.encoding, spec.frozen, spec.keep_float, spec.reason = enc, True, False, ""
        spec.bits, spec.symmetric = enc.bits, enc.symmetric
    by_name = plan.nodes
    fitted = {}
    for (node_name, slot), spec in plan.uses.items():
        if spec.kind != "weight":
            continue
        node = by_name[node_name]
        v = node.inputs[slot]
        enc = params.get(v.name)
        if enc is None:
            continue
        shape = v.shape
        if v.name not in fitted:
            hint = spec.axis
            if hint is None and shape is not None:
                hint = weight_axis(plan.profile, node, slot, len(shape))
            fitted[v.name] = fit_param_encoding(path, v.name, enc, shape, hint)
        enc = fitted[v.name]
        enc.frozen = True
        if enc.dtype == "float":
            spec.encoding, spec.frozen = None, True
            spec.float_(f"float{enc.bits} in the encodings file")
            continue
        spec.encoding, spec.frozen, spec.keep_float = enc, True, False
        spec.axis, spec.bits, spec.block_size = enc.axis, enc.bits, enc.block_size
    if plan.needs_opset() > model.opset:
        # NOTE: the opset is chosen before the file is read (from the config, the arguments and the target);
        # refusing here beats exporting Q/DQ types the model's opset does not have
        raise ConfigError(f"{path}: int4/int16 or per-block encodings need opset {plan.needs_opset()}, but the "
                          f"model is at opset {model.opset} for this target and these settings")
    if unknown and warnings is not None:
        from .selection import warning
        warnings.extend(warning("frozen encoding", n, "names no quantizable value") for n in unknown)
    if unknown:
        notes.append(f"{len(unknown)} frozen activation encodings name no quantizable value: "
                     + ", ".join(n[:60] for n in unknown[:5]))
