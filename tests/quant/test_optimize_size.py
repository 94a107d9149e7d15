"""`--optimize size` and a float kernel's weights on ort_cpu (the profile's `float_kernel_weights`).

A weight read by a float kernel buys nothing on its int8 grid while it is stored float: under `balanced` and
`latency` it stays exact float, under `size` it is stored int8 + DequantizeLinear (a MatMul's as MatMulNBits), so
the file shrinks to about a quarter. Each model is built here, quantized, run in onnxruntime and compared with the
float model (SQNR floors) and in bytes (size ratios).
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from qcompiler.errors import ConfigError
from qcompiler.onnx_io import model_to_proto
from qcompiler.quant.api import quantize
from qcompiler.quant.targets.profiles import get_profile
from qcompiler.sqnr import sqnr_db
from tests.helpers import make_model, run, tinfo


def _conv_hardswish(c=64, hw=4, seed=0):
    """Three Conv+HardSwish units small enough to run float Convs on ort_cpu (no QLinearConv absorbs HardSwish)
    but with weights that make most of the file."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i in range(3):
        inits.append(numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c))
                                             .astype(np.float32), f"w{i}"))
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("HardSwish", [f"c{i}"], [f"h{i}"], name=f"hs{i}")]
        x = f"h{i}"
    m = make_model(nodes, [tinfo("x", [1, c, hw, hw])], [tinfo(x, [1, c, hw, hw])], inits, opset=14)
    cal = [{"x": rng.standard_normal((1, c, hw, hw)).astype(np.float32)} for _ in range(8)]
    return m, cal


def _embed_mlp(vocab=2000, d=64, f=256, seed=1):
    """Gather(embedding) -> MatMul -> Relu -> MatMul: the embedding and MatMul weights make the file."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((vocab, d)) * 0.5).astype(np.float32), "emb"),
             numpy_helper.from_array((rng.standard_normal((d, f)) / np.sqrt(d)).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((f, d)) / np.sqrt(f)).astype(np.float32), "w2")]
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"], name="embed"),
             helper.make_node("MatMul", ["e", "w1"], ["m1"], name="up"),
             helper.make_node("Relu", ["m1"], ["r1"], name="relu"),
             helper.make_node("MatMul", ["r1", "w2"], ["y"], name="down")]
    m = make_model(nodes, [tinfo("ids", [1, 16], TensorProto.INT64)], [tinfo("y", [1, 16, d])], inits, opset=13)
    cal = [{"ids": rng.integers(0, vocab, (1, 16)).astype(np.int64)} for _ in range(8)]
    return m, cal


def _lstm(h=64, i=32, seed=2):
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array((rng.standard_normal((1, 4 * h, i)) * 0.2).astype(np.float32), "W"),
             numpy_helper.from_array((rng.standard_normal((1, 4 * h, h)) * 0.1).astype(np.float32), "R")]
    nodes = [helper.make_node("LSTM", ["x", "W", "R"], ["y"], name="lstm", hidden_size=h)]
    m = make_model(nodes, [tinfo("x", [6, 1, i])], [tinfo("y", [6, 1, 1, h])], inits, opset=14)
    cal = [{"x": rng.standard_normal((6, 1, i)).astype(np.float32)} for _ in range(8)]
    return m, cal


def _ratio_and_sqnr(m, cal, res):
    q = model_to_proto(res.model)
    worst = min(sqnr_db(run(m, f)[0], run(q, f)[0]) for f in cal[:4])
    return q.ByteSize() / m.ByteSize(), worst, q


def _initializers(q) -> dict:
    return {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}


def test_balanced_float_convs_read_exact_float_weights_and_size_stores_them_int8():
    m, cal = _conv_hardswish()
    ratio, db, q = _ratio_and_sqnr(m, cal, quantize(m, cal))
    floats = _initializers(q)
    for i in range(3):            # a float Conv's weight as the model had it: nothing rounded for nothing
        np.testing.assert_array_equal(floats[f"w{i}"], numpy_helper.to_array(m.graph.initializer[i]))
    assert ratio > 0.95 and db > 100, (ratio, db)
    res = quantize(m, cal, optimize="size")
    ratio, db, q = _ratio_and_sqnr(m, cal, res)
    assert ratio <= 0.35 and db >= 30, (ratio, db)
    dq_inputs = {n.input[0] for n in q.graph.node if n.op_type == "DequantizeLinear"}
    ints = {k for k, v in _initializers(q).items() if v.dtype == np.int8 and v.ndim == 4}
    assert len(ints) == 3 and ints <= dq_inputs, ints
    assert res.report["optimize"] == "size"


def test_accuracy_keeps_float_convs_weights_on_their_grid():
    m, cal = _conv_hardswish()
    res = quantize(m, cal, optimize="accuracy")
    assert {"w0", "w1", "w2"} <= set(res.report["prefolded_params"])


def test_size_stores_embeddings_and_matmul_weights_narrow():
    m, cal = _embed_mlp()
    base, _, _ = _ratio_and_sqnr(m, cal, quantize(m, cal, optimize="accuracy"))
    ratio, db, q = _ratio_and_sqnr(m, cal, quantize(m, cal, optimize="size"))
    assert ratio <= 0.35 and db >= 25, (ratio, db)
    shapes = {tuple(t.dims) for t in m.graph.initializer}    # no weight left float (a 64-wide embedding included)
    assert not any(v.dtype == np.float32 and v.shape in shapes for v in _initializers(q).values())
    assert ratio < base


def test_lstm_weights_exact_float_under_balanced_and_int8_under_size():
    m, cal = _lstm()
    ratio, db, _ = _ratio_and_sqnr(m, cal, quantize(m, cal))
    assert ratio > 0.95 and db > 100, (ratio, db)
    res = quantize(m, cal, optimize="size")
    ratio, db, q = _ratio_and_sqnr(m, cal, res)
    assert ratio <= 0.35 and db >= 30, (ratio, db)
    lstm = next(n for n in q.graph.node if n.op_type == "LSTM")
    producers = {o: n.op_type for n in q.graph.node for o in n.output}
    assert producers.get(lstm.input[1]) == producers.get(lstm.input[2]) == "DequantizeLinear"


def test_the_rule_is_profile_data():
    p = get_profile("ort_cpu")
    assert [p.float_kernel_weight_form(o, "Conv") for o in ("accuracy", "balanced", "latency", "size")] == \
        ["grid", "float", "float", "int"]
    assert p.float_kernel_weight_form("size", "MatMul") == "float"     # MatMulNBits takes it: int8, no DQ
    assert p.float_kernel_weight_form("size", "MatMul", weight_only=False) == "int"
    assert get_profile("trt").float_kernel_weight_form("balanced", "Conv") == "int"   # no prefolding: DQ stays
    custom = get_profile({"base": "ort_cpu", "float_kernel_weights": {"balanced": "int"}})
    assert custom.float_kernel_weight_form("balanced", "Conv") == "int"


@pytest.mark.parametrize("bad", [{"fast": "int"}, {"size": "int4"}, ["size"]])
def test_a_bad_float_kernel_weights_entry_is_one_config_error(bad):
    with pytest.raises(ConfigError, match="float_kernel_weights"):
        get_profile({"base": "ort_cpu", "float_kernel_weights": bad})


def test_a_float_conv_the_runtime_would_requantize_keeps_its_own_grid(tmp_path):
    """A Conv reading an 8-bit input and writing a 16-bit output runs float on ort_cpu, but onnxruntime would
    re-quantize an exact-float weight there itself, per tensor (WeightBiasQuantization): it keeps its own
    per-channel grid and DequantizeLinear under balanced too."""
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((8, 32, 3, 3)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((32, 32, 3, 3)) * 0.1).astype(np.float32)
    # x is quantized for conv2, an integer QLinearConv (8-bit in and out), and conv reads the same DQ
    m = make_model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1]),
                    helper.make_node("Conv", ["x", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
                    helper.make_node("Relu", ["c2"], ["y2"], name="relu2")],
                   [tinfo("x", [1, 32, 32, 32])], [tinfo("y", [1, 8, 32, 32]), tinfo("y2", [1, 32, 32, 32])],
                   [numpy_helper.from_array(w, "w"), numpy_helper.from_array(w2, "w2")], opset=13)
    cal = [{"x": rng.standard_normal((1, 32, 32, 32)).astype(np.float32)} for _ in range(8)]
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rules:\n  - match: {name: conv}\n    activations: {bits: 16}\n")
    res = quantize(m, cal, config=str(cfg))
    assert "w" in res.report["quantized_params"] and "w" not in res.report.get("prefolded_params", {})
    q = model_to_proto(res.model)
    producers = {o: n.op_type for n in q.graph.node for o in n.output}
    conv = next(n for n in q.graph.node if n.name == "conv")
    assert producers[conv.input[1]] == "DequantizeLinear"
    assert min(sqnr_db(run(m, f)[0], run(q, f)[0]) for f in cal[:2]) >= 30
