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
                     axis: Optional[int] = None, strict_symmetric: bool = False) -> Encoding:
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


def quantize_dequantize(x: np.ndarray, enc: Encoding) -> np.ndarray:
    """Fake-quantize `x` with `enc` (numpy reference of Q followed by DQ), broadcasting along `enc.axis`."""
    if per_tensor(enc):
        scale, zp = np.float64(scalar(enc.scale, "scale")), np.float64(scalar(enc.zero_point, "zero point"))
    else:
        scale, zp = np.asarray(enc.scale, np.float64), np.asarray(enc.zero_point, np.float64)
    if enc.per_channel:
        shape = [1] * x.ndim
        shape[enc.axis] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    q = np.clip(np.round(x / scale) + zp, enc.qmin, enc.qmax)
    return ((q - zp) * scale).astype(x.dtype)
