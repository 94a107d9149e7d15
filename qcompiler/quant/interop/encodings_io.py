"""AIMET encodings files: write 1.0.0 or 2.0.0, read 1.0.0, 2.0.0 and the legacy 0.6.1 dict-of-lists form.

Formats (anchors.md A "Encodings", AIMET `Docs/techniques/encoding_spec.rst`, aimet_onnx 2.42 `_encoding.py`):
- 1.0.0: `{"version", "activation_encodings": [E], "param_encodings": [E], "quantizer_args", "excluded_layers"}`,
  E = `{"name", "enc_type": PER_TENSOR|PER_CHANNEL|PER_BLOCK, "dtype": INT|FLOAT, "bw", "is_sym", "scale": [..],
  "offset": [..]}` (+ `block_size`). AIMET's offset lives on the UNSIGNED grid: real = (q + offset) * scale,
  q in [0, 2^bw - 1]. It records no storage signedness and no channel axis.
- 2.0.0: `{"version": "2.0.0", "encodings": [{"name", "output_dtype", "y_scale", "y_zero_point"?, "axis"?,
  "block_size"?}]}`, aligned with onnx QuantizeLinear: zero point in the storage type (int8/uint8/...), omitted
  when 0. It does not separate activations from parameters: `read_encodings(param_names=...)` does.
- 0.6.1 (legacy): `{"activation_encodings": {name: [{bitwidth, scale, offset, is_symmetric, dtype, min, max}]},
  "param_encodings": {...}}`, one list item per channel.

Layouts, as aimet_onnx writes and reads them:
- Per-channel 1.0.0 entries carry no axis: the axis comes from the weight's op (`aimet_axes`: Conv 0,
  ConvTranspose 1, Gemm 0 with transB else 1, MatMul the last axis), never from the scale count.
- Per-block 1.0.0 scales are listed output channel first: a 2-D weight blocked along axis 0 (MatMul/Gemm B
  [K, N]) has its (K/bs, N) scales written transposed, (N, K/bs), and read back the same way (AIMET's
  `_should_permute_to_1_0_0_blockwise_ordering`). A weight blocked along axis 1 ([N, K]) needs no transpose.
- Per-block Conv/ConvTranspose: AIMET keeps one scale per (output channel, block) for the whole kernel window,
  shape (Cout, Cin/bs, 1, 1) (ConvTranspose (Cin/bs, Cout/g, 1, 1)); onnxruntime's blocked DequantizeLinear
  wants the weight's shape with the blocked dim reduced, (Cout, Cin/bs, kh, kw), and refuses AIMET's for kernels
  larger than 1x1. Both are read (AIMET's is repeated over the kernel: the same values). The QDQ model always
  holds the onnxruntime form. Files get AIMET's form whenever the scales are equal across the kernel window:
  every encoding that came from AIMET and every one qcompiler computes (qdq.block_encoding takes one grid per
  output channel and block over the whole window). Only a file's scales that differ per kernel position (read
  in the onnxruntime form) are written back in that form, which qcompiler reads exactly and AIMET refuses.

To AIMET: quantize with `--target aimet` (profiles.py: AIMET-ONNX's default_config_per_channel.json
as its QuantizationSimModel applies it) and load the file with `aimet_onnx.quantsim.load_encodings_to_sim` into
a sim built with that config: every entry then has a quantizer in AIMET's sim with the same bit width, symmetry
and granularity (K/V feeding a dynamic MatMul symmetric; no data-movement outputs, which AIMET's sim does not
quantize; weights on the full 8-bit range). Add the sim's settings as flags (`--act-bits 16`, `--weight-bits 4
--block-size 64` for set_blockwise_quantization_for_weights). AIMET's strict load still reports the quantizers
the file has no entry for (values qcompiler keeps float: LayerNorm and GELU interiors, constants); it disables
them with `disable_missing_quantizers`, which gives qcompiler's own numbers. Other targets write what their
model does (ort_cpu: 7-bit weights, asymmetric K/V, quantized data-movement outputs), which AIMET loads only
with strict=False. From AIMET: `--load-encodings FILE` alone; its bit widths and blocks choose the opset.

Biases: 2.0.0 lists the int32 bias grids (scale s_in * s_w), as aimet_onnx's 2.0.0 export does; 1.0.0 leaves
them out, as aimet_onnx's 1.0.0 export does (its loader counts an int32 entry for a bias quantizer its config
leaves disabled as a mismatch). qcompiler re-derives biases from the input and weight scales on load anyway.

The grid written is the grid used: a weight calibrated on a narrowed range (`range_bits`, the
ort_cpu profile's 7-bit weights as onnxruntime's `reduce_range`; stored in int8, values in [-64, 63]) is written
in 1.0.0 as `bw: 7` with the offset of that 7-bit grid (-64 when symmetric); AIMET simulates exactly that grid.
2.0.0's `output_dtype` is the Q/DQ storage type, which onnx only has in 4, 8, 16 and 32 bits: it says int8, and
the scale is the one the model uses (the integers of those weights lie in [-64, 63]). Reading `bw` 5-7 (9-15)
gives an 8-bit (16-bit) storage grid with `meta["range_bits"]` set, for weights only (an activation on a
narrowed grid is refused: qcompiler stores activations on the full 4/8/16-bit grid).

Reading back (the information the formats lack):
- 1.0.0 / 0.6.1: signed = is_sym and offset == -2^(bw-1) everywhere (then zero_point 0, int8 storage); otherwise
  unsigned with zero_point = -offset. A signed asymmetric grid therefore returns as the same grid on unsigned
  storage, and an unsigned symmetric grid centred at 2^(bw-1) returns as signed with zero point 0.
  Per-channel and per-block entries get axis 0 and `meta["axis_known"] = False`: `fit_param_encoding` fixes the
  axis and the layout from the weight's op and shape.
- 2.0.0: symmetric = signed storage with every zero point 0.
Every encoding read is `frozen=True`. A malformed file raises ConfigError naming the file and the entry: bit
widths outside bitwidths.py's table (INT 4/8/16, FLOAT 16/32; float8, bfloat16, 33 or 64 bits are refused) apart
from the narrowed weight ranges above, NaN/Inf/zero/negative scales, offsets or zero points outside the grid, a
non-zero `zero_point_shift`. Before use, `fit_param_encoding` and `check_activation_encoding` check each entry
against the model (qcompiler/quant/interop/freeze.py): the axis in range for the weight's rank, one scale per channel on that axis,
a block size no larger than the blocked dim and the scale count ceil(dim / block_size) per block row (ONNX
DequantizeLinear's rule; a last block may be partial).
"""
from __future__ import annotations

import json
from typing import Iterable, Optional

import numpy as np

from qcompiler.errors import ConfigError
from qcompiler.onnx_io import write_atomic
from qcompiler.quant.core.bitwidths import BIAS_BITS, FLOAT_BITS, INT_BITS
from qcompiler.quant.core.encoding import Encoding, per_tensor, scalar
from qcompiler.quant.core.qdq import output_axis
from qcompiler.quant.placement import block_axis
from qcompiler.quant.settings.config import load_json_strict
from qcompiler.quant.settings.untrusted import short

VERSIONS = ("1.0.0", "2.0.0")
_FLOAT_DTYPES = {16: "float16", 32: "float32"}
_FLOAT_NAMES = {v: k for k, v in _FLOAT_DTYPES.items() if k in FLOAT_BITS}
MAX_NAME_CHARS = 60
# what a file may hold: weight/activation grids and int32 biases (as written by write_encodings); an int32 entry
# used for a weight or an activation is refused when it is checked against the model
READ_INT_BITS = tuple(sorted(set(INT_BITS) | set(BIAS_BITS)))
# narrowed weight ranges a file may name (bw 7 = ORT's reduce_range): stored in the next width of INT_BITS
RANGE_BITS = tuple(b for b in range(5, max(INT_BITS)) if b not in INT_BITS)
FILE_INT_BITS = tuple(sorted(set(READ_INT_BITS) | set(RANGE_BITS)))


def storage_bits(bw: int) -> int:
    """The Q/DQ storage width of a grid of `bw` bits (itself for 4/8/16/32, else the next of INT_BITS)."""
    return bw if bw in READ_INT_BITS else min(b for b in INT_BITS if b >= bw)


def grid_bits(enc: Encoding) -> int:
    """The bits of the grid `enc` really uses: its narrowed `range_bits` when set, else its storage bits."""
    rb = enc.meta.get("range_bits") if enc.dtype != "float" else None
    return int(rb) if rb and int(rb) < int(enc.bits) else int(enc.bits)


def grid_limits(enc: Encoding) -> tuple:
    """(qmin, qmax) of the grid `enc` really uses, in its storage's integer domain."""
    b = grid_bits(enc)
    return (-(2 ** (b - 1)), 2 ** (b - 1) - 1) if enc.signed else (0, 2 ** b - 1)


# --- writing ----------------------------------------------------------------------------------------------
def _enc_type(enc: Encoding) -> str:
    if enc.block_size:
        return "PER_BLOCK"
    return "PER_CHANNEL" if enc.per_channel else "PER_TENSOR"


def _floats(a) -> list:
    return [float(x) for x in np.asarray(a, np.float64).reshape(-1)]


def _ints(a) -> list:
    return [int(x) for x in np.asarray(a, np.int64).reshape(-1)]


def _nested(a, cast):
    a = np.asarray(a)
    return cast(a.item()) if a.ndim == 0 else [_nested(x, cast) for x in a]


def _aimet_offset(enc: Encoding, bw: int) -> np.ndarray:
    """AIMET's offset on the unsigned `bw`-bit grid: real = (q + offset) * scale, q in [0, 2^bw - 1]."""
    zp = np.asarray(enc.zero_point, np.int64)
    return -(zp + 2 ** (bw - 1)) if enc.signed else -zp


def _collapse_kernel(scale: np.ndarray, zp: np.ndarray):
    """Per-block scales of a rank>2 weight (Conv) in AIMET's form, the kernel dims cut to 1, when they are equal
    across the kernel window; else None."""
    if scale.ndim <= 2 or all(d == 1 for d in scale.shape[2:]):
        return None
    flat_s = scale.reshape(scale.shape[:2] + (-1,))
    flat_z = zp.reshape(zp.shape[:2] + (-1,))
    if np.all(flat_s == flat_s[..., :1]) and np.all(flat_z == flat_z[..., :1]):
        keep = (slice(None), slice(None)) + (slice(0, 1),) * (scale.ndim - 2)
        return scale[keep], zp[keep]
    return None


def aimet_block_layout(enc: Encoding, v1: bool):
    """(scale, zero point) of a per-block encoding as AIMET lays them out: 1.0.0 lists a 2-D weight blocked along
    axis 0 output channel first (transposed); Conv scales equal over the kernel take AIMET's (.., .., 1, 1)."""
    scale = np.asarray(enc.scale)
    zp = np.broadcast_to(np.asarray(enc.zero_point, np.int64), scale.shape)
    c = _collapse_kernel(scale, zp)
    if c is not None:
        return c
    if v1 and scale.ndim == 2 and enc.axis == 0:
        return scale.T, zp.T
    return scale, zp


def _entry_v1(name: str, enc: Encoding) -> dict:
    if enc.dtype == "float":
        return {"name": name, "enc_type": "PER_TENSOR", "dtype": "FLOAT", "bw": int(enc.bits)}
    bw = grid_bits(enc)
    if per_tensor(enc):    # one number in whatever shape it came: (), (1,), (1, 1), a numpy scalar
        scale = [float(scalar(enc.scale, f"'{name[:80]}' scale"))]
        offset = [int(scalar(_aimet_offset(enc, bw), "offset"))]
    elif enc.block_size:
        s, zp = aimet_block_layout(enc, v1=True)
        scale = _floats(s)
        offset = _ints(_aimet_offset(Encoding(scale=s, zero_point=zp, bits=enc.bits, signed=enc.signed), bw))
    else:
        scale, offset = _floats(enc.scale), _ints(_aimet_offset(enc, bw))
    e = {"name": name, "enc_type": _enc_type(enc), "dtype": "INT", "bw": bw,
         "is_sym": bool(enc.symmetric), "scale": scale, "offset": offset}
    if enc.block_size:
        e["block_size"] = int(enc.block_size)
    return e


def _output_dtype(enc: Encoding) -> str:
    if enc.dtype == "float":
        return _FLOAT_DTYPES.get(enc.bits, f"float{enc.bits}")
    return f"{'int' if enc.signed else 'uint'}{enc.bits}"


def _entry_v2(name: str, enc: Encoding) -> dict:
    e = {"name": name, "output_dtype": _output_dtype(enc)}
    if enc.dtype == "float":
        return e
    if per_tensor(enc):    # a number, not a list, whatever shape of size 1 the encoding holds
        e["y_scale"] = float(scalar(enc.scale, f"'{name[:80]}' scale"))
        zp = np.asarray(int(scalar(enc.zero_point, f"'{name[:80]}' zero point")), np.int64)
    elif enc.block_size:
        s, zp = aimet_block_layout(enc, v1=False)
        e["y_scale"] = _nested(np.asarray(s, np.float64), float)
    else:
        e["y_scale"] = _nested(np.asarray(enc.scale, np.float64), float)
        zp = np.broadcast_to(np.asarray(enc.zero_point, np.int64), np.shape(enc.scale))
    if np.any(zp != 0):
        e["y_zero_point"] = _nested(zp, int)
    if enc.per_channel or enc.block_size:
        e["axis"] = int(enc.axis if enc.axis is not None else 0)
    if enc.block_size:
        e["block_size"] = int(enc.block_size)
    return e


def write_encodings(path: Optional[str], activations: dict, params: dict, version: str = "1.0.0",
                    quantizer_args: Optional[dict] = None, excluded_layers: Iterable = (), protect: tuple = ()) -> dict:
    """The encodings JSON dict for `version`; also written atomically to `path` when one is given (never over a
    file in `protect`)."""
    if version not in VERSIONS:
        raise ConfigError(f"encodings version '{version}' is not supported (use {' or '.join(VERSIONS)})")
    for name, enc in list(activations.items()) + list(params.items()):
        s = np.asarray(enc.scale, np.float64)
        if enc.dtype != "float" and (not np.all(np.isfinite(s)) or np.any(s <= 0)):
            raise ConfigError(f"encoding of '{name}': scale must be finite and positive, got {s.reshape(-1)[:4]}")
    if version == "1.0.0":
        doc = {"version": "1.0.0",
               "activation_encodings": [_entry_v1(n, e) for n, e in activations.items()],
               "param_encodings": [_entry_v1(n, e) for n, e in params.items()
                                   if e.dtype == "float" or e.bits not in BIAS_BITS],
               "quantizer_args": dict(quantizer_args or {}),
               "excluded_layers": list(excluded_layers)}
    else:
        seen, entries = set(), []
        for n, e in list(activations.items()) + list(params.items()):
            if n in seen:
                raise ConfigError(f"encoding of '{n}' given twice (as activation and param); 2.0.0 has one list")
            seen.add(n)
            entries.append(_entry_v2(n, e))
        doc = {"version": "2.0.0", "encodings": entries}
    if path is not None:
        write_atomic(path, json.dumps(doc, indent=2) + "\n", protect=protect)
    return doc


# --- reading ----------------------------------------------------------------------------------------------
class _Reader:
    def __init__(self, path: str):
        self.path = path

    def err(self, entry: str, msg: str) -> ConfigError:
        return ConfigError(f"{self.path}: encoding {_name(entry)}: {msg}")

    def scale(self, v, entry, nested=False) -> np.ndarray:
        try:
            a = np.asarray(v, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            raise self.err(entry, f"scale must be numbers, got {short(v)}") from None
        if a.size == 0:
            raise self.err(entry, "scale must be finite, positive and non-empty (it is empty)")
        if not np.all(np.isfinite(a)):
            raise self.err(entry, "scale must be finite, positive and non-empty (found NaN or Inf)")
        if np.any(a <= 0):
            raise self.err(entry, "scale must be finite, positive and non-empty (found a zero or negative scale)")
        with np.errstate(all="ignore"):   # 3.5e38 -> inf: refused below, without a RuntimeWarning line first
            f32 = a.astype(np.float32)
        if not np.all(np.isfinite(f32)) or np.any(f32 <= 0):
            raise self.err(entry, "scale overflows or underflows float32")
        return f32

    def ints(self, v, entry, what) -> np.ndarray:
        try:
            a = np.asarray(v)
        except (TypeError, ValueError, OverflowError):
            raise self.err(entry, f"{what} must be integers, got {short(v)}") from None
        if a.dtype.kind == "f" and np.all(np.isfinite(a)) and np.all(np.abs(a) < 2.0 ** 53) \
                and np.all(a == np.round(a)):
            a = a.astype(np.int64)
        if a.size == 0 or a.dtype.kind not in "iu":
            raise self.err(entry, f"{what} must be integers, got {short(v)}")
        if a.dtype.kind == "u" and np.any(a > np.iinfo(np.int64).max):
            raise self.err(entry, f"{what} outside the integer range")
        return a.astype(np.int64)

    def bits(self, v, entry, allowed=READ_INT_BITS, dtype="INT") -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v not in allowed:
            raise self.err(entry, f"bit width {short(v)} is not supported for dtype {dtype} "
                           f"(supported: {', '.join(map(str, allowed))})")
        return v

    def boolean(self, v, entry, key) -> bool:
        if isinstance(v, bool):
            return v
        if v in ("True", "False", "true", "false"):
            return v in ("True", "true")
        raise self.err(entry, f"'{key}' must be a boolean, got {short(v)}")


def _name(entry) -> str:
    """An entry's name for a message: quoted, at most ~60 characters."""
    return short(entry, MAX_NAME_CHARS) if isinstance(entry, str) else short(entry)


def _narrowed(enc: Encoding, bw: int) -> Encoding:
    """`enc` on a `bw`-bit grid stored in the next width of INT_BITS (`meta["range_bits"]`)."""
    if bw not in READ_INT_BITS:
        enc.bits = storage_bits(bw)
        enc.meta = dict(enc.meta, range_bits=bw)
    return enc


def _from_aimet_offset(r: _Reader, entry: str, scale, offset, bits: int, sym: bool, **kw) -> Encoding:
    """Encoding from AIMET's (scale, unsigned-grid offset) pair; see the module docstring for signedness. A
    narrowed grid (`bits` in RANGE_BITS) is stored in the next width of INT_BITS with `meta["range_bits"]`."""
    offset = r.ints(offset, entry, "offset")
    if offset.size != scale.size and offset.size != 1:
        raise r.err(entry, f"{scale.size} scales but {offset.size} offsets")
    offset = np.broadcast_to(offset, scale.shape).copy()
    if np.any(offset > 0) or np.any(offset < -(2 ** bits - 1)):
        raise r.err(entry, f"offset outside the {bits}-bit grid")
    signed = bool(sym and np.all(offset == -(2 ** (bits - 1))))
    zp = (-offset - 2 ** (bits - 1)) if signed else -offset
    if scale.size == 1 and "axis" not in kw:
        scale, zp = scale.reshape(()), zp.reshape(())
    enc = Encoding(scale=scale, zero_point=zp.astype(np.int64), bits=bits, symmetric=sym, signed=signed,
                   frozen=True, **kw)
    return _narrowed(enc, bits)


def _no_zero_point_shift(r: _Reader, e: dict, name: str) -> None:
    """AIMET's `zero_point_shift` (a fractional offset) has no Q/DQ form: refused unless it is all zeros."""
    zs = e.get("zero_point_shift")
    if zs is None:
        return
    try:
        a = np.asarray(zs, np.float64)
    except (TypeError, ValueError, OverflowError):
        raise r.err(name, f"zero_point_shift must be numbers, got {short(zs)}") from None
    if np.any(a != 0):
        raise r.err(name, "non-zero 'zero_point_shift' (a fractional offset) has no QuantizeLinear form; "
                    "not supported")


def _read_v1_entry(r: _Reader, e) -> tuple:
    if not isinstance(e, dict) or not isinstance(e.get("name"), str):
        raise ConfigError(f"{r.path}: encoding entry without a string 'name': {short(e)}")
    name = e["name"]
    for k in ("bw",):
        if k not in e:
            raise r.err(name, f"missing '{k}'")
    dtype = e.get("dtype", "INT")
    if not isinstance(dtype, str) or dtype not in ("INT", "FLOAT"):
        raise r.err(name, f"dtype must be INT or FLOAT, got {short(dtype)}")
    bits = r.bits(e["bw"], name, FLOAT_BITS if dtype == "FLOAT" else FILE_INT_BITS, dtype)
    if dtype == "FLOAT":
        return name, Encoding(scale=np.float32(1.0), zero_point=np.int64(0), bits=bits, dtype="float", frozen=True)
    for k in ("scale", "offset", "is_sym", "enc_type"):
        if k not in e:
            raise r.err(name, f"missing '{k}'")
    _no_zero_point_shift(r, e, name)
    enc_type = e["enc_type"]
    if not isinstance(enc_type, str) or enc_type not in ("PER_TENSOR", "PER_CHANNEL", "PER_BLOCK"):
        raise r.err(name, f"enc_type {short(enc_type)} is not supported (PER_TENSOR, PER_CHANNEL, PER_BLOCK)")
    scale = r.scale(e["scale"], name).reshape(-1)
    kw = {}
    if enc_type == "PER_TENSOR" and scale.size != 1:
        raise r.err(name, f"PER_TENSOR with {scale.size} scales")
    if enc_type in ("PER_CHANNEL", "PER_BLOCK"):
        kw = {"axis": 0, "meta": {"axis_known": False}}
    if enc_type == "PER_BLOCK":
        bs = e.get("block_size")
        if isinstance(bs, bool) or not isinstance(bs, int) or bs <= 0:
            raise r.err(name, f"PER_BLOCK needs a positive 'block_size', got {short(bs)}")
        kw["block_size"] = bs
    sym = r.boolean(e["is_sym"], name, "is_sym")
    return name, _from_aimet_offset(r, name, scale, e["offset"], bits, sym, **kw)


def _read_v1(r: _Reader, doc: dict) -> tuple:
    out = []
    for key in ("activation_encodings", "param_encodings"):
        lst = doc.get(key, [])
        if not isinstance(lst, list):
            raise ConfigError(f"{r.path}: '{key}' must be a list in version 1.0.0, got {short(lst)}")
        d = {}
        for e in lst:
            name, enc = _read_v1_entry(r, e)
            if name in d:
                raise r.err(name, f"listed twice in '{key}'")
            d[name] = enc
        out.append(d)
    return out[0], out[1]


def _read_v2_entry(r: _Reader, e) -> tuple:
    if not isinstance(e, dict) or not isinstance(e.get("name"), str):
        raise ConfigError(f"{r.path}: encoding entry without a string 'name': {short(e)}")
    name = e["name"]
    od = e.get("output_dtype")
    if not isinstance(od, str):
        raise r.err(name, "missing 'output_dtype'")
    if od in _FLOAT_NAMES:
        return name, Encoding(scale=np.float32(1.0), zero_point=np.int64(0), bits=_FLOAT_NAMES[od], dtype="float",
                              frozen=True, meta={"output_dtype": od})
    supported = [f"{p}{b}" for b in FILE_INT_BITS for p in ("int", "uint")] + list(_FLOAT_NAMES)
    if od.startswith("uint"):
        signed, b = False, od[4:]
    elif od.startswith("int"):
        signed, b = True, od[3:]
    else:
        raise r.err(name, f"output_dtype {short(od)} is not supported (supported: {', '.join(supported)})")
    if not b.isdigit() or len(b) > 3 or int(b) not in FILE_INT_BITS:
        raise r.err(name, f"output_dtype {short(od)} is not supported (supported: {', '.join(supported)})")
    bits = int(b)
    if "y_scale" not in e:
        raise r.err(name, "missing 'y_scale'")
    if isinstance(e["y_scale"], dict):
        raise r.err(name, "y_scale given as a dict (encodings 2.1.0 LPBQ) is not supported")
    scale = r.scale(e["y_scale"], name)
    if "y_zero_point" in e and e["y_zero_point"] is not None:
        zp = r.ints(e["y_zero_point"], name, "y_zero_point")
        if zp.shape != scale.shape and zp.size != 1:
            raise r.err(name, f"y_zero_point shape {zp.shape} differs from y_scale shape {scale.shape}")
        zp = np.broadcast_to(zp.reshape(zp.shape if zp.shape == scale.shape else ()), scale.shape).copy()
    else:
        zp = np.zeros(scale.shape, np.int64)
    enc = Encoding(scale=scale, zero_point=zp, bits=bits, signed=signed, frozen=True)
    if np.any(zp < enc.qmin) or np.any(zp > enc.qmax):
        raise r.err(name, f"y_zero_point outside the {od} range")
    enc = _narrowed(enc, bits)
    enc.symmetric = bool(signed and np.all(zp == 0))
    if "axis" in e:
        ax = e["axis"]
        if isinstance(ax, bool) or not isinstance(ax, int):
            raise r.err(name, f"axis must be an integer, got {short(ax)}")
        enc.axis = ax
    elif scale.ndim > 0 and scale.size > 1:
        raise r.err(name, "several scales but no 'axis'")
    if "block_size" in e:
        bs = e["block_size"]
        if isinstance(bs, bool) or not isinstance(bs, int) or bs <= 0:
            raise r.err(name, f"block_size must be a positive integer, got {short(bs)}")
        enc.block_size = bs
    if enc.axis is None and scale.ndim > 0:
        enc.scale, enc.zero_point = scale.reshape(()), zp.reshape(())
    return name, enc


def _read_v2(r: _Reader, doc: dict, param_names) -> tuple:
    lst = doc.get("encodings")
    if not isinstance(lst, list):
        raise ConfigError(f"{r.path}: version 2.0.0 needs an 'encodings' list")
    acts, params = {}, {}
    pn = set(param_names or ())
    for e in lst:
        name, enc = _read_v2_entry(r, e)
        d = params if name in pn else acts
        if name in acts or name in params:
            raise r.err(name, "listed twice")
        d[name] = enc
    return acts, params


def _read_legacy(r: _Reader, doc: dict) -> tuple:
    out = []
    for key in ("activation_encodings", "param_encodings"):
        section = doc.get(key, {})
        if not isinstance(section, dict):
            raise ConfigError(f"{r.path}: legacy '{key}' must map names to lists of encodings")
        d = {}
        for name, items in section.items():
            if isinstance(items, dict):
                items = [items]
            if not isinstance(name, str):
                raise ConfigError(f"{r.path}: legacy '{key}' has a non-string name {short(name)}")
            if not isinstance(items, list) or not items or not all(isinstance(i, dict) for i in items):
                raise r.err(name, "expected a non-empty list of {bitwidth, scale, offset, ...}")
            for k in ("bitwidth", "scale", "offset"):
                if any(k not in i for i in items):
                    raise r.err(name, f"missing '{k}'")
            dt = items[0].get("dtype", "int")
            if not isinstance(dt, str) or dt.lower() not in ("int", "float"):
                raise r.err(name, f"dtype must be int or float, got {short(dt)}")
            is_float = dt.lower() == "float"
            bits = r.bits(items[0]["bitwidth"], name, FLOAT_BITS if is_float else FILE_INT_BITS, dt.upper())
            if any(i["bitwidth"] != bits or i.get("dtype", "int") != dt for i in items):
                raise r.err(name, "channels with different bit widths or dtypes")
            if is_float:
                d[name] = Encoding(scale=np.float32(1.0), zero_point=np.int64(0), bits=bits, dtype="float",
                                   frozen=True)
                continue
            sym = r.boolean(items[0].get("is_symmetric", "False"), name, "is_symmetric")
            scale = r.scale([i["scale"] for i in items], name)
            kw = {"axis": 0, "meta": {"axis_known": False}} if len(items) > 1 else {}
            d[name] = _from_aimet_offset(r, name, scale, [i["offset"] for i in items], bits, sym, **kw)
        out.append(d)
    return out[0], out[1]


def read_encodings(path: str, param_names: Optional[Iterable[str]] = None) -> tuple:
    """`(activations, params)`: dicts of name -> frozen Encoding from an AIMET encodings file.

    Version 2.0.0 keeps one list; names in `param_names` go to `params`, the rest to `activations`.
    """
    doc = load_json_strict(path, "encodings file")
    r = _Reader(path)
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: encodings file must hold a JSON object")
    version = doc.get("version")
    if version == "2.0.0" or (version is None and "encodings" in doc):
        return _read_v2(r, doc, param_names)
    if isinstance(doc.get("activation_encodings"), dict) or isinstance(doc.get("param_encodings"), dict):
        return _read_legacy(r, doc)
    if version == "1.0.0" or (version is None and isinstance(doc.get("activation_encodings"), list)):
        return _read_v1(r, doc)
    if "activation_encodings" not in doc and "param_encodings" not in doc:
        raise ConfigError(f"{path}: not an AIMET encodings file (no 'activation_encodings', 'param_encodings' "
                          f"or 'encodings')")
    raise ConfigError(f"{path}: encodings version {short(version)} is not supported (1.0.0, 2.0.0, legacy 0.6.1)")


def needs_wide_opset(path: str) -> bool:
    """Whether the file holds a grid that only opset 21 can carry: an integer weight or activation entry stored
    in other than 8 bits (int4, int16; a narrowed 5-7 bit range is stored in int8) or a per-block entry.
    32-bit entries (biases, re-derived on load) and FLOAT entries need nothing. The output opset is chosen from
    this before the pipeline runs (qcompiler/quant/core/opset.py), so a file's int4/int16/per-block encodings need no
    --weight-bits/--act-bits/--block-size. A malformed file is the same ConfigError line `read_encodings` gives."""
    acts, params = read_encodings(path)
    return any(e.dtype != "float" and e.bits not in BIAS_BITS and (storage_bits(e.bits) != 8 or e.block_size)
               for d in (acts, params) for e in d.values())


# --- checking against the model -----------------------------------------------------------------------------
def _weight_or_activation_bits(path, name, enc, what):
    if enc.bits not in INT_BITS:
        raise ConfigError(f"{path}: encoding {_name(name)}: {enc.bits}-bit grid for {what}; supported: "
                          f"{', '.join(map(str, INT_BITS))} bits ({', '.join(map(str, BIAS_BITS))} is for biases)")


def check_activation_encoding(path: str, name: str, enc: Encoding) -> None:
    """An activation's encoding must be one scale (qcompiler quantizes activations per tensor) on a full grid."""
    if enc.dtype == "float":
        return
    _weight_or_activation_bits(path, name, enc, "an activation")
    if grid_bits(enc) != enc.bits:
        raise ConfigError(f"{path}: encoding {_name(name)}: {grid_bits(enc)}-bit grid for an activation; "
                          f"activations are quantized on full {', '.join(map(str, INT_BITS))}-bit grids "
                          f"(narrowed ranges are for weights)")
    if enc.block_size or np.size(enc.scale) != 1:
        raise ConfigError(f"{path}: encoding {_name(name)}: {np.size(enc.scale)} scales"
                          f"{' per block' if enc.block_size else ''} for an activation; activations are "
                          f"quantized per tensor (one scale)")
    enc.scale = np.asarray(enc.scale, np.float32).reshape(())
    enc.zero_point = np.asarray(enc.zero_point, np.int64).reshape(())
    enc.axis = None


def aimet_axes(node, slot: int, rank: int) -> tuple:
    """(channel axis, block axis) of weight input `slot` of `node` as AIMET quantizes it: the output-channel axis
    (Conv 0, ConvTranspose 1, Gemm 0 with transB else 1, MatMul the last) and the reduction axis blocks run
    along (placement.block_axis); None where the op has no such axis."""
    channel = None
    if slot == 1 and rank >= 1:
        channel = output_axis(node) if node.op_type != "MatMul" else rank - 1
        if channel is not None and not 0 <= channel < rank:
            channel = None
    return channel, block_axis(node, slot, rank)


def _block_scales(err, enc: Encoding, shape: tuple, axis: int, axis_known: bool):
    """(scale, zero point) of a per-block encoding in onnxruntime's layout: the weight's shape with dim `axis`
    cut to ceil(dim / block_size). Accepts that layout (flat or shaped), AIMET's 1.0.0 output-channel-first
    order of a 2-D weight blocked along axis 0 (transposed back), and AIMET's Conv/ConvTranspose layout with the
    kernel dims 1 (repeated over the kernel window). See the module docstring."""
    bs, dim = int(enc.block_size), shape[axis]
    if bs > dim:
        raise err(f"block_size {bs} is larger than dim {axis} of the weight ({dim}, shape {shape})")
    want = shape[:axis] + (-(-dim // bs),) + shape[axis + 1:]
    collapsed = want[:2] + (1,) * (len(want) - 2) if len(want) > 2 else want
    scale = np.asarray(enc.scale, np.float32)
    zp = np.broadcast_to(np.asarray(enc.zero_point, np.int64), scale.shape)
    n = scale.size
    n_want = int(np.prod(want, dtype=np.int64))
    if not axis_known and len(want) == 2 and axis == 0 and n == n_want:
        # 1.0.0: AIMET lists the scales output channel first, (N, K/bs), for a [K, N] weight
        return scale.reshape(want[::-1]).T.copy(), np.array(zp).reshape(want[::-1]).T.copy()
    if n == n_want and (scale.ndim <= 1 or scale.shape == want or not axis_known):
        return scale.reshape(want), np.array(zp).reshape(want)
    n_col = int(np.prod(collapsed, dtype=np.int64))
    if len(want) > 2 and n == n_col and (scale.ndim <= 1 or scale.shape == collapsed or not axis_known):
        s = np.broadcast_to(scale.reshape(collapsed), want).copy()
        return s, np.broadcast_to(np.array(zp).reshape(collapsed), want).copy()
    also = f" or {collapsed} (AIMET's Conv layout)" if len(want) > 2 and collapsed != want else ""
    raise err(f"{n} scales of shape {np.shape(enc.scale)} do not fit block_size {bs} on axis {axis} of a weight of "
              f"shape {shape} (expected shape {want}{also})")


def fit_param_encoding(path: str, name: str, enc: Encoding, shape, axis_hint: Optional[int] = None,
                       channel_axis: Optional[int] = None, block_axis: Optional[int] = None) -> Encoding:
    """Check a weight's encoding against the weight's `shape` and fix its axis and layout; ConfigError names the
    entry.

    1.0.0 and legacy files record no axis (`meta["axis_known"]` False): a per-channel entry takes `channel_axis`
    (the op's output-channel axis, `aimet_axes`), a per-block entry `block_axis`; `axis_hint` (the axis placement
    chose) stands in for either when it is None, else 0. The scale count must be the channel count on the axis
    (per-channel) or ceil(dim / block_size) times the other dims (per-block, in either layout of
    `_block_scales`); the scale is reshaped to what Q/DQ expects. Only shapes and counts are compared: no weight
    data is read.
    """
    if enc.dtype == "float":
        return enc
    _weight_or_activation_bits(path, name, enc, "a weight")

    def err(msg):
        return ConfigError(f"{path}: encoding {_name(name)}: {msg}")
    n = int(np.size(enc.scale))
    if enc.axis is None and not enc.block_size:
        if n != 1:
            raise err(f"{n} scales but no axis")
        return enc
    if shape is None or any(not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
        raise err("per-channel or per-block encoding for a weight whose shape is not known")
    shape = tuple(int(d) for d in shape)
    rank = len(shape)
    if rank == 0:
        raise err("per-channel or per-block encoding for a scalar weight")
    known = enc.meta.get("axis_known", True) is not False
    if known:
        axis = enc.axis
    else:
        derived = block_axis if enc.block_size else channel_axis
        axis = derived if derived is not None else (axis_hint if axis_hint is not None else 0)
    if not -rank <= axis < rank:
        raise err(f"axis {axis} is out of range for the weight's rank {rank} (shape {shape})")
    axis %= rank
    if enc.block_size:
        enc.scale, enc.zero_point = _block_scales(err, enc, shape, axis, known)
    else:
        dim = shape[axis]
        if n != dim:
            raise err(f"{n} scales but the weight has {dim} channels on axis {axis} (shape {shape})")
        zp = np.broadcast_to(np.asarray(enc.zero_point, np.int64), np.shape(enc.scale))
        enc.scale = np.asarray(enc.scale, np.float32).reshape((dim,))
        enc.zero_point = np.array(zp, np.int64).reshape((dim,))
    enc.axis = axis
    if "axis_known" in enc.meta:
        enc.meta["axis_known"] = True
    return enc


__all__ = ["write_encodings", "read_encodings", "needs_wide_opset", "fit_param_encoding", "check_activation_encoding",
           "aimet_axes", "aimet_block_layout", "grid_bits", "grid_limits", "storage_bits"]
