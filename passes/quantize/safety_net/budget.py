"""How much the safety net may measure: a budget of sample runs that grows with the model.

Rule: runs = clamp(RUNS_PER_NODE × n, MIN_RUNS, MAX_RUNS), where n is the number of main-graph nodes that are not
Q/DQ; a trial spends one run per sample it measures. The region search tries about as many regions as the graph
has name scopes, which grow with n, so the budget buys a similar share of the searches on a small and a large
model, with a floor (small models: the searches' own caps end them first) and a cap.

NOTE: the budget counts runs, not seconds: a bound in seconds made the result depend on the machine's load (the
same minilm_l6 run kept 5 weights on a quiet machine and 2, below the floor, on a busy one). MAX_SECONDS of wall
time is a last resort only, for a model whose runs are so slow that its run budget would take longer; when it
ends a search the report and summary say so.
"""
from __future__ import annotations

import time

RUNS_PER_NODE = 2          # sample runs per float node
MIN_RUNS = 4000            # about 500 trials of 8 samples: the quantizer and region searches' own caps on a small model
MAX_RUNS = 40000
MAX_SECONDS = 600.0        # wall time, a last resort (see the NOTE above)
_QDQ = ("QuantizeLinear", "DequantizeLinear")


def budget_runs(nodes: int) -> int:
    """The rule in the module docstring."""
    return int(min(MAX_RUNS, max(MIN_RUNS, RUNS_PER_NODE * nodes)))


def float_nodes(model) -> int:
    """Main-graph nodes other than QuantizeLinear/DequantizeLinear (what the float model runs)."""
    return sum(1 for n in model.graph.nodes if n.op_type not in _QDQ)


class Clock:
    """The net's budget: `budget_runs(nodes)` sample runs (`spend`), and MAX_SECONDS of wall time at most."""

    def __init__(self, nodes: int, start: float = None):
        self.start = time.perf_counter() if start is None else start
        self.runs_budget = budget_runs(nodes)
        self.runs = 0
        self.seconds = MAX_SECONDS

    @classmethod
    def fixed(cls, seconds: float) -> "Clock":
        """Only a wall-time bound of `seconds` (a search whose trial cap is its budget)."""
        c = cls(0)
        c.runs_budget, c.seconds = float("inf"), float(seconds)
        return c

    @property
    def started(self) -> bool:
        """One trial has run (parallel trials start after it)."""
        return self.runs > 0

    def spend(self, runs: int) -> None:
        self.runs += int(runs)

    def out_of_runs(self) -> bool:
        return self.runs >= self.runs_budget

    def out(self) -> bool:
        return self.out_of_runs() or self.elapsed() > self.seconds

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def spent(self) -> str:
        """What ended the search, for the report: the run budget, or the wall-time last resort."""
        if self.out_of_runs():
            return f"its budget of {self.runs_budget} sample runs"
        return f"{self.seconds:g} s of wall time (the last-resort bound)"
