"""Weight-only on the forms older exporters and half-precision exports write: every Gemm variant (transB, a
full 2-D bias, alpha/beta, transA) becomes MatMulNBits plus the ops Gemm adds, float16 decoders keep float16
scales and run in onnxruntime's CPU kernels, and GPTQ on symmetric grids (trt's form) beats round-to-nearest."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from qcompiler.onnx_io import model_to_proto
from qcompiler.quant import quantize
from tests.quant.decoder_models import decoder, gemm_mlp
from tests.quant.test_weight_only import logits_sqnr, op_count, optimized_ops, run

FLOOR = {4: 19.0, 8: 32.0}      # measured: 4 bits 23.9 (ort_cpu) / 21.3 dB (trt); 8 bits 36.5-36.9 / 35.1-35.4 dB


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("target", ["ort_cpu", "trt"])
@pytest.mark.parametrize("bits", [4, 8])
def test_every_gemm_form_is_quantized(dtype, target, bits):
    model, feeds = gemm_mlp(dtype=dtype)
    ref = run(model, feeds)
    res = quantize(model, None, weight_only=True, weight_bits=bits, target=target, progress=False)
    assert res.report["weight_only"]["weights"] == 3 and not res.report["weight_only"]["left_float"]
    q = model_to_proto(res.model)
    if target == "ort_cpu":
        assert op_count(q, "MatMulNBits") == 3 and op_count(q, "Gemm") == 0
    else:
        assert op_count(q, "DequantizeLinear") == 3 and op_count(q, "Gemm") == 3
    assert not [i.name for i in q.graph.initializer if i.name.endswith(".weight")]
    db = logits_sqnr(ref, run(q, feeds))
    assert db > FLOOR[bits], db


@pytest.mark.parametrize("target,floor", [("ort_cpu", 18.0), ("trt", 15.0)])   # measured 21.0 / 18.0 dB
@pytest.mark.parametrize("head", ["tied_transpose", "untied"])
def test_float16_decoder(target, floor, head, tmp_path):
    model, feeds = decoder(seed=1, head=head, dtype=np.float16)
    ref = run(model, feeds)
    res = quantize(model, feeds, weight_only=True, weight_bits=4, target=target, progress=False)
    q = model_to_proto(res.model)
    inits = {i.name: i for i in q.graph.initializer}
    if target == "ort_cpu":
        scales = [inits[n.input[2]] for n in q.graph.node if n.op_type in ("MatMulNBits", "GatherBlockQuantized")]
        assert scales and all(s.data_type == onnx.TensorProto.FLOAT16 for s in scales)
        assert "MatMulNBits" in optimized_ops(q, tmp_path)       # onnxruntime's CPU kernel takes float16
    else:
        dqs = [n for n in q.graph.node if n.op_type == "DequantizeLinear"]
        assert dqs and all(inits[n.input[1]].data_type == onnx.TensorProto.FLOAT16 for n in dqs)
    assert run(q, feeds)[0].dtype == np.float16
    assert logits_sqnr(ref, run(q, feeds)) > floor


@pytest.mark.parametrize("recipe,max_drop", [("gptq", None), ("awq", None), (None, 0.1)])
def test_float16_decoder_with_data_driven_recipes(recipe, max_drop):
    model, feeds = decoder(seed=2, head="untied", dtype=np.float16, samples=8)
    ref = run(model, feeds)
    plain = logits_sqnr(ref, run(model_to_proto(
        quantize(model, feeds, weight_only=True, weight_bits=4, progress=False).model), feeds))
    res = quantize(model, feeds, weight_only=True, weight_bits=4, recipe=recipe, max_drop=max_drop, progress=False)
    db = logits_sqnr(ref, run(model_to_proto(res.model), feeds))
    assert db > plain - 0.5, (db, plain)      # no worse than round-to-nearest on its own calibration samples
    if max_drop:
        assert res.report["mixed_precision"]["drop"] <= max_drop and db > -20 * np.log10(max_drop) - 1.0


def test_gptq_on_symmetric_grids_beats_round_to_nearest():
    """trt's form is symmetric: GPTQ there once lost everything (negative block scales clamped to ~0)."""
    model, feeds = decoder(seed=1, head="untied")
    ref = run(model, feeds)
    sqnr = {}
    for recipe in (None, "gptq"):
        res = quantize(model, feeds, weight_only=True, weight_bits=4, target="trt", recipe=recipe, progress=False)
        sqnr[recipe] = logits_sqnr(ref, run(model_to_proto(res.model), feeds))
    assert sqnr["gptq"] > sqnr[None] + 2.0, sqnr       # measured 15.7 -> 21.4 dB
