"""Pattern counts on a small LLM-shaped graph (the 90k-node timing lives in benchmarks/bench_patterns.py)."""

from benchmarks.llm_graph import NODES_PER_LAYER, make_llm_graph
from qcompiler import model_from_proto
from qcompiler.patterns import find_matches


def test_small_llm_graph_counts():
    g = model_from_proto(make_llm_graph(4)).graph
    assert len(g) == 4 * NODES_PER_LAYER + 1
    assert len(find_matches(g, "layernorm")) == 8
    assert len(find_matches(g, "gelu")) == 4
    assert len(find_matches(g, "matmul_add")) == 24
    assert find_matches(g, "rmsnorm") == []
    ms = find_matches(g, "gelu")
    assert len({m.constants["half"].name for m in ms}) == 1  # one shared 0.5, recorded as structural
