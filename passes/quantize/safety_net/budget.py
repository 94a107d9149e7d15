"""How long the safety net may measure: a time budget that grows with the model.

Rule: seconds = clamp(SECONDS_PER_NODE_RUN × t × n, MIN_SECONDS, MAX_SECONDS), where t is the wall time of one
trial run of one sample (the first trial's, all quantizers on: the switchable model, a little slower than the
float one) and n the number of main-graph nodes that are not Q/DQ. A trial costs about TRIAL_SAMPLES × t and the
region search tries about as many regions as the graph has name scopes, which grow with n; so the budget buys a
similar number of trials on a small and a large model, with a floor (small models: the searches end well before)
and a cap (a model of 10 000 nodes at 1 s a sample must not search for hours). Until the first trial is timed
the budget is MIN_SECONDS.
"""
from __future__ import annotations

import time

SECONDS_PER_NODE_RUN = 2.0   # k in k × t × n
MIN_SECONDS = 30.0
MAX_SECONDS = 600.0
_QDQ = ("QuantizeLinear", "DequantizeLinear")


def budget_seconds(seconds_per_run: float, nodes: int) -> float:
    """The rule in the module docstring."""
    return float(min(MAX_SECONDS, max(MIN_SECONDS, SECONDS_PER_NODE_RUN * seconds_per_run * nodes)))


def float_nodes(model) -> int:
    """Main-graph nodes other than QuantizeLinear/DequantizeLinear (what the float model runs)."""
    return sum(1 for n in model.graph.nodes if n.op_type not in _QDQ)


class Clock:
    """The net's deadline: MIN_SECONDS from the start until `observe` gives the time of one run of one sample,
    then the budget of the rule (set once)."""

    def __init__(self, nodes: int, start: float = None):
        self.nodes = nodes
        self.start = time.perf_counter() if start is None else start
        self.seconds = MIN_SECONDS
        self.timed = False

    @classmethod
    def fixed(cls, seconds: float) -> "Clock":
        """A deadline of `seconds`, whatever the trials cost."""
        c = cls(0)
        c.seconds, c.timed = float(seconds), True
        return c

    def observe(self, seconds_per_run: float) -> None:
        if not self.timed:
            self.timed = True
            self.seconds = budget_seconds(seconds_per_run, self.nodes)

    def out(self) -> bool:
        return time.perf_counter() - self.start > self.seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.start
