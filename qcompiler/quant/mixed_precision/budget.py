"""The mixed-precision budget `max_drop` of `quantize` (its checks against metric/ray/executor: switches.NEEDS)."""
from __future__ import annotations

import math

from ...errors import ArgumentError


def parse_max_drop(value):
    """0.01, "0.01" or "1%" -> 0.01; None -> None. A budget is a fraction in (0, 1)."""
    from ...arguments import got
    if value is None:
        return None
    v = value
    if isinstance(v, str):
        t = v.strip()
        try:
            v = float(t[:-1]) / 100.0 if t.endswith("%") else float(t)
        except ValueError:
            raise ArgumentError(f"max_drop must be a fraction (0.01) or a percentage ('1%'), got {got(value)}") \
                from None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)) \
            or not 0 < float(v) < 1:
        raise ArgumentError(f"max_drop must be a fraction in (0, 1) such as 0.01, or '1%', got {got(value)}")
    return float(v)
