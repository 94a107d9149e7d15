"""A weight holding inf or NaN stays float with a reason (it has no grid: quantized, inf would saturate into a
finite value and change what the model computes); the other weights are still quantized."""
import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from qcompiler.onnx_io import model_to_proto
from qcompiler.quant import quantize
from tests.helpers import run


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_nonfinite_weight_stays_float(bad):
    r = np.random.default_rng(0)
    w1 = r.standard_normal((8, 8)).astype(np.float32)
    w2 = r.standard_normal((8, 4)).astype(np.float32)
    w2[3, 1] = bad
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
                           helper.make_node("Relu", ["a"], ["r"], name="relu"),
                           helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2, 4])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    feeds = [{"x": r.standard_normal((2, 8)).astype(np.float32)} for _ in range(8)]
    res = quantize(m, feeds, progress=False)
    q = model_to_proto(res.model)
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    kept = [a for a in inits.values() if a.dtype == np.float32 and a.shape == (8, 4)]
    assert kept and np.array_equal(np.isfinite(kept[0]), np.isfinite(w2))   # the weight as the model has it
    assert any(a.dtype == np.int8 and a.shape == (8, 8) for a in inits.values()) or \
        any(n.op_type == "QuantizeLinear" for n in q.graph.node)          # the rest is quantized
    why = " ".join(str(v) for v in res.report["left_float"].values())
    assert "non-finite" in why
    got, ref = run(q, feeds[0])[0], run(m, feeds[0])[0]
    assert np.array_equal(np.isfinite(got), np.isfinite(ref))
