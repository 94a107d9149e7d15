"""The output opset, decided once before the pipeline, and the one conversion to it (the `convert-opset` pass).

Q/DQ need opset 13 (DequantizeLinear `axis`: per-channel weights) and opset 21 for int16/int4 grids and per-block
weights (`block_size`; anchors B). The choice reads the settings (bits, blocks, the config's rules, the bit
widths and blocks of a `--load-encodings` file) and the profile: a profile that may widen activations to 16
bits (`wide_activation_bits`) asks for 21 as well, so widening never needs a second conversion in the middle
of the pipeline. `--opset N` pins it; a pin the settings' grids cannot live in is one ArgumentError line.
"""
from __future__ import annotations

import onnx
from onnx import version_converter

from qcompiler.errors import ArgumentError, InvalidModelError
from qcompiler.onnx_io.rewrite import rewrite_in_place
from qcompiler.quant.interop.encodings_io import needs_wide_opset
from qcompiler.shorten import short_text

PER_CHANNEL_OPSET = 13   # DequantizeLinear `axis`
WIDE_INT_OPSET = 21      # int16/int4 QuantizeLinear in the standard domain, per-block DequantizeLinear


def _config_updates(cfg) -> list:
    """Every settings dict of a config: its defaults, its per-op-type entries and its rules' updates."""
    if cfg is None:
        return []
    return [vars(cfg.defaults)] + list(cfg.op_type.values()) + [r.updates for r in cfg.rules]


def required_opset(settings) -> int:
    """The lowest opset the requested grids can be written in: the arguments', the config's and those of the
    `--load-encodings` file (read here, bounded, before the model is converted: its int4/int16 or per-block
    entries decide, so they need no --weight-bits/--block-size)."""
    cfg = settings.config
    bits = {int(u[k]) for u in _config_updates(cfg) for k in ("act_bits", "weight_bits") if k in u}
    bits |= {settings.weight_bits, settings.act_bits}
    blocked = bool(settings.weight_block) or any(u.get("weight_block") for u in _config_updates(cfg))
    if blocked or any(b != 8 for b in bits):
        return WIDE_INT_OPSET
    if getattr(settings, "load_encodings", None) is not None:
        if needs_wide_opset(settings.load_encodings):
            return WIDE_INT_OPSET
    return PER_CHANNEL_OPSET


def choose_opset(settings, profile, model_opset: int) -> tuple:
    """(opset to convert to, whether a failed conversion may fall back to the required one).

    Never below the model's own opset (no down-conversion unless pinned)."""
    need = required_opset(settings)
    if settings.opset is not None:
        if settings.opset < need:
            src = " (the --load-encodings file's)" if getattr(settings, "load_encodings", None) else ""
            raise ArgumentError(f"--opset {settings.opset} cannot carry these settings'{src} Q/DQ: int4/int16 "
                                f"grids and per-block weights need opset {need}")
        return settings.opset, None
    want = max(need, WIDE_INT_OPSET if profile.wide_activation_bits else need)
    fallback = max(need, model_opset) if want > need else None
    return max(want, model_opset), fallback


def convert_in_place(model, opset: int) -> bool:
    """Convert `model` to `opset` with onnx's version converter, in place (the Model object stays the same, so
    every pass and the context keep their reference). False when already there."""
    if model.opset == opset:
        return False
    check_arity(model)
    rewrite_in_place(model, lambda proto: version_converter.convert_version(proto, opset),
                     f"convert the model's opset {model.opset} to {opset} (needed for per-channel/int16 Q/DQ)")
    return True


def check_arity(model) -> None:
    """Every standard-domain node has as many inputs as its op takes at the model's own opset, or one line naming
    the node (as onnxruntime would): the opset converter's message for such a model names no node ("Input w is
    undefined!" for a Gemm without C at opset 7)."""
    for g in model.graph.all_graphs():
        for n in g.nodes:
            if n.domain not in ("", "ai.onnx"):
                continue
            try:
                schema = onnx.defs.get_schema(n.op_type, model.opset, "")
            except Exception:  # noqa: BLE001 - an op unknown at this opset: the loader's and onnxruntime's to name
                continue
            given = list(n.inputs)
            while given and given[-1] is None:
                given.pop()
            lo, hi = schema.min_input, schema.max_input
            if not lo <= len(given) <= hi:
                takes = f"{lo}" if lo == hi else f"{lo} to {hi}" if hi < 1 << 20 else f"at least {lo}"
                raise InvalidModelError(
                    f"node '{short_text(n.name)}' ({n.op_type}) has {len(given)} input{'s' if len(given) != 1 else ''}"
                    f", but {n.op_type} at the model's opset {model.opset} (version {schema.since_version}) takes "
                    f"{takes}: the model is not valid at its own opset")


def opset_note(before: int, after: int) -> str:
    return f"opset converted from {before} to {after}"
