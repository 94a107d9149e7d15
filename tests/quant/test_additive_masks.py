"""Additive attention masks of every magnitude exporters write (field notes: masks): scores + (1 - mask) * C
with C = -1e4 (older BERT exports), -65504 (float16's finfo.min), -3.4e38 (float32's finfo.min), directly into
Softmax or through a Reshape. The quantized model must keep the attention output: an 8-bit grid over the
masked scores' ~1e4 range gave the scores one step of ~40 (minilm_l6 with a -1e4 mask: cosine 0.59), so a
Softmax input whose step is too coarse for exp is widened or kept float (placement/widening.py)."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from qcompiler.onnx_io import model_to_proto
from qcompiler.quant import quantize
from tests.helpers import run, sqnr_db

FLOOR_DB = 25.0
SEQ, DIM = 16, 32


def _attention(c: float, through_reshape: bool):
    r = np.random.default_rng(0)
    inits = [numpy_helper.from_array((r.standard_normal((DIM, DIM)) * 0.3).astype(np.float32), n)
             for n in ("wq", "wk", "wv")]
    inits += [numpy_helper.from_array(np.array(1.0, np.float32), "one"),
              numpy_helper.from_array(np.array(c, np.float32), "big"),
              numpy_helper.from_array(np.array(DIM ** -0.5, np.float32), "scale"),
              numpy_helper.from_array(np.array([1, 1, SEQ], np.int64), "mshape"),
              numpy_helper.from_array(np.array([1, SEQ, SEQ], np.int64), "sshape")]
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]), helper.make_node("MatMul", ["x", "wk"], ["k"]),
             helper.make_node("MatMul", ["x", "wv"], ["v"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s0"]), helper.make_node("Mul", ["s0", "scale"], ["s1"]),
             helper.make_node("Reshape", ["mask", "mshape"], ["m3"]),
             helper.make_node("Cast", ["m3"], ["mf"], to=T.FLOAT),
             helper.make_node("Sub", ["one", "mf"], ["inv"]), helper.make_node("Mul", ["inv", "big"], ["ext"]),
             helper.make_node("Add", ["s1", "ext"], ["scores"])]
    soft_in = "scores"
    if through_reshape:
        nodes.append(helper.make_node("Reshape", ["scores", "sshape"], ["scores_r"]))
        soft_in = "scores_r"
    nodes += [helper.make_node("Softmax", [soft_in], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    for i, n in enumerate(nodes):
        n.name = f"n{i}_{n.op_type}"
    g = helper.make_graph(nodes, "attn", [helper.make_tensor_value_info("x", T.FLOAT, [1, SEQ, DIM]),
                                          helper.make_tensor_value_info("mask", T.INT64, [1, SEQ])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [1, SEQ, DIM])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    feeds = []
    for _ in range(24):
        n_valid = int(r.integers(4, SEQ + 1))
        mask = np.zeros((1, SEQ), np.int64)
        mask[0, :n_valid] = 1
        feeds.append({"x": r.standard_normal((1, SEQ, DIM)).astype(np.float32), "mask": mask})
    return m, feeds


@pytest.mark.parametrize("through_reshape", [False, True], ids=["direct", "reshape"])
@pytest.mark.parametrize("c", [-1e4, -65504.0, float(np.finfo(np.float32).min)], ids=["1e4", "65504", "finfo"])
def test_masked_attention_keeps_its_output(c, through_reshape):
    m, feeds = _attention(c, through_reshape)
    res = quantize(m, feeds, progress=False, min_sqnr=float("-inf"))
    q = model_to_proto(res.model)
    ref = np.concatenate([run(m, f)[0].ravel() for f in feeds[-6:]])
    got = np.concatenate([run(q, f)[0].ravel() for f in feeds[-6:]])
    assert sqnr_db(ref, got) >= FLOOR_DB
    assert any(n.op_type == "QuantizeLinear" for n in q.graph.node)     # the rest is still quantized
    # the Softmax input is float or on a grid with steps exp can read
    acts = res.report["quantized_activations"]
    soft_in = "scores_r" if through_reshape else "scores"
    for name in ("scores", soft_in):
        if name in acts:
            e = acts[name]
            assert (e["max"] - e["min"]) / (2 ** e["bits"] - 1) <= 0.25, e


def test_unmasked_scores_stay_8_bit():
    """Without a mask (every position valid) the scores' range is small: the Softmax input keeps 8 bits."""
    m, feeds = _attention(-1e4, False)
    for f in feeds:
        f["mask"][:] = 1
    res = quantize(m, feeds, progress=False, min_sqnr=float("-inf"), optimize="accuracy")
    assert res.report["quantized_activations"]["scores"]["bits"] == 8
