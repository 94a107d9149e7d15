"""The mixed-precision arguments of `quantize`: the budget (`max_drop`), the metric, where to run."""
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


def check_budget(max_drop, metric, ray, executor):
    """(max_drop as a fraction, metric, ray) checked: one ArgumentError line naming the argument."""
    from ...arguments import got
    from ..executor import check_ray
    max_drop = parse_max_drop(max_drop)
    if metric is not None and not callable(metric):
        raise ArgumentError(f"metric must be a callable metric(outputs, reference) -> score, got {got(metric)}")
    ray = check_ray(ray)
    if executor is not None and not callable(getattr(executor, "map", None)):
        raise ArgumentError(f"executor must have map(fn, items), got {got(executor)}")
    if max_drop is None and (metric is not None or ray is not None or executor is not None):
        what = "metric" if metric is not None else "ray" if ray is not None else "executor"
        raise ArgumentError(f"{what} is for the mixed-precision search: give max_drop too")
    return max_drop, metric, ray
