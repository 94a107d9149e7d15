"""The bit widths qcompiler can emit: ONE source for configs, profiles, encodings files, the CLI and the API.

Weights and activations become QuantizeLinear/DequantizeLinear pairs on an integer grid of 4, 8 or 16 bits
(int4/uint4 and int16/uint16 need opset 21, which quantize() raises the model to); biases are int32 with
scale = s_input * s_weight (qdq.py). An encodings file may also mark a tensor as float (AIMET `dtype: FLOAT`,
2.0.0 `output_dtype: float16/float32`): that tensor is left unquantized. Anything else (int32 activations,
33 or 64 bits, float8) is refused with one line before any work.
"""
from __future__ import annotations

from typing import Type

from qcompiler.errors import ConfigError
from qcompiler.shorten import short_value

INT_BITS = (4, 8, 16)      # weight and activation Q/DQ grids
BIAS_BITS = (32,)          # bias: int32 only
FLOAT_BITS = (16, 32)      # float passthrough widths an encodings file may name (the tensor stays float)


def check_bits(v, what: str, allowed=INT_BITS, error: Type[Exception] = ConfigError) -> int:
    """`v` as an int if it is one of `allowed`, else `error` naming `what` (e.g. "file: weights.bits")."""
    if isinstance(v, bool) or not isinstance(v, int) or v not in allowed:
        raise error(f"{what}: bit width must be one of {', '.join(map(str, allowed))}, got {short_value(v)}")
    return int(v)


__all__ = ["INT_BITS", "BIAS_BITS", "FLOAT_BITS", "check_bits"]
