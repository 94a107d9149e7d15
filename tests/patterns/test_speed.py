"""Speed: all pattern groups on a ≥ 90k-node LLM-shaped graph in < 2 s (slow: building the graph takes ~10 s)."""
import time

import pytest

from benchmarks.llm_graph import NODES_PER_LAYER, layers_for_nodes, make_llm_graph
from qcompiler import model_from_proto
from qcompiler.patterns import all_patterns, find_matches


def test_small_llm_graph_counts():
    g = model_from_proto(make_llm_graph(4)).graph
    assert len(g) == 4 * NODES_PER_LAYER + 1
    assert len(find_matches(g, "layernorm")) == 8
    assert len(find_matches(g, "gelu")) == 4
    assert len(find_matches(g, "matmul_add")) == 24
    assert find_matches(g, "rmsnorm") == []
    ms = find_matches(g, "gelu")
    assert len({m.constants["half"].name for m in ms}) == 1  # one shared 0.5, recorded as structural


@pytest.mark.slow
def test_all_patterns_on_90k_nodes_under_2s():
    g = model_from_proto(make_llm_graph(layers_for_nodes(90_000))).graph
    assert len(g) >= 90_000
    # NOTE: CPU time, not wall time: helpers share 2 cores, and contention is not the matcher's cost
    t = time.process_time()
    counts = {name: len(find_matches(g, name)) for name in all_patterns()}
    dt = time.process_time() - t
    n = layers_for_nodes(90_000)
    assert counts["layernorm"] == 2 * n and counts["gelu"] == n and counts["matmul_add"] == 6 * n
    assert dt < 2.0, f"matching took {dt:.2f} s"
