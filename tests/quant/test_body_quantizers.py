"""quantizers inside If/Loop/Scan bodies, on every target (models in tests/quant/body_models.py).

Each model: onnxruntime runs the quantized model on every branch, QuantizeLinear nodes exist inside the bodies
on the default target, and every output reaches SQNR_FLOOR_DB against float on held-out inputs. On qnn_htp and
trt every body weight comes from a DequantizeLinear inside its body, per channel where the profile quantizes
that op per channel (Conv, and LSTM/GRU W/R on the gate axis, axis 1).
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from qcompiler import model_to_proto
from qcompiler.ir import verify
from qcompiler.quant.api import quantize
from tests.helpers import run, sqnr_db
from tests.quant.body_models import MODELS

SQNR_FLOOR_DB = 25.0


def bodies(g, path=""):
    """[(path, GraphProto)] of every body under `g`."""
    out = []
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                p = f"{path}{n.name}/{a.name}"
                out.append((p, a.g))
                out.extend(bodies(a.g, p + "/"))
    return out


def weight_slots(node):
    if node.op_type in ("Conv", "ConvTranspose", "Gemm", "MatMul"):
        return (1,)
    if node.op_type in ("LSTM", "GRU", "RNN"):
        return (1, 2)
    return ()


def check_sqnr(proto, q, evals):
    for ev in evals:
        ref = [run(proto, f) for f in ev]
        got = [run(q, f) for f in ev]
        for k in range(len(ref[0])):
            s = sqnr_db(np.stack([r[k] for r in ref]), np.stack([g[k] for g in got]))
            assert s >= SQNR_FLOOR_DB, f"output {k} on {sorted(ev[0])}: {s:.1f} dB < {SQNR_FLOOR_DB}"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_quantizers_inside_bodies_default_target(name):
    proto, calib, evals = MODELS[name]()
    res = quantize(proto, calib)
    verify(res.model.graph)
    q = model_to_proto(res.model)
    onnx.checker.check_model(q)
    found = {p: sum(1 for n in b.node if n.op_type == "QuantizeLinear") for p, b in bodies(q.graph)}
    taken = {p: n for p, n in found.items() if not (name == "if_never_taken" and p.endswith("else_branch"))}
    # every body calibration reached holds quantizers (the outer If of nested_if holds only the inner If), except
    # a body where no op runs an integer kernel on ort_cpu (LSTM/GRU): --optimize balanced leaves it float
    idle = {"rnn_branch/then_branch", "rnn_branch/else_branch"} if name == "if_lstm_gru" else set()
    assert all(n > 0 for p, n in taken.items() if p != "outer/then_branch" and p not in idle), found
    assert all(found[p] == 0 for p in idle), found
    check_sqnr(proto, q, evals)
    for b in res.plan.bodies:   # listed under left_float too when something inside stays float
        assert res.report["bodies"][b.key] == b.reason
        assert (b.key in res.report["left_float"]) == bool(b.unobserved or not b.activations)


def test_never_taken_branch_left_float_and_reported():
    proto, calib, evals = MODELS["if_never_taken"]()
    res = quantize(proto, calib)
    q = model_to_proto(res.model)
    (els,) = [b for p, b in bodies(q.graph) if p == "branch/else_branch"]
    assert not any(n.op_type == "QuantizeLinear" for n in els.node)
    assert any("else_branch" in n and "never taken" in n for n in res.report["notes"])
    (rec,) = [b for b in res.plan.bodies if b.nodes == 3]   # the else branch
    assert rec.activations == 0 and rec.unobserved >= 2 and "never reached by calibration" in rec.reason
    # its weights are still quantized (they need no calibration); float inputs: stored on their grid on ort_cpu
    assert "w_else" in res.report["quantized_params"] and "w_else" in res.report["prefolded_params"]
    check_sqnr(proto, q, evals)


def test_body_without_integer_kernel_left_float_by_balanced_and_quantized_by_accuracy():
    """If(LSTM | GRU) on ort_cpu: no op of either branch runs an integer kernel, so --optimize balanced (the
    default) leaves their activations float and the report says why per body; --optimize accuracy keeps the
    quantizers inside. Bodies that do hold an integer kernel (Conv, MatMul) keep theirs under balanced."""
    proto, calib, evals = MODELS["if_lstm_gru"]()
    res = quantize(proto, calib)
    recs = [b for b in res.plan.bodies if b.owner == "rnn_branch"]
    assert len(recs) == 2 and all(b.activations == 0 for b in recs)
    for b in recs:
        why = res.report["bodies"][b.key]
        assert "no op inside runs an integer kernel on ort_cpu" in why and res.report["left_float"][b.key] == why
    assert any("If 'rnn_branch' then_branch: no op inside runs an integer kernel" in r
               for r in res.report["left_float"].values())
    check_sqnr(proto, model_to_proto(res.model), evals)
    acc = quantize(proto, calib, optimize="accuracy")
    q = model_to_proto(acc.model)
    found = {p: sum(1 for n in b.node if n.op_type == "QuantizeLinear") for p, b in bodies(q.graph)}
    assert all(n > 0 for n in found.values()), found
    check_sqnr(proto, q, evals)
    for name in ("if_two_convs", "loop_lstm_cell", "scan_rnn"):
        proto, calib, _ = MODELS[name]()
        assert all(b.activations > 0 for b in quantize(proto, calib).plan.bodies), name


def test_loop_carried_state_is_one_group_on_the_wide_grid():
    """h and c of the Loop cell: initial value, body input and body output share one encoding (the final
    output is the Loop's, float). h (a gated Tanh) fits 8 bits; c (the integrating cell state) does not, so
    ort_cpu gives its group 16 bits (the report says why) and trt, without a wide grid, keeps it float. That is
    --optimize accuracy; balanced (the default) leaves the 16-bit group float on both sides of the boundary (no
    16-bit integer kernel reads or writes it, inside the body or out) and keeps h on one int8 grid on both."""
    proto, calib, _ = MODELS["loop_lstm_cell"]()
    plan = quantize(proto, calib, optimize="accuracy").plan
    for grp, bits in ((("h0", "h_in", "h_out"), 8), (("c0", "c_in", "c_out"), 16)):
        assert len({plan.find(v) for v in grp}) == 1
        specs = [plan.values[v] for v in grp]
        assert all(not s.keep_float and s.encoding is specs[0].encoding and s.bits == bits for s in specs)
    assert all("carried by Loop 'cell_loop'" in plan.values[v].widened for v in ("c0", "c_in", "c_out"))
    plan = quantize(proto, calib).plan
    assert all(plan.values[v].keep_float for v in ("c0", "c_in", "c_out"))
    assert all("no integer kernel on ort_cpu" in plan.values[v].reason for v in ("c0", "c_in", "c_out"))
    specs = [plan.values[v] for v in ("h0", "h_in", "h_out")]
    assert all(not s.keep_float and s.encoding is specs[0].encoding and s.bits == 8 for s in specs)
    trt = quantize(proto, calib, target="trt").plan
    assert trt.values["c_in"].keep_float and "no wide grid" in trt.values["c_in"].reason


@pytest.mark.parametrize("target", ["qnn_htp", "trt"])
@pytest.mark.parametrize("name", ["if_two_convs", "nested_if", "loop_lstm_cell", "scan_rnn", "if_lstm_gru"])
def test_body_weights_come_from_dequantize_linear(name, target):
    """Every body weight is an int8 initializer of its body read through a DequantizeLinear there (no float on
    its grid); per channel where the profile says so: Conv on both, LSTM/GRU W/R on the gate axis."""
    proto, calib, evals = MODELS[name]()
    res = quantize(proto, calib, target=target)
    q = model_to_proto(res.model)
    onnx.checker.check_model(q)
    per_channel = set(res.plan.profile.per_channel_ops)
    seen = 0
    for path, b in bodies(q.graph):
        dqs = {n.output[0]: n for n in b.node if n.op_type == "DequantizeLinear"}
        inits = {t.name: t for t in b.initializer}
        for n in b.node:
            for slot in weight_slots(n):
                if slot >= len(n.input):
                    continue
                dq = dqs.get(n.input[slot])
                assert dq is not None, f"{path}: {n.name} input {slot} does not come from a DequantizeLinear"
                assert dq.input[0] in inits and inits[dq.input[0]].data_type == onnx.TensorProto.INT8
                scale = numpy_helper.to_array(inits[dq.input[1]])
                if n.op_type in per_channel or n.op_type in ("LSTM", "GRU", "RNN"):
                    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
                    assert scale.size > 1, f"{n.name} input {slot}: per-tensor DQ"
                    if n.op_type in ("LSTM", "GRU", "RNN"):
                        assert axis == 1 and scale.size == numpy_helper.to_array(inits[dq.input[0]]).shape[1]
                seen += 1
    assert seen >= 2
    check_sqnr(proto, q, evals)


def test_ort_cpu_report_says_how_body_weights_are_stored():
    """ort_cpu: LSTM/GRU have no integer kernel, so their W/R are stored float on the int8 grid (listed in
    prefolded_params with the reason); the Conv of an If branch keeps its DQ (an integer kernel)."""
    proto, calib, _ = MODELS["if_lstm_gru"]()
    res = quantize(proto, calib)
    pre = res.report["prefolded_params"]
    assert {"W_lstm", "R_lstm", "W_gru", "R_gru"} <= set(pre)
    assert all("LSTM" in pre[k] for k in ("W_lstm", "R_lstm"))
    proto, calib, _ = MODELS["if_two_convs"]()
    res = quantize(proto, calib)
    assert "w_shared" in res.report["quantized_params"] and "w_shared" not in res.report.get("prefolded_params", {})


def variance_in_branch():
    """If c: Var[x] as E[x²] - E[x]² (cancels catastrophically at 8 bits: x has a large mean), else Neg(mean)."""
    from onnx import TensorProto as T, helper
    from tests.helpers import make_model, tinfo
    then = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["m"], axes=[1], name="var_mean"),
         helper.make_node("Mul", ["x", "x"], ["xx"], name="var_sq"),
         helper.make_node("ReduceMean", ["xx"], ["s"], axes=[1], name="var_meansq"),
         helper.make_node("Mul", ["m", "m"], ["mm"], name="var_mm"),
         helper.make_node("Sub", ["s", "mm"], ["v"], name="var_sub")],
        "then", [], [tinfo("v", [1, 1])])
    els = helper.make_graph([helper.make_node("ReduceMean", ["x"], ["e"], axes=[1], name="else_mean")],
                            "else", [], [tinfo("e", [1, 1])])
    proto = make_model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els, name="branch")],
                       [tinfo("x", [1, 64]), tinfo("c", [], T.BOOL)], [tinfo("y", [1, 1])])

    def feeds(n, seed, cond=True):
        rng = np.random.default_rng(seed)
        return [{"x": (20 + rng.standard_normal((1, 64)) * rng.uniform(0.5, 2)).astype(np.float32),
                 "c": np.array(cond)} for _ in range(n)]
    return proto, feeds


def test_safety_net_turns_breaking_body_quantizers_float():
    """A body quantizer that breaks the output (the search sees main-graph quantizers only) is still found: the
    body's quantizers are turned float as one group, and the report names each with the reason."""
    proto, feeds = variance_in_branch()
    res = quantize(proto, feeds(32, 0))
    sn = res.report["safety_net"]
    assert sn["triggered"], sn
    body = [c for c in sn["changed"] if "inside If/Loop/Scan bodies" in c["reason"]]
    assert body and {"s", "mm"} & {c["value"] for c in body}
    assert res.report["below_floor"] == []
    q = model_to_proto(res.model)
    check_sqnr(proto, q, [feeds(8, 9)])


def test_captured_activation_gets_a_dequantizer_inside_each_body():
    """x is quantized in the main graph and read by both If branches: each branch has its own DQ of the captured
    int8 tensor (scale inside the branch), so onnxruntime fuses the branch's Conv into QLinearConv."""
    import onnxruntime as ort
    proto, calib, evals = MODELS["if_two_convs"]()
    q = model_to_proto(quantize(proto, calib).model)
    for path, b in bodies(q.graph):
        dqs = {n.output[0]: n for n in b.node if n.op_type == "DequantizeLinear"}
        conv = next(n for n in b.node if n.op_type == "Conv" and n.input[1].startswith("w_shared"))
        dq = dqs.get(conv.input[0])
        assert dq is not None, path
        assert dq.input[1] in {t.name for t in b.initializer}
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(q.SerializeToString(), so, providers=["CPUExecutionProvider"])
    assert sess.run(None, evals[0][0])[0].shape == (1, 4, 8, 8)
    check_sqnr(proto, q, evals)


def test_body_placement_failure_leaves_the_body_float(monkeypatch):
    """a body placement cannot handle stays float, named with the reason; the rest quantizes."""
    from qcompiler.quant.placement import activations
    original = activations.place_activations

    def fragile(plan, g, profile, opts):
        original(plan, g, profile, opts)
        if g.parent is not None and g.parent.name == "branch" and any(n.name == "else_conv" for n in g.nodes):
            raise RuntimeError("an unknown construct")
    from qcompiler.quant.placement import bodies as body_placement
    monkeypatch.setattr(body_placement, "place_activations", fragile)   # bodies.py places each body's activations
    proto, calib, evals = MODELS["if_two_convs"]()
    res = quantize(proto, calib)
    reasons = [s.reason for s in res.plan.values.values() if "failed (RuntimeError: an unknown construct)" in s.reason]
    assert reasons and "If 'branch'" in reasons[0]
    assert reasons[0] in res.report["left_float"].values()
    q = model_to_proto(res.model)
    found = {p: sum(1 for n in b.node if n.op_type == "QuantizeLinear") for p, b in bodies(q.graph)}
    assert found["branch/then_branch"] > 0 and found["branch/else_branch"] == 0
    check_sqnr(proto, q, evals)
