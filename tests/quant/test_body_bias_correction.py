"""bias correction reaches Conv/Gemm inside If/Loop/Scan bodies (passes/quantize/bias_correction.py,
qdq.correct_biases), with per-channel input means observed inside the bodies by body_probe."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from qcompiler import model_to_proto
from qcompiler.quant.api import quantize
from qcompiler.quant.core.qdq import quantize_dequantize
from tests.helpers import make_model, tinfo
from tests.quant.body_models import MODELS, init, rand
from tests.quant.test_body_quantizers import check_sqnr

STEPS = 4
BIAS_STEP = 1e-3   # bound on the int32 bias grid's step here (s_x * s_w)


def loop_conv():
    """Loop over STEPS images xs [STEPS, 1, 3, 6, 6] (captured): s' = s + Relu(Conv(xs[i], w, b)), s carried.
    The Conv's input is a body value (Gather output): its mean is observed stacked over the iterations."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="lc_cond"),
         helper.make_node("Gather", ["xs", "i"], ["xt"], axis=0, name="lc_gather"),
         helper.make_node("Conv", ["xt", "w", "b"], ["cv"], pads=[1, 1, 1, 1], name="lc_conv"),
         helper.make_node("Relu", ["cv"], ["r"], name="lc_relu"),
         helper.make_node("Add", ["s_in", "r"], ["s_out"], name="lc_add")],
        "lc", [tinfo("i", [], T.INT64), tinfo("cond_in", [], T.BOOL), tinfo("s_in", [1, 4, 6, 6])],
        [tinfo("cond_out", [], T.BOOL), tinfo("s_out", [1, 4, 6, 6])],
        [init("w", rand((4, 3, 3, 3), 60, 0.3)), init("b", rand((4,), 61, 0.1))])
    nodes = [helper.make_node("Loop", ["trips", "go", "s0"], ["s_final"], body=body, name="conv_loop")]
    proto = make_model(nodes, [tinfo("xs", [STEPS, 1, 3, 6, 6]), tinfo("s0", [1, 4, 6, 6])],
                       [tinfo("s_final", [1, 4, 6, 6])],
                       [init("trips", np.array(STEPS), np.int64), init("go", np.array(True), bool)])

    def feeds(n, seed):
        rng = np.random.default_rng(seed)
        # a channel mean far from 0: the correction is large enough to see
        return [{"xs": (rng.standard_normal((STEPS, 1, 3, 6, 6)) + np.array([2.0, -1.0, 0.5])[:, None, None]
                        ).astype(np.float32), "s0": np.zeros((1, 4, 6, 6), np.float32)} for _ in range(n)]
    return proto, feeds(16, 0), [feeds(4, 9)]


def _expected_bias(res, node_name, w, b, mean):
    spec = res.plan.uses[(node_name, 1)]
    w = np.asarray(w, np.float64)
    dw = quantize_dequantize(w, spec.encoding) - w
    return b - np.einsum("oc,c->o", dw.reshape(dw.shape[0], dw.shape[1], -1).sum(-1), mean)


def _bias_in_body(model, node_name):
    """The float bias the exported node computes with: its DequantizeLinear of the int32 bias (or a float one)."""
    q = model_to_proto(model)
    graphs, inits, nodes = [q.graph], {}, {}
    while graphs:
        g = graphs.pop()
        inits.update((t.name, numpy_helper.to_array(t)) for t in g.initializer)
        for n in g.node:
            nodes[n.name] = n
            nodes.update((o, n) for o in n.output)
            graphs.extend(a.g for a in n.attribute if a.type == a.GRAPH)
    x = nodes[node_name].input[2]
    if x in inits:
        return inits[x].astype(np.float64)
    dq = nodes[x]
    assert dq.op_type == "DequantizeLinear"
    return inits[dq.input[0]].astype(np.float64) * inits[dq.input[1]].astype(np.float64)


def test_conv_inside_a_loop_body_is_corrected_from_the_stacked_means():
    proto, calib, evals = loop_conv()
    res = quantize(proto, calib, bias_correction=True)
    assert any("bias correction on 1 Conv/Gemm nodes (1 inside If/Loop/Scan bodies)" in n
               for n in res.report["notes"]), res.report["notes"]
    mean = np.mean([f["xs"].mean(axis=(0, 1, 3, 4)) for f in calib], axis=0)
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.node[0].attribute[0].g.initializer}
    b = inits["b"].astype(np.float64)
    got, want = _bias_in_body(res.model, "lc_conv"), _expected_bias(res, "lc_conv", inits["w"], b, mean)
    np.testing.assert_allclose(got, want, atol=BIAS_STEP)   # the exported bias is int32 on s_x * s_w
    assert np.abs(want - b).max() > 3 * BIAS_STEP
    check_sqnr(proto, model_to_proto(res.model), evals)


def test_if_branch_convs_corrected_and_the_shared_bias_copied_per_branch():
    """Both branches' Convs read the outer b_shared: each gets its own corrected copy (the same values here:
    same weight, same captured input x); else_conv2, without bias, gets one."""
    proto, calib, evals = MODELS["if_two_convs"]()
    plain = quantize(proto, calib)
    res = quantize(proto, calib, bias_correction=True)
    note = next(n for n in res.report["notes"] if n.startswith("bias correction on"))
    assert "3 Conv/Gemm nodes (3 inside If/Loop/Scan bodies)" in note, note
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    b = inits["b_shared"].astype(np.float64)
    mean = np.mean([f["x"].mean(axis=(0, 2, 3)) for f in calib], axis=0)
    for name in ("then_conv", "else_conv"):
        want = _expected_bias(res, name, inits["w_shared"], b, mean)
        np.testing.assert_allclose(_bias_in_body(res.model, name), want, atol=BIAS_STEP)   # x has mean ~0: small
    q = model_to_proto(res.model)
    check_sqnr(proto, q, evals)
    assert plain.report["notes"] != res.report["notes"]
