"""Weight-only quantization of a decoder whose MLP sits in an If and a layer in a Loop: the weights the bodies
read (outer initializers captured by the body, and a branch's own initializer) are planned and written in the
body as the target's kernel, the output runs in onnxruntime on both branches above a stated SQNR floor, and the
report says per weight which body reads it and that its grid used no data."""
from __future__ import annotations

import onnx
import pytest

from qcompiler.onnx_io import model_to_proto
from qcompiler.quant import quantize
from tests.quant.decoder_models import decoder_with_bodies
from tests.quant.test_weight_only import logits_sqnr, run

BODY_WEIGHTS = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "branch.proj.weight",
                "loop.proj.weight")


def _body_ops(model) -> list:
    """The op types of every If/Loop/Scan body, at any depth."""
    out = []

    def walk(graph):
        for n in graph.node:
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    out.extend(x.op_type for x in a.g.node)
                    walk(a.g)
    walk(model.graph)
    return out


@pytest.mark.parametrize("target,kernel,floor", [("ort_cpu", "MatMulNBits", 19.0), ("trt", "DequantizeLinear", 16.0)])
def test_weights_in_if_and_loop_bodies_are_quantized(target, kernel, floor, tmp_path):
    model, feeds = decoder_with_bodies()
    ref = run(model, feeds)
    res = quantize(model, None, weight_only=True, weight_bits=4, target=target, progress=False)
    q = model_to_proto(res.model)
    layers = res.report["weight_only"]["layers"]
    assert set(BODY_WEIGHTS) <= set(layers), sorted(layers)
    assert all(layers[w]["bits"] == 4 and layers[w]["body"] for w in BODY_WEIGHTS)
    assert layers["loop.proj.weight"]["body"].startswith("Loop") and layers["branch.proj.weight"]["body"].startswith("If")
    ops = _body_ops(q)
    assert ops.count(kernel) == 5 if kernel == "MatMulNBits" else ops.count(kernel) == 1   # trt: the branch's own
    got = run(q, feeds)
    for branch in (0, 1):     # the feeds alternate: then (MLP), else (the branch's own projection)
        db = logits_sqnr(ref[branch::2], got[branch::2])
        assert db > floor, (target, branch, db)      # measured: ort_cpu 25.1 / 21.8 dB, trt 21.6 / 18.9 dB
    # no float copy of a body weight is left anywhere
    names = {i.name for i in q.graph.initializer}
    for n in q.graph.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                names |= {i.name for i in a.g.initializer}
    assert not names & set(BODY_WEIGHTS), names & set(BODY_WEIGHTS)


def test_body_kernels_survive_onnxruntime_optimization(tmp_path):
    model, feeds = decoder_with_bodies(seed=1)
    q = model_to_proto(quantize(model, None, weight_only=True, weight_bits=8, progress=False).model)
    so = __import__("onnxruntime").SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    so.log_severity_level = 3
    __import__("onnxruntime").InferenceSession(q.SerializeToString(), so, providers=["CPUExecutionProvider"])
    assert _body_ops(onnx.load(str(tmp_path / "opt.onnx"))).count("MatMulNBits") == 5
    assert logits_sqnr(run(model, feeds), run(q, feeds)) > 35      # 8 bits (measured 44 dB)


@pytest.mark.parametrize("recipe", [None, "gptq", "awq"])
def test_calibrated_recipes_leave_body_weights_on_data_free_grids(recipe):
    model, feeds = decoder_with_bodies(seed=2)
    res = quantize(model, feeds, weight_only=True, weight_bits=4, recipe=recipe, progress=False)
    layers = res.report["weight_only"]["layers"]
    for w in BODY_WEIGHTS:
        assert layers[w]["algorithm"] == "rtn" and "gridded without data" in " ".join(layers[w]["notes"])
    assert any("inside If/Loop/Scan bodies" in n for n in res.report["notes"])
    assert res.report["output_sqnr_db"]["logits"] > 19
