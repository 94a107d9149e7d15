"""Supergroup annotation and the LayerNorm/GELU fusions."""
import numpy as np
import onnx
import pytest

from qcompiler.ir import verify
from qcompiler.onnx_io import model_from_proto
from qcompiler.passmanager import run_pipeline
from qcompiler.passmanager.instrumentation import Verifier
from tests.helpers import run
from tests.passes.test_scale_folding import H, RNG, T, D, _vit_mlp_blocks
from tests.patterns.builders import Builder, gelu_erf, gelu_tanh, layernorm

import qcompiler.passes.scale_folding as sf


def _ln_model(opset, graph_output_inside=False, **kw):
    b = Builder(shape=(2, 8), opset=opset)
    y = layernorm(b, "x", **kw)
    b.output(y)
    if graph_output_inside:
        b.output("var_out")  # the variance (interior) is also a graph output: must not fuse
    return b


def test_annotate_vit_gelus_protects_shared_half_and_blocks_smoothquant_fold():
    proto = _vit_mlp_blocks()
    m = model_from_proto(proto)
    (_, r), = run_pipeline(m, "annotate-supergroups")
    assert r.stats["gelu"] == 3 and r.stats["matmul_add"] == 6
    g = m.graph
    assert g.value("half").meta["protected"]
    assert {n.meta["supergroup"] for n in g if n.name.endswith("gelu_erf")} == {"gelu:0", "gelu:1", "gelu:2"}
    assert g.value("b0_e").meta["supergroup_interior"] == "gelu:0"
    ok, reason = sf.fold_scale_into_producer(g, g.value("b1_g"), np.full(H, 0.5), axis=-1)
    assert not ok and "half" in reason
    feeds = {"x": RNG.normal(size=(1, T, D)).astype(np.float32)}
    np.testing.assert_array_equal(run(proto, feeds)[0], run(m, feeds)[0])


@pytest.mark.parametrize("form,kw", [("pow", {}), ("pow", {"reciprocal": True}), ("pow", {"commute": True}),
                                     ("moments", {"form": "moments"}), ("dupsub", {"dup_sub": True})])
def test_fuse_layernorm_opset17(form, kw):
    b = _ln_model(17, **kw)
    proto = b.proto()
    m = model_from_proto(proto)
    (_, r), = run_pipeline(m, "fuse-layernorm", [Verifier()])
    verify(m.graph)
    assert r.stats["fused"] == 1
    assert [n.op_type for n in m.graph] == ["LayerNormalization"]
    assert [v.name for v in m.graph.outputs] == [o.name for o in proto.graph.output]
    x = RNG.normal(size=(2, 8)).astype(np.float32) * 3 + 1
    np.testing.assert_allclose(run(m, {"x": x})[0], run(proto, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_layernorm_kept_as_supergroup_below_opset17():
    m = model_from_proto(_ln_model(14).proto())
    (_, r), = run_pipeline(m, "fuse-layernorm")
    assert not r.modified and r.stats["kept"] == 1 and "opset 14 < 17" in r.stats["reason"]
    (_, r), = run_pipeline(m, "annotate-supergroups")
    assert r.stats == {"layernorm": 1}
    assert all(n.meta and n.meta["supergroup"] == "layernorm:0" for n in m.graph if n.op_type != "Constant")


def test_layernorm_with_interior_graph_output_is_not_fused():
    b = Builder(shape=(2, 8), opset=17)
    y = layernorm(b, "x")
    b.nodes.append(onnx.helper.make_node("Identity", ["var_out"], ["var_copy"], name="tap"))
    b.output(y)
    b.outputs.append(onnx.helper.make_tensor_value_info("var_copy", onnx.TensorProto.FLOAT, [2, 1]))
    m = model_from_proto(b.proto())
    (_, r), = run_pipeline(m, "fuse-layernorm")
    assert r.stats["fused"] == 0
    assert "ReduceMean" in {n.op_type for n in m.graph}


@pytest.mark.parametrize("order", ["outer", "gate", "first"])
def test_fuse_gelu_opset20(order):
    b = Builder(shape=(2, 8), opset=20)
    b.output(gelu_erf(b, "x", order=order))
    proto = b.proto()
    m = model_from_proto(proto)
    (_, r), = run_pipeline(m, "fuse-gelu", [Verifier()])
    assert r.stats["fused"] == 1 and [n.op_type for n in m.graph] == ["Gelu"]
    assert m.graph.nodes[0].attr("approximate") == b"none" or m.graph.nodes[0].attr("approximate") == "none"
    x = RNG.normal(size=(2, 8)).astype(np.float32) * 2
    np.testing.assert_allclose(run(m, {"x": x})[0], run(proto, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_fuse_gelu_tanh_opset20_and_kept_below():
    b = Builder(shape=(2, 8), opset=20)
    b.output(gelu_tanh(b, "x"))
    proto = b.proto()
    m = model_from_proto(proto)
    run_pipeline(m, "fuse-gelu", [Verifier()])
    assert [n.op_type for n in m.graph] == ["Gelu"]
    b14 = Builder(shape=(2, 8), opset=14)
    b14.output(gelu_tanh(b14, "x"))
    m14 = model_from_proto(b14.proto())
    (_, r), = run_pipeline(m14, "fuse-gelu")
    assert not r.modified and "opset 14 < 20" in r.stats["reason"]
