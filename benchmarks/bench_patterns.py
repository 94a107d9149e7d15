"""Pattern matching speed on the synthetic LLM graph: seconds per pattern group, and the total vs the 2 s budget.

Baseline: the budget of 2 s for all groups on ≥ 90k nodes (issue item 5). Prints ratio = total / budget.
Usage: python -m benchmarks.bench_patterns [min_nodes]
"""
from __future__ import annotations

import sys
import time

from benchmarks.llm_graph import layers_for_nodes, make_llm_graph

BUDGET_S = 2.0


def bench(min_nodes: int = 90_000, repeats: int = 2) -> dict:
    """Seconds (best of `repeats`) and match counts per group; matching starts from a freshly imported graph."""
    from qcompiler import model_from_proto
    from qcompiler.patterns import all_patterns, find_matches
    graph = model_from_proto(make_llm_graph(layers_for_nodes(min_nodes))).graph
    out = {"nodes": len(graph)}
    for r in range(repeats):
        for group in all_patterns():
            t = time.perf_counter()
            n = len(find_matches(graph, group))
            dt = time.perf_counter() - t
            best = out.get(group, (n, float("inf")))[1]
            out[group] = (n, min(best, dt) if r else dt)
    return out


def main() -> None:
    res = bench(int(sys.argv[1]) if len(sys.argv) > 1 else 90_000)
    total = 0.0
    print(f"graph: {res.pop('nodes')} nodes")
    for group, (n, dt) in res.items():
        total += dt
        print(f"  {group:18s} {n:6d} matches  {dt:.3f} s")
    print(f"total {total:.3f} s; ratio total/budget({BUDGET_S} s) = {total / BUDGET_S:.2f}")


if __name__ == "__main__":
    main()
