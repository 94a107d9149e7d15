"""`latency-search`: take out the Q/DQ pairs between two float kernels while the output SQNR stays at or above
the floor (`balanced`: the SQNR before; `latency`: `--latency-budget-db` below it). qcompiler/quant/latency_search.py.
A no-op for `--optimize accuracy` and for targets without a fusion table."""
from __future__ import annotations

from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.context import QuantPass
from qcompiler.quant.latency_search import run_latency_search


@register_pass
class LatencySearch(QuantPass):
    name = "latency-search"
    description = "take out Q/DQ pairs between float kernels under an output SQNR floor (--optimize)"
    preserves_semantics = False
    requires = ("quant-context", "qdq")

    def run(self, ctx) -> PassResult:
        out = run_latency_search(ctx)
        ctx.latency_search = out.to_dict()
        return PassResult(bool(out.removed), {"candidates": out.candidates, "removed": len(out.removed),
                                              "trials": out.trials})
