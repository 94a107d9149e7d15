"""Encodings: the (scale, offset, bits) triple that maps a float range onto an integer grid.

Convention (AIMET's): real = (q + offset) * scale, with q in [0, 2^bits - 1] for unsigned grids; ONNX's
zero_point = -offset. We store what ONNX QuantizeLinear needs (scale, zero_point, signedness) and derive the
AIMET fields on export. Per-channel encodings hold arrays along `axis`; per-block add `block_size`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np


@dataclass
class Encoding:
    """A quantization grid for one tensor (per-tensor: scalars; per-channel: arrays along `axis`)."""

    scale: np.ndarray                 # float32, shape () or (C,) or block shape
    zero_point: np.ndarray            # int64, same shape as scale, in the integer grid's domain
    bits: int = 8
    symmetric: bool = False
    signed: bool = False              # int8 (True) or uint8 (False) storage
    axis: Optional[int] = None        # per-channel axis, None = per-tensor
    block_size: Optional[int] = None  # per-block size along `axis`
    dtype: str = "int"                # "int" for integer grids, "float" for fp16/bf16 passthrough
    frozen: bool = False              # loaded from an encodings file; calibration must not change it
    meta: dict = field(default_factory=dict)

    @property
    def qmin(self) -> int:
        return -(2 ** (self.bits - 1)) if self.signed else 0

    @property
    def qmax(self) -> int:
        return 2 ** (self.bits - 1) - 1 if self.signed else 2 ** self.bits - 1

    # NOTE: int64 and float64 before any arithmetic: under numpy 2's promotion rules (NEP 50) a uint8 zero point
    # read from a model keeps its dtype in `0 - zp` and wraps around (0 - uint8(128) == 128)
    @property
    def min(self) -> np.ndarray:
        return (self.qmin - np.asarray(self.zero_point, np.int64)) * np.asarray(self.scale, np.float64)

    @property
    def max(self) -> np.ndarray:
        return (self.qmax - np.asarray(self.zero_point, np.int64)) * np.asarray(self.scale, np.float64)

    @property
    def offset(self) -> np.ndarray:
        """AIMET's offset for the unsigned grid (real = (q + offset) * scale)."""
        zp = np.asarray(self.zero_point, np.int64)
        return -(zp - self.qmin if self.signed else zp)

    @property
    def per_channel(self) -> bool:
        return self.axis is not None and np.ndim(self.scale) > 0


def scalar(a, what: str = "encoding field"):
    """The one number of a per-tensor encoding field as a Python float (int for integer dtypes).

    Accepts every form one number takes: Python float/int, numpy scalars of any dtype (float16, float32,
    float64, int64, ...), and arrays of size 1 of any rank: (), (1,), (1, 1). A real vector raises ValueError
    naming `what` and its shape.
    NOTE: numpy 2 refuses float() and int() on an array of shape (1,) ("only 0-dimensional arrays can be
    converted to Python scalars"); a per-tensor encoding read from a file or built from a 1-channel weight
    holds exactly that, so every float()/int() on an encoding field goes through here.
    """
    arr = np.asarray(a)
    if arr.size != 1:
        raise ValueError(f"{what}: expected one value (per-tensor), got an array of shape {arr.shape}")
    v = arr.reshape(()).item()
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else float(v)


def per_tensor(enc: "Encoding") -> bool:
    """True when `enc` has one scale for the whole tensor (no per-channel axis in use, no blocks)."""
    return not enc.block_size and not enc.per_channel


def compute_encoding(vmin, vmax, bits: int = 8, symmetric: bool = False, signed: Optional[bool] = None,
                     axis: Optional[int] = None) -> Encoding:
    """Encoding covering [vmin, vmax] (scalars or per-channel arrays). The range is widened to include 0.

    Symmetric grids are signed by default with zero_point 0 and scale = max|x| / (2^(b-1) - 1) (the
    restricted range -127..127 that ORT and TensorRT expect for weights); asymmetric grids are unsigned by
    default and nudge the zero point onto an integer.
    """
    vmin = np.minimum(np.asarray(vmin, np.float64), 0.0)
    vmax = np.maximum(np.asarray(vmax, np.float64), 0.0)
    if signed is None:
        signed = symmetric
    tiny = np.finfo(np.float32).tiny * 1e3
    if symmetric:
        absmax = np.maximum(np.abs(vmin), np.abs(vmax))
        half = 2 ** (bits - 1) - 1
        scale = np.maximum(absmax / half, tiny)
        if signed:
            zp = np.zeros_like(scale, dtype=np.int64)
        else:  # symmetric on an unsigned grid: zero at the middle
            zp = np.full(scale.shape, 2 ** (bits - 1), dtype=np.int64)
    else:
        levels = 2 ** bits - 1
        scale = np.maximum((vmax - vmin) / levels, tiny)
        qmin = -(2 ** (bits - 1)) if signed else 0
        zp = np.round(qmin - vmin / scale).astype(np.int64)
        zp = np.clip(zp, qmin, qmin + levels)
    return Encoding(scale=scale.astype(np.float32), zero_point=zp, bits=bits, symmetric=symmetric,
                    signed=bool(signed), axis=axis)


def broadcast_qparams(enc: Encoding, shape: tuple, dtype=np.float64):
    """(scale, zero point) as `dtype` arrays broadcastable to a tensor of `shape`: per-tensor scalars,
    per-channel reshaped along `axis`, per-block repeated `block_size` times along `axis` (last block cut)."""
    if per_tensor(enc):
        return (np.asarray(scalar(enc.scale, "per-tensor scale"), dtype)[()],
                np.asarray(scalar(enc.zero_point, "per-tensor zero point"), dtype)[()])
    scale = np.asarray(enc.scale, dtype)
    zp = np.asarray(enc.zero_point, dtype)
    if enc.block_size:
        k = shape[enc.axis]
        # NOTE: never more than K copies: a block longer than the axis (block_size 2**30, K = 64) is one block
        each = max(1, min(int(enc.block_size), k))
        scale = np.repeat(scale, each, axis=enc.axis).take(np.arange(k), axis=enc.axis)
        zp = np.repeat(np.broadcast_to(zp, np.shape(enc.scale)), each,
                       axis=enc.axis).take(np.arange(k), axis=enc.axis)
    elif enc.per_channel:
        bshape = [1] * len(shape)
        bshape[enc.axis] = -1
        scale, zp = scale.reshape(bshape), zp.reshape(bshape)
    return scale, zp


def quantize_dequantize(x: np.ndarray, enc: Encoding) -> np.ndarray:
    """Fake-quantize `x` with `enc`: exactly onnxruntime's QuantizeLinear then DequantizeLinear (the one fake-quant
    of the project). Per tensor, per channel along `enc.axis` or per block (`enc.block_size` along `enc.axis`).

    onnxruntime computes in float32: q = saturate(round_half_even(x / scale) + zero_point), then
    (q - zero_point) * scale, so this does too (a float64 division differs at exact ties). Returns x's dtype when
    x is floating (float64 callers get the float32 values widened), else float32.
    """
    x32 = np.asarray(x, np.float32)
    scale, zp = broadcast_qparams(enc, x32.shape, np.float32)
    q = np.rint(x32 / scale)
    q += zp
    np.clip(q, enc.qmin, enc.qmax, out=q)
    out = dequantize_linear(q, scale, zp)
    x = np.asarray(x)
    return out.astype(x.dtype, copy=False) if np.issubdtype(x.dtype, np.floating) else out


def dequantize_linear(q, scale, zero_point=None, axis: Optional[int] = None) -> np.ndarray:
    """onnxruntime's DequantizeLinear (no blocks): float32(q - zero_point) * scale in float32. `scale` and
    `zero_point` are scalars, arrays already broadcastable to q, or 1-D arrays along `axis` (opset-13..21)."""
    q = np.asarray(q)
    scale = np.asarray(scale, np.float32)
    zp = np.zeros((), np.int64) if zero_point is None else np.asarray(zero_point)
    if scale.ndim == 1 and q.ndim > 0 and axis is not None:
        shape = [1] * q.ndim
        shape[axis % q.ndim] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    if np.issubdtype(q.dtype, np.integer):
        diff = (q.astype(np.int64) - zp.astype(np.int64)).astype(np.float32)
    else:
        diff = (q - zp.astype(np.float32)).astype(np.float32, copy=False)
    return diff * scale
