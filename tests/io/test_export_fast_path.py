"""The fast export paths: reused NodeProtos never go out stale, and save_model's bytes equal the proto's.

Export hands back a node's imported NodeProto only when everything it was built from still matches; each test
mutates one thing through the Graph API (or a plain attribute) and checks the exported model shows it.
The networkx index is built on first access; verify() compares it with the use lists either way.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from benchmarks.llm_graph import make_llm_graph
from qcompiler import load_model, model_from_proto, model_to_proto, save_model, verify
from qcompiler.onnx_io.exporter import model_to_bytes
from qcompiler.passmanager import run_pipeline
from tests.helpers import run


def _model():
    return model_from_proto(make_llm_graph(2))


def _node_proto(model, name):
    return next(p for p in model_to_proto(model).graph.node if p.name == name)


def _mutate_rename(m):
    g = m.graph
    v = g.value("l0_ln1_mean_out")
    g.rename_value(v, "renamed_mean")
    return lambda: (_node_proto(m, "l0_ln1_mean").output[0] == "renamed_mean"
                    and _node_proto(m, "l0_ln1_sub").input[1] == "renamed_mean")


def _mutate_set_input(m):
    g = m.graph
    sub = next(n for n in g.nodes if n.name == "l0_ln1_sub")
    g.set_input(sub, 1, g.value("c_one"))
    return lambda: list(_node_proto(m, "l0_ln1_sub").input) == ["x", "c_one"]


def _mutate_attr(m):
    n = next(n for n in m.graph.nodes if n.name == "l0_softmax")
    n.set_attr("axis", 1)
    return lambda: onnx.helper.get_attribute_value(_node_proto(m, "l0_softmax").attribute[0]) == 1


def _mutate_name(m):
    n = next(n for n in m.graph.nodes if n.name == "l0_softmax")
    n.name = "softmax_renamed"
    return lambda: any(p.name == "softmax_renamed" for p in model_to_proto(m).graph.node)


def _mutate_doc(m):
    n = next(n for n in m.graph.nodes if n.name == "l0_softmax")
    n.doc_string = "changed"
    return lambda: _node_proto(m, "l0_softmax").doc_string == "changed"


def _mutate_insert(m):
    g = m.graph
    g.insert_after(g.value("l0_ln1_mean_out"), "Identity")
    return lambda: _node_proto(m, "l0_ln1_sub").input[1] != "l0_ln1_mean_out"


@pytest.mark.parametrize("mutate", [_mutate_rename, _mutate_set_input, _mutate_attr, _mutate_name, _mutate_doc,
                                    _mutate_insert])
@pytest.mark.parametrize("index_first", [False, True])
def test_mutation_is_never_hidden_by_a_reused_node_proto(mutate, index_first):
    m = _model()
    if index_first:
        m.graph.index  # materialize before mutating: later mutations keep it in step
    shows = mutate(m)
    verify(m.graph)
    assert shows()
    assert model_to_bytes(m) == model_to_proto(m).SerializeToString()


def test_save_bytes_equal_proto_and_run_the_same(tmp_path):
    proto = make_llm_graph(3)
    path = str(tmp_path / "m.onnx")
    onnx.save(proto, path)
    m = load_model(path)
    assert model_to_bytes(m) == model_to_proto(m).SerializeToString()
    run_pipeline(m, "canonicalize")
    verify(m.graph)
    out = str(tmp_path / "out.onnx")
    save_model(m, out)
    saved = onnx.load(out)
    assert saved == model_to_proto(m)
    assert len(saved.graph.node) == len(proto.graph.node) - 1   # the output Identity is gone, 'y' kept
    assert [o.name for o in saved.graph.output] == ["y"]
    x = np.random.default_rng(0).standard_normal((1, 16, 64)).astype(np.float32)
    ref, got = run(proto, {"x": x})[0], run(saved, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_lazy_index_matches_incremental_index():
    a, b = _model(), _model()
    b.graph.index  # incremental from here on
    for m in (a, b):
        g = m.graph
        g.rename_value(g.value("l0_ln1_mean_out"), "mean0")
        g.insert_after(g.value("l1_res1_out"), "Relu")
        run_pipeline(m, "canonicalize")
    key = lambda m: sorted((getattr(u, "name", u), getattr(v, "name", v), str(k))   # noqa: E731
                           for u, v, k in m.graph.index.edges(keys=True))
    assert key(a) == key(b)
    verify(a.graph)
    verify(b.graph)
