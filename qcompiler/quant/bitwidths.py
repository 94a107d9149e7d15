"""The integer bit widths qcompiler quantizes weights and activations to: one list for the API and the CLI
(`quantize(weight_bits=, act_bits=)`), for configs and profiles to check against.

4 and 16 need opset 21 (QuantizeLinear int4/int16 in the standard domain); 8 runs from opset 13. Bias is a
separate int32 grid (qdq.py), not one of these.
"""
from __future__ import annotations

from ..errors import ConfigError

BIT_WIDTHS = (4, 8, 16)


def check_bits(value, what: str, error=ConfigError) -> int:
    """`value` if it is one of BIT_WIDTHS (an int, never a bool, float or str); else `error` naming `what`."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in BIT_WIDTHS:
        from ..arguments import got
        raise error(f"{what}={got(value)}: supported bit widths are {', '.join(map(str, BIT_WIDTHS))}")
    return value
