"""Values read by Sin/Cos are angles: an 8-bit grid over a decoder's rotary angles (positions x inv_freq, up to
the sequence length in radians) has steps of ~0.5 rad, and cos/sin of them are noise for the fast-turning
channels. Such values (and what a Concat ties to them) leave the 8-bit grid; angles over a small range keep it."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from qcompiler.onnx_io import model_to_proto
from qcompiler.quant import quantize
from qcompiler.quant.placement import widening
from tests.quant.test_weight_only import logits_sqnr, run

D = 32


def rotary_model(seq: int, samples: int = 6, seed: int = 0):
    """x [1, seq, D] -> MatMul -> y*cos + y*sin -> MatMul, the angles Concat(p*inv_freq, p*inv_freq) computed
    in the graph from a Range of positions, as torch dynamo exports a Llama's rotary embedding."""
    rng = np.random.default_rng(seed)
    inv_freq = (1.0 / 10000 ** (np.arange(0, D, 2) / D)).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("w1", rng.standard_normal((D, D)).astype(np.float32) * 0.2),
        ("w2", rng.standard_normal((D, D)).astype(np.float32) * 0.2),
        ("inv_freq", inv_freq.reshape(1, D // 2)),
        ("zero", np.array(0, np.int64)), ("one", np.array(1, np.int64)), ("last", np.array([-1], np.int64)))]
    nodes = [helper.make_node("Shape", ["x"], ["shape"], start=1, end=2),
             helper.make_node("Squeeze", ["shape"], ["len"]),
             helper.make_node("Range", ["zero", "len", "one"], ["pos"]),
             helper.make_node("Cast", ["pos"], ["posf"], to=T.FLOAT),
             helper.make_node("Unsqueeze", ["posf", "last"], ["pos2"]),
             helper.make_node("Mul", ["pos2", "inv_freq"], ["freqs"]),
             helper.make_node("Concat", ["freqs", "freqs"], ["angles"], axis=-1),
             helper.make_node("Cos", ["angles"], ["cos"]),
             helper.make_node("Sin", ["angles"], ["sin"]),
             helper.make_node("MatMul", ["x", "w1"], ["y"]),
             helper.make_node("Mul", ["y", "cos"], ["yc"]),
             helper.make_node("Mul", ["y", "sin"], ["ys"]),
             helper.make_node("Add", ["yc", "ys"], ["rot"]),
             helper.make_node("MatMul", ["rot", "w2"], ["out"])]
    graph = helper.make_graph(nodes, "rotary", [helper.make_tensor_value_info("x", T.FLOAT, [1, "seq", D])],
                              [helper.make_tensor_value_info("out", T.FLOAT, [1, "seq", D])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    feeds = [{"x": rng.standard_normal((1, seq, D)).astype(np.float32)} for _ in range(samples)]
    return model, feeds


def test_rotary_angles_over_many_positions_leave_the_8bit_grid(monkeypatch):
    model, feeds = rotary_model(seq=128)
    ref = run(model, feeds)
    res = quantize(model, feeds, progress=False)
    lf = res.report["left_float"]
    assert "Sin/Cos" in lf.get("angles", "") and "Sin/Cos" in lf.get("freqs", ""), lf
    with_rule = logits_sqnr(ref, run(model_to_proto(res.model), feeds))
    monkeypatch.setattr(widening, "PERIODIC_MAX_STEP", float("inf"))     # the 8-bit angles as before
    res8 = quantize(model, feeds, progress=False)
    assert "freqs" in res8.report["quantized_activations"]
    on_grid = logits_sqnr(ref, run(model_to_proto(res8.model), feeds))
    assert with_rule > 30 and with_rule > on_grid + 3.0, (with_rule, on_grid)


def test_angles_over_a_few_positions_keep_8_bits():
    model, feeds = rotary_model(seq=4)
    res = quantize(model, feeds, progress=False)
    assert "Sin/Cos" not in " ".join(res.report["left_float"].values())
    assert "freqs" in res.report["quantized_activations"]
    assert logits_sqnr(run(model, feeds), run(model_to_proto(res.model), feeds)) > 25
