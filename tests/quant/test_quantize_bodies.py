"""Weights inside If/Loop/Scan bodies are quantized (field notes §1), and so are the bodies' activations
(tests/quant/test_body_quantizers.py has the issue's models).

SQNR floor: 30 dB vs the float model on random inputs, for both If conditions.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from qcompiler import model_to_proto
from qcompiler.ir import verify
from qcompiler.quant.api import quantize
from tests.helpers import make_model, run, sqnr_db, tinfo

SQNR_FLOOR_DB = 30.0
BODY_REASON = "activations quantized)"


def init(name, arr):
    return numpy_helper.from_array(np.asarray(arr, np.float32), name)


def rand(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def if_model():
    """then: Conv (body weight) -> Relu -> Flatten -> MatMul (body weight); else: Flatten -> MatMul reading the
    outer weight `wo` -> Relu -> MatMul (body weight). Both give [1, 16]; the main graph also reads `wo`."""
    then = helper.make_graph(
        [helper.make_node("Conv", ["x", "wc", "bc"], ["t1"], name="then_conv"),
         helper.make_node("Relu", ["t1"], ["t2"], name="then_relu"),
         helper.make_node("Flatten", ["t2"], ["t3"], name="then_flatten"),
         helper.make_node("MatMul", ["t3", "wt"], ["t"], name="then_matmul")],
        "then", [], [tinfo("t", [1, 16])],
        [init("wc", rand((4, 3, 3, 3), 1, 0.3)), init("bc", rand((4,), 2, 0.1)), init("wt", rand((64, 16), 3, 0.2))])
    els = helper.make_graph(
        [helper.make_node("Flatten", ["x"], ["e1"], name="else_flatten"),
         helper.make_node("MatMul", ["e1", "wo"], ["e2"], name="else_matmul_outer"),
         helper.make_node("Relu", ["e2"], ["e3"], name="else_relu"),
         helper.make_node("MatMul", ["e3", "we"], ["e"], name="else_matmul")],
        "else", [], [tinfo("e", [1, 16])], [init("we", rand((16, 16), 4, 0.3))])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els, name="branch"),
             helper.make_node("Flatten", ["x"], ["xf"], name="main_flatten"),
             helper.make_node("MatMul", ["xf", "wo"], ["z"], name="main_matmul")]
    return make_model(nodes, [tinfo("x", [1, 3, 6, 6]), tinfo("c", [], T.BOOL)],
                      [tinfo("y", [1, 16]), tinfo("z", [1, 16])], [init("wo", rand((108, 16), 5, 0.1))])


def loop_model():
    """A 3-iteration Loop whose body carries v through Tanh(MatMul(v, wl)) with wl a body weight."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="loop_cond"),
         helper.make_node("MatMul", ["v_in", "wl"], ["m"], name="loop_matmul"),
         helper.make_node("Tanh", ["m"], ["v_out"], name="loop_tanh")],
        "body", [tinfo("i", [], T.INT64), tinfo("cond_in", [], T.BOOL), tinfo("v_in", [1, 8])],
        [tinfo("cond_out", [], T.BOOL), tinfo("v_out", [1, 8])], [init("wl", rand((8, 8), 6, 0.4))])
    nodes = [helper.make_node("Loop", ["trips", "go", "x"], ["y"], body=body, name="loop")]
    return make_model(nodes, [tinfo("x", [1, 8])], [tinfo("y", [1, 8])],
                      [numpy_helper.from_array(np.array(3, np.int64), "trips"),
                       numpy_helper.from_array(np.array(True), "go")])


def if_feeds(n, seed, cond=None):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32),
             "c": np.array(bool(i % 2) if cond is None else cond)} for i in range(n)]


def loop_feeds(n, seed):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, 8)).astype(np.float32)} for _ in range(n)]


def check_sqnr(proto, q, feeds, floor=SQNR_FLOOR_DB):
    ref = [run(proto, f) for f in feeds]
    got = [run(q, f) for f in feeds]
    for k in range(len(ref[0])):
        s = sqnr_db(np.stack([r[k] for r in ref]), np.stack([g[k] for g in got]))
        assert s >= floor, f"output {k}: {s:.1f} dB < {floor}"


def body_graph(q, node_name, attr):
    node = next(n for n in q.graph.node if n.name == node_name)
    return next(a.g for a in node.attribute if a.name == attr)


def weight_grid(body, node_name, slot, enc):
    """Check input `slot` of body node `node_name` is on the int8 grid of `enc`: read through a DQ inside the
    body (int8 initializer) or as a prefolded float initializer. Returns 'dq' or 'prefolded'."""
    node = next(n for n in body.node if n.name == node_name)
    name = node.input[slot]
    inits = {t.name: numpy_helper.to_array(t) for t in body.initializer}
    dq = next((n for n in body.node if n.op_type == "DequantizeLinear" and n.output[0] == name), None)
    if dq is not None:
        assert dq.input[0] in inits, "the DQ's int8 weight lives inside the body"
        assert inits[dq.input[0]].dtype == np.int8
        assert np.abs(inits[dq.input[0]].astype(np.int32)).max() <= 127
        return "dq"
    assert name in inits, f"{node_name} input {slot} ({name}) is not a body initializer"
    w = inits[name].astype(np.float64)
    scale = np.asarray(enc.scale, np.float64)
    if scale.ndim:
        shape = [1] * w.ndim
        shape[enc.axis] = -1
        scale = scale.reshape(shape)
    steps = w / scale
    assert np.allclose(steps, np.round(steps), atol=1e-3) and np.abs(steps).max() <= 127.5
    return "prefolded"


@pytest.mark.parametrize("target", ["ort_cpu", "trt"])
def test_if_branch_weights_quantized_inside_bodies(target):
    proto = if_model()
    res = quantize(proto, if_feeds(64, 0), target=target)   # 32 per branch: body outputs have own ranges
    verify(res.model.graph)
    q = model_to_proto(res.model)
    onnx.checker.check_model(q)
    params = res.encodings["params"]
    for w in ("wc", "wt", "we", "wo"):
        assert w in params, f"body weight {w} missing from the encodings"
        assert w in res.report["quantized_params"]
        assert params[w].bits == 8 and params[w].symmetric and params[w].per_channel
    # the outer weight read by the main graph and by the else branch: one copy per graph reading it (the main
    # graph's is listed as `wo`, the else branch's under its DQ's name)
    (outer,) = [k for k in params if k != "wo" and k.startswith("wo")]
    then, els = body_graph(q, "branch", "then_branch"), body_graph(q, "branch", "else_branch")
    kinds = {weight_grid(then, "then_conv", 1, params["wc"]), weight_grid(then, "then_matmul", 1, params["wt"]),
             weight_grid(els, "else_matmul", 1, params["we"]),
             weight_grid(els, "else_matmul_outer", 1, params[outer])}
    # the bodies' Conv/MatMul read quantized activations now: integer kernels on ort_cpu, so the
    # weights keep their DQ inside the body, as on trt
    assert kinds == {"dq"}
    bodies = res.report["bodies"]
    assert len(bodies) == 2 and all(BODY_REASON in v for v in bodies.values())
    for cond in (True, False):
        check_sqnr(proto, q, if_feeds(8, 7, cond))


def test_loop_body_matmul_weight_quantized():
    proto = loop_model()
    res = quantize(proto, loop_feeds(128, 0), target="trt")
    verify(res.model.graph)
    q = model_to_proto(res.model)
    onnx.checker.check_model(q)
    assert "wl" in res.encodings["params"] and "wl" in res.report["quantized_params"]
    assert weight_grid(body_graph(q, "loop", "body"), "loop_matmul", 1, res.encodings["params"]["wl"]) == "dq"
    (reason,) = res.report["bodies"].values()
    assert BODY_REASON in reason and "1 weights quantized" in reason
    check_sqnr(proto, q, loop_feeds(8, 7), floor=25.0)   # the body's MatMul output is 8-bit now 


def test_loop_body_weight_prefolded_on_ort_cpu():
    """The loop-carried state goes to 16 bits (placement/bodies.check_carried_state), so the body
    MatMul has no integer kernel and its weight is stored on its grid."""
    proto = loop_model()
    res = quantize(proto, loop_feeds(128, 0))
    q = model_to_proto(res.model)
    onnx.checker.check_model(q)
    assert weight_grid(body_graph(q, "loop", "body"), "loop_matmul", 1, res.encodings["params"]["wl"]) == \
        "prefolded"
    assert "wl" in res.report["prefolded_params"]
    check_sqnr(proto, q, loop_feeds(8, 7), floor=25.0)
