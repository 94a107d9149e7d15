"""Ties and bodies are typed fields of the plan (QuantSpec.tie_root, QuantPlan.bodies), not string protocols."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto as T, helper

from qcompiler.quant.api import quantize
from qcompiler.quant.core.plan import Body
from tests.helpers import make_model, tinfo
from tests.quant.test_quantize_bodies import if_model


def test_bodies_are_records_not_pseudo_values():
    proto = if_model()
    rng = np.random.default_rng(0)
    calib = [{"x": rng.normal(0, 1, (1, 3, 6, 6)).astype(np.float32), "c": np.array(bool(i % 2))} for i in range(4)]
    res = quantize(proto, calib)
    plan = res.plan
    assert not any(k.startswith("<") for k in plan.values)
    assert sorted((b.op_type, b.owner, b.index) for b in plan.bodies) == [("If", "branch", 0), ("If", "branch", 1)]
    assert all(isinstance(b, Body) and b.weights >= 1 for b in plan.bodies)
    for b in plan.bodies:   # the report lists each body under its key
        assert res.report["bodies"][b.key] == b.reason


def test_concat_input_from_float_producer_is_tied_by_field():
    """TopK (not quantizable) feeds a Concat: that input gets a per-use quantizer tied to the Concat's group."""
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("TopK", ["x", "k"], ["tv", "ti"], axis=1, name="topk"),
             helper.make_node("Concat", ["r", "tv"], ["y"], axis=1, name="cat")]
    proto = make_model(nodes, [tinfo("x", [1, 8])], [tinfo("y", [1, 16])],
                       [helper.make_tensor("k", T.INT64, [1], [8])])
    rng = np.random.default_rng(1)
    res = quantize(proto, [{"x": rng.normal(0, 1, (1, 8)).astype(np.float32)} for _ in range(8)])
    use = res.plan.uses[("cat", 1)]
    assert use.tie_root == "y" and use.kind == "activation"
    assert use.encoding is res.plan.values["y"].encoding
