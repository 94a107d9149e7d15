"""body_probe: every float value inside If/Loop/Scan bodies observable from one onnxruntime run.

Each model is built here; each test checks that the probe copy runs, that the model's own outputs are bit-exact,
and that the probed values equal a numpy reference (or the branch run as a model of its own)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper as h, numpy_helper as nh

from qcompiler.onnx_io.importer import model_from_proto
from qcompiler.ort_session import create_session
from qcompiler.quant.calibration.body_probe import BranchTally, build_probe, calibration_probe, has_bodies

F = T.FLOAT


def _vi(name, shape, elem=F):
    return h.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = h.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def _init(name, arr):
    return nh.from_array(np.asarray(arr), name)


def _run_both(m, feed, **kw):
    """(original outputs, probe outputs by name, ProbeModel) for one feed."""
    orig = create_session(m)
    want = orig.run([o.name for o in m.graph.output], feed)
    pm = calibration_probe(m, feed, **kw)
    sess = create_session(pm.proto)
    names = [o.name for o in sess.get_outputs()]
    got = dict(zip(names, sess.run(names, feed)))
    for o, w in zip(m.graph.output, want):        # the model's own outputs: bit-exact
        assert got[o.name].dtype == w.dtype and got[o.name].shape == w.shape
        assert np.array_equal(got[o.name], w, equal_nan=True), o.name
    return want, got, pm


# ------------------------------------------------------------------------------------------ If with Convs

def _conv_if():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    then = h.make_graph([h.make_node("Conv", ["x", "W", "B"], ["t_conv"], pads=[1, 1, 1, 1]),
                         h.make_node("Relu", ["t_conv"], ["t_relu"])], "then", [], [_vi("t_relu", None)])
    els = h.make_graph([h.make_node("Conv", ["x", "W"], ["e_conv"], pads=[1, 1, 1, 1]),
                        h.make_node("Sigmoid", ["e_conv"], ["e_sig"])], "else", [], [_vi("e_sig", None)])
    nodes = [h.make_node("ReduceMean", ["x"], ["mean"], keepdims=0),
             h.make_node("Greater", ["mean", "zero"], ["cond"]),
             h.make_node("If", ["cond"], ["y"], name="branchy", then_branch=then, else_branch=els)]
    m = _model(nodes, [_vi("x", [1, 3, 5, 5])], [_vi("y", None)],
               [_init("W", w), _init("B", b), _init("zero", np.float32(0))])
    return m, w, b


def _flat(nodes, feed, inits, outs):
    """Run `nodes` as a model of their own (a branch's nodes, with its captured names as inputs)."""
    m = _model(nodes, [_vi(k, list(v.shape)) for k, v in feed.items()], [_vi(o, None) for o in outs],
               [_init(k, v) for k, v in inits.items()])
    return dict(zip(outs, create_session(m).run(outs, feed)))


def test_if_two_conv_branches_share_outer_weight():
    m, w, b = _conv_if()
    pm = build_probe(model_from_proto(m))
    by_value = {p.value: p for p in pm.probes.values()}
    assert set(by_value) == {"t_conv", "t_relu", "e_conv", "e_sig"}
    assert all(p.how == "value" for p in by_value.values())
    assert {"W", "B", "x"}.isdisjoint(by_value)      # captured: observed where produced (main graph)
    tally = BranchTally(pm)
    for sign in (1.0, -1.0):                         # one sample per branch
        x = (np.abs(np.random.default_rng(1).standard_normal((1, 3, 5, 5))) * sign).astype(np.float32)
        _, got, pm = _run_both(m, {"x": x})
        vals = pm.values(got)
        tally.update(got)
        ref_then = _flat([h.make_node("Conv", ["x", "W", "B"], ["t_conv"], pads=[1, 1, 1, 1]),
                          h.make_node("Relu", ["t_conv"], ["t_relu"])], {"x": x}, {"W": w, "B": b},
                         ["t_conv", "t_relu"])
        ref_else = _flat([h.make_node("Conv", ["x", "W"], ["e_conv"], pads=[1, 1, 1, 1]),
                          h.make_node("Sigmoid", ["e_conv"], ["e_sig"])], {"x": x}, {"W": w}, ["e_conv", "e_sig"])
        ran, idle = (ref_then, ref_else) if sign > 0 else (ref_else, ref_then)
        for k, v in ran.items():
            np.testing.assert_allclose(vals[k], v, rtol=1e-5, atol=1e-6, err_msg=k)   # Conv+Relu may fuse
        for k in idle:
            assert vals[k] is None, k                # branch not taken: nothing to observe
    assert tally.never_taken() == []


def test_mapping_names_are_fresh():
    m, _, _ = _conv_if()
    pm = build_probe(model_from_proto(m))
    existing = {n for g in model_from_proto(m).graphs() for n in (v.name for v in g.local_values())}
    assert pm.mapping and set(pm.mapping).isdisjoint(existing)
    assert {v for _, v, _ in pm.mapping.values()} == {"t_conv", "t_relu", "e_conv", "e_sig"}
    assert {p for p, _, _ in pm.mapping.values()} == {"branchy/then_branch", "branchy/else_branch"}
    assert has_bodies(m) and has_bodies(model_from_proto(m))


# ------------------------------------------------------------------------------------------ nested If

def _nested_if():
    inner_then = h.make_graph([h.make_node("Mul", ["x", "two"], ["it_mul"])], "it", [], [_vi("it_mul", None)])
    inner_else = h.make_graph([h.make_node("Sub", ["x", "two"], ["ie_sub"])], "ie", [], [_vi("ie_sub", None)])
    outer_then = h.make_graph([h.make_node("Tanh", ["x"], ["ot_tanh"]),
                               h.make_node("If", ["c2"], ["ot_if"], name="inner", then_branch=inner_then,
                                           else_branch=inner_else),
                               h.make_node("Add", ["ot_if", "ot_tanh"], ["ot_add"])], "ot", [],
                              [_vi("ot_add", None)])
    outer_else = h.make_graph([h.make_node("Neg", ["x"], ["oe_neg"])], "oe", [], [_vi("oe_neg", None)])
    nodes = [h.make_node("If", ["c1"], ["y"], name="outer", then_branch=outer_then, else_branch=outer_else)]
    return _model(nodes, [_vi("c1", [], T.BOOL), _vi("c2", [], T.BOOL), _vi("x", [2, 3])], [_vi("y", None)],
                  [_init("two", np.float32(2))])


@pytest.mark.parametrize("c1,c2", [(True, True), (True, False), (False, True)])
def test_nested_if(c1, c2):
    m = _nested_if()
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    _, got, pm = _run_both(m, {"c1": np.array(c1), "c2": np.array(c2), "x": x})
    vals = pm.values(got)
    ref = {"it_mul": x * 2, "ie_sub": x - 2, "ot_tanh": np.tanh(x), "oe_neg": -x}
    inner = ref["it_mul"] if c2 else ref["ie_sub"]
    ref["ot_if"], ref["ot_add"] = inner, inner + np.tanh(x)
    live = ({"ot_tanh", "ot_if", "ot_add", "it_mul" if c2 else "ie_sub"} if c1 else {"oe_neg"})
    assert set(vals) == set(ref)
    for k, v in vals.items():
        if k in live:
            np.testing.assert_allclose(v, ref[k], rtol=1e-6)
        else:
            assert v is None, k
    paths = {v: p for p, v, _ in pm.mapping.values()}
    assert paths["it_mul"] == "outer/then_branch/inner/then_branch"
    taken = pm.taken(got)
    assert taken[("outer/then_branch", "inner", "then_branch")] == (c1 and c2)
    assert taken[("", "outer", "else_branch")] == (not c1)


# ------------------------------------------------------------------------------ Loop with an LSTM-style cell

H = 4


def _lstm_loop(with_if=False, nested=False):
    rng = np.random.default_rng(2)
    wx = (rng.standard_normal((H, 4 * H)) * 0.5).astype(np.float32)
    wh = (rng.standard_normal((H, 4 * H)) * 0.5).astype(np.float32)
    body = [h.make_node("MatMul", ["x", "Wx"], ["xw"]),
            h.make_node("MatMul", ["h_in", "Wh"], ["hw"]),
            h.make_node("Add", ["xw", "hw"], ["z"]),
            h.make_node("Split", ["z", "split4"], ["zi", "zf", "zg", "zo"], axis=1),
            h.make_node("Sigmoid", ["zi"], ["gi"]), h.make_node("Sigmoid", ["zf"], ["gf"]),
            h.make_node("Tanh", ["zg"], ["gg"]), h.make_node("Sigmoid", ["zo"], ["go"]),
            h.make_node("Mul", ["gf", "c_in"], ["fc"]), h.make_node("Mul", ["gi", "gg"], ["ig"]),
            h.make_node("Add", ["fc", "ig"], ["c_out"]),
            h.make_node("Tanh", ["c_out"], ["tc"]), h.make_node("Mul", ["go", "tc"], ["h_out"]),
            h.make_node("Identity", ["cond_in"], ["cond_out"])]
    outs = [_vi("cond_out", [], T.BOOL), _vi("h_out", [1, H]), _vi("c_out", [1, H]), _vi("h_scan", [1, H])]
    if with_if:   # even iterations double the state, odd ones halve it (branches alternate inside the loop)
        then = h.make_graph([h.make_node("Mul", ["h_out", "two"], ["lt_mul"])], "lt", [], [_vi("lt_mul", None)])
        els = h.make_graph([h.make_node("Div", ["h_out", "two"], ["le_div"])], "le", [], [_vi("le_div", None)])
        body += [h.make_node("Mod", ["iter", "two_i"], ["parity"]),
                 h.make_node("Equal", ["parity", "zero_i"], ["even"]),
                 h.make_node("If", ["even"], ["h_scan"], name="parity_if", then_branch=then, else_branch=els)]
    else:
        body += [h.make_node("Identity", ["h_out"], ["h_scan"])]
    if nested:    # an inner loop of 2 steps over the state: its values sit inside two loops
        inner = h.make_graph([h.make_node("Identity", ["ic_in"], ["ic_out"]),
                              h.make_node("Sin", ["h_out"], ["in_sin"]),
                              h.make_node("Mul", ["in_sin", "in_sin"], ["in_sq"])], "inner",
                             [_vi("in_i", [], T.INT64), _vi("ic_in", [], T.BOOL)],
                             [_vi("ic_out", [], T.BOOL), _vi("in_sq", None)])
        body += [h.make_node("Loop", ["two_i", ""], ["inner_scan"], name="inner_loop", body=inner)]
        outs.append(_vi("inner_scan", None))
    bg = h.make_graph(body, "body", [_vi("iter", [], T.INT64), _vi("cond_in", [], T.BOOL),
                                     _vi("h_in", [1, H]), _vi("c_in", [1, H])], outs)
    loop_outs = ["h_last", "c_last", "h_seq"] + (["inner_all"] if nested else [])
    nodes = [h.make_node("Loop", ["M", "", "h0", "c0"], loop_outs, name="lstm_loop", body=bg)]
    m = _model(nodes, [_vi("x", [1, H]), _vi("h0", [1, H]), _vi("c0", [1, H])],
               [_vi(n, None) for n in loop_outs],
               [_init("Wx", wx), _init("Wh", wh), _init("M", np.int64(5)), _init("split4", np.full(4, H, np.int64)),
                _init("two", np.float32(2)), _init("two_i", np.int64(2)), _init("zero_i", np.int64(0))])
    return m, wx, wh


def _sig(v):
    return 1 / (1 + np.exp(-v))


def _lstm_ref(x, h0, c0, wx, wh, steps=5):
    rows = {k: [] for k in ("h_in", "c_in", "xw", "hw", "z", "gi", "gf", "gg", "go", "fc", "ig", "c_out", "tc",
                            "h_out", "zi", "zf", "zg", "zo")}
    hh, cc = h0, c0
    for _ in range(steps):
        r = {"h_in": hh, "c_in": cc, "xw": x @ wx, "hw": hh @ wh}
        r["z"] = r["xw"] + r["hw"]
        r["zi"], r["zf"], r["zg"], r["zo"] = np.split(r["z"], 4, axis=1)
        r["gi"], r["gf"], r["gg"], r["go"] = _sig(r["zi"]), _sig(r["zf"]), np.tanh(r["zg"]), _sig(r["zo"])
        r["fc"], r["ig"] = r["gf"] * cc, r["gi"] * r["gg"]
        r["c_out"] = r["fc"] + r["ig"]
        r["tc"] = np.tanh(r["c_out"])
        r["h_out"] = r["go"] * r["tc"]
        for k in rows:
            rows[k].append(r[k])
        hh, cc = r["h_out"], r["c_out"]
    return {k: np.stack(v) for k, v in rows.items()}


def _lstm_feed():
    rng = np.random.default_rng(3)
    return {k: rng.standard_normal((1, H)).astype(np.float32) for k in ("x", "h0", "c0")}


def test_loop_lstm_cell_stacked():
    m, wx, wh = _lstm_loop()
    feed = _lstm_feed()
    _, got, pm = _run_both(m, feed)
    vals = pm.values(got)
    ref = _lstm_ref(feed["x"], feed["h0"], feed["c0"], wx, wh)
    for k, v in ref.items():
        assert vals[k].shape == (5,) + v.shape[1:], k
        np.testing.assert_allclose(vals[k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    hows = {v: how for _, v, how in pm.mapping.values()}
    assert hows["h_out"] == "stacked" and "iter" not in hows and "cond_out" not in hows   # integers, bools


def test_loop_large_values_reduced_to_minmax():
    m, wx, wh = _lstm_loop()
    feed = _lstm_feed()
    _, got, pm = _run_both(m, feed, stack_limit=H)    # z (4H wide) is over the limit, h (H wide) is not
    vals = pm.values(got)
    ref = _lstm_ref(feed["x"], feed["h0"], feed["c0"], wx, wh)
    assert pm.minmax_values["z"].startswith("16 elements per iteration")
    np.testing.assert_allclose(vals["z"], [ref["z"].min(), ref["z"].max()], rtol=1e-5)
    assert vals["h_out"].shape == (5, 1, H)
    # the probe outputs hold a pair per run: no value grows with the trip count
    out = {o: got[o] for o, p in pm.probes.items() if p.how == "minmax"}
    assert out and all(a.shape == (2,) for a in out.values())


def test_loop_with_if_branches_alternating():
    m, wx, wh = _lstm_loop(with_if=True)
    feed = _lstm_feed()
    _, got, pm = _run_both(m, feed)
    vals = pm.values(got)
    ref = _lstm_ref(feed["x"], feed["h0"], feed["c0"], wx, wh)
    np.testing.assert_allclose(vals["lt_mul"], ref["h_out"][0::2] * 2, rtol=1e-5)   # iterations 0, 2, 4
    np.testing.assert_allclose(vals["le_div"], ref["h_out"][1::2] / 2, rtol=1e-5)   # iterations 1, 3
    assert BranchTally(pm).never_taken() == []


def test_nested_loops_use_minmax():
    m, wx, wh = _lstm_loop(nested=True)
    feed = _lstm_feed()
    _, got, pm = _run_both(m, feed)
    vals = pm.values(got)
    ref = _lstm_ref(feed["x"], feed["h0"], feed["c0"], wx, wh)
    sq = np.sin(ref["h_out"]) ** 2
    assert pm.minmax_values["in_sq"] == "inside nested loops"
    np.testing.assert_allclose(vals["in_sq"], [sq.min(), sq.max()], rtol=1e-5)
    np.testing.assert_allclose(vals["h_out"], ref["h_out"], rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------ Scan RNN

def _scan_rnn(symbolic=False):
    rng = np.random.default_rng(4)
    wx = rng.standard_normal((3, H)).astype(np.float32)
    wh = (rng.standard_normal((H, H)) * 0.5).astype(np.float32)
    b = rng.standard_normal(H).astype(np.float32)
    body = h.make_graph([h.make_node("MatMul", ["xt", "Wx"], ["sx"]), h.make_node("MatMul", ["hs", "Wh"], ["sh"]),
                         h.make_node("Add", ["sx", "sh"], ["s_sum"]), h.make_node("Add", ["s_sum", "bias"], ["s_pre"]),
                         h.make_node("Tanh", ["s_pre"], ["s_h"]), h.make_node("Identity", ["s_h"], ["s_y"])],
                        "rnn", [_vi("hs", [H]), _vi("xt", [3])], [_vi("s_h", [H]), _vi("s_y", [H])])
    seq = "T" if symbolic else 6
    nodes = [h.make_node("Scan", ["h0", "xs"], ["h_last", "ys"], name="rnn_scan", body=body, num_scan_inputs=1,
                         scan_output_axes=[0])]
    m = _model(nodes, [_vi("h0", [H]), _vi("xs", [seq, 3])], [_vi("h_last", None), _vi("ys", None)],
               [_init("Wx", wx), _init("Wh", wh), _init("bias", b)])
    return m, wx, wh, b


def test_scan_rnn_cell():
    m, wx, wh, b = _scan_rnn()
    rng = np.random.default_rng(5)
    feed = {"h0": rng.standard_normal(H).astype(np.float32), "xs": rng.standard_normal((6, 3)).astype(np.float32)}
    _, got, pm = _run_both(m, feed)
    vals = pm.values(got)
    hh, ref = feed["h0"], {k: [] for k in ("hs", "xt", "sx", "sh", "s_pre", "s_h")}
    for t in range(6):
        r = {"hs": hh, "xt": feed["xs"][t], "sx": feed["xs"][t] @ wx, "sh": hh @ wh}
        r["s_pre"] = r["sx"] + r["sh"] + b
        r["s_h"] = np.tanh(r["s_pre"])
        for k in ref:
            ref[k].append(r[k])
        hh = r["s_h"]
    for k, v in ref.items():
        np.testing.assert_allclose(vals[k], np.stack(v), rtol=1e-5, atol=1e-6, err_msg=k)
    assert vals["s_y"].shape == (6, H)


def test_scan_symbolic_dims_bound_by_dims():
    m, _, _, _ = _scan_rnn(symbolic=True)
    pm = build_probe(model_from_proto(m))
    hows = {v: how for _, v, how in pm.mapping.values()}
    assert hows["s_h"] == "stacked"            # per-iteration shape [H] is static whatever T is
    assert not pm.skipped


# ------------------------------------------------------------------------------------------ branch never taken

def test_if_branch_never_taken_reported():
    then = h.make_graph([h.make_node("Mul", ["x", "x"], ["huge_sq"])], "t", [], [_vi("huge_sq", None)])
    els = h.make_graph([h.make_node("Relu", ["x"], ["small_relu"])], "e", [], [_vi("small_relu", None)])
    nodes = [h.make_node("ReduceMax", ["x"], ["mx"], keepdims=0), h.make_node("Greater", ["mx", "limit"], ["big"]),
             h.make_node("If", ["big"], ["y"], name="guard_if", then_branch=then, else_branch=els)]
    m = _model(nodes, [_vi("x", [2, 2])], [_vi("y", None)], [_init("limit", np.float32(100))])
    pm = build_probe(model_from_proto(m))
    tally = BranchTally(pm)
    rng = np.random.default_rng(6)
    for _ in range(3):
        x = rng.standard_normal((2, 2)).astype(np.float32)
        _, got, pm2 = _run_both(m, {"x": x})
        vals = pm2.values(got)
        assert vals["huge_sq"] is None
        np.testing.assert_array_equal(vals["small_relu"], np.maximum(x, 0))
        tally.update(got)
    assert tally.never_taken() == [("", "guard_if", "then_branch")]
    (line,) = tally.report()
    assert "guard_if" in line and "then_branch" in line and "3 calibration runs" in line


def test_input_model_unchanged():
    m, _, _ = _conv_if()
    before = m.SerializeToString()
    ir = model_from_proto(m)
    from qcompiler.onnx_io.exporter import model_to_bytes
    ir_before = model_to_bytes(ir)
    build_probe(ir)
    build_probe(m)
    assert m.SerializeToString() == before and model_to_bytes(ir) == ir_before


def test_unshaped_loop_values_learn_their_shape():
    """Split's outputs inside the body have no inferred shape (onnx does not see the outer split sizes): one run
    of the first sample teaches the per-iteration shapes, and they are stacked after all."""
    from qcompiler.quant.calibration.body_probe import UNSHAPED, calibration_probe
    m, wx, wh = _lstm_loop(with_if=True)
    feed = _lstm_feed()
    assert build_probe(model_from_proto(m)).minmax_values.get("gi") == UNSHAPED
    pm = calibration_probe(m, feed)
    assert not pm.minmax_values
    sess = create_session(pm.proto)
    names = [o.name for o in sess.get_outputs()]
    vals = pm.values(dict(zip(names, sess.run(names, feed))))
    ref = _lstm_ref(feed["x"], feed["h0"], feed["c0"], wx, wh)
    for k in ("zi", "gi", "gg", "fc", "ig"):
        np.testing.assert_allclose(vals[k], ref[k], rtol=1e-5, atol=1e-6, err_msg=k)


# ------------------------------------------------------------------------------------------ calibrate(bodies=True)

def test_calibrate_observes_body_values():
    from qcompiler.quant.calibration.calibrate import calibrate
    m, wx, wh = _lstm_loop(with_if=True)
    feeds = [_lstm_feed()] + [{k: v * 0.5 for k, v in _lstm_feed().items()}]
    ir = model_from_proto(m)
    plain = calibrate(ir, iter(feeds))
    res = calibrate(ir, iter(feeds), bodies=True)
    assert plain.bodies is None and set(plain.observers) <= set(res.observers)
    for name in plain.observers:          # main-graph statistics unchanged
        assert plain.observers[name].range() == res.observers[name].range(), name
    refs = [_lstm_ref(f["x"], f["h0"], f["c0"], wx, wh) for f in feeds]
    for k in ("z", "gi", "c_out", "h_in"):
        lo = min(r[k].min() for r in refs)
        hi = max(r[k].max() for r in refs)
        np.testing.assert_allclose(res.observers[k].range(), (lo, hi), rtol=1e-5, err_msg=k)
    lt = np.concatenate([r["h_out"][0::2] * 2 for r in refs])
    np.testing.assert_allclose(res.observers["lt_mul"].range(), (lt.min(), lt.max()), rtol=1e-5)
    assert res.dtypes["h_out"] == np.float32 and res.samples == 2
    assert res.bodies.tally.never_taken() == []
    assert all(len(f) == 3 for f, _ in res.kept) and "h_seq" in res.kept[0][1]   # SQNR samples as before


def test_calibrate_reports_branch_never_taken():
    from qcompiler.quant.calibration.calibrate import calibrate
    m = _nested_if()
    x = np.ones((2, 3), np.float32)
    feeds = [{"c1": np.array(c1), "c2": np.array(True), "x": x} for c1 in (True, False)]
    res = calibrate(model_from_proto(m), iter(feeds), bodies=True)
    assert res.bodies.tally.never_taken() == [("outer/then_branch", "inner", "else_branch")]
    assert "ie_sub" not in res.observers and "it_mul" in res.observers and "oe_neg" in res.observers


# ------------------------------------------------------------------------------------------ edges

def test_zero_iterations_and_if_inside_nested_loops():
    """An If two loops deep reports its branches through reduced pairs; a loop that ran zero times yields None."""
    then = h.make_graph([h.make_node("Mul", ["acc_in", "two"], ["nt_mul"])], "nt", [], [_vi("nt_mul", None)])
    els = h.make_graph([h.make_node("Add", ["acc_in", "two"], ["ne_add"])], "ne", [], [_vi("ne_add", None)])
    inner = h.make_graph([h.make_node("Identity", ["ic"], ["ic_out"]),
                          h.make_node("Greater", ["acc_in", "ten"], ["big"]),
                          h.make_node("If", ["big"], ["acc_out"], name="deep_if", then_branch=then, else_branch=els)],
                         "inner", [_vi("ii", [], T.INT64), _vi("ic", [], T.BOOL), _vi("acc_in", [1])],
                         [_vi("ic_out", [], T.BOOL), _vi("acc_out", [1])])
    outer = h.make_graph([h.make_node("Identity", ["oc"], ["oc_out"]),
                          h.make_node("Loop", ["n_inner", "", "s_in"], ["s_out"], name="inner_loop", body=inner)],
                         "outer", [_vi("oi", [], T.INT64), _vi("oc", [], T.BOOL), _vi("s_in", [1])],
                         [_vi("oc_out", [], T.BOOL), _vi("s_out", [1])])
    nodes = [h.make_node("Loop", ["n_outer", "", "s0"], ["s_last"], name="outer_loop", body=outer)]
    m = _model(nodes, [_vi("n_outer", [], T.INT64), _vi("s0", [1])], [_vi("s_last", None)],
               [_init("n_inner", np.int64(3)), _init("two", np.float32(2)), _init("ten", np.float32(10))])
    feed = {"n_outer": np.array(2, np.int64), "s0": np.array([1.0], np.float32)}
    _, got, pm = _run_both(m, feed)
    vals = pm.values(got)
    # s: 1 -> 3 -> 5 -> 7 (outer 0) -> 9 -> 11 -> 22 (outer 1): Add while <= 10, Mul after; pairs [min, max]
    np.testing.assert_array_equal(vals["nt_mul"], [22, 22])
    np.testing.assert_array_equal(vals["ne_add"], [3, 11])
    np.testing.assert_array_equal(vals["s_in"], [[1], [7]])          # outer body input: stacked
    assert pm.minmax_values["acc_in"] == "inside nested loops"
    assert BranchTally(pm).never_taken() == []
    feed0 = {"n_outer": np.array(0, np.int64), "s0": np.array([1.0], np.float32)}
    _, got0, pm0 = _run_both(m, feed0)
    assert all(v is None for v in pm0.values(got0).values())
    tally = BranchTally(pm0)
    tally.update(got0)
    assert len(tally.never_taken()) == 2


def test_float16_values_and_scan_attributes():
    body = h.make_graph([h.make_node("Add", ["st", "xt"], ["st_new"]), h.make_node("Cast", ["st_new"], ["y32"], to=F),
                         h.make_node("Relu", ["y32"], ["y_relu"])],
                        "b", [_vi("st", [2], T.FLOAT16), _vi("xt", [2], T.FLOAT16)],
                        [_vi("st_new", [2], T.FLOAT16), _vi("y_relu", [2])])
    nodes = [h.make_node("Scan", ["s0", "xs"], ["s_last", "ys"], name="half_scan", body=body, num_scan_inputs=1,
                         scan_input_directions=[1], scan_output_directions=[1], scan_output_axes=[0])]
    m = _model(nodes, [_vi("s0", [2], T.FLOAT16), _vi("xs", [3, 2], T.FLOAT16)],
               [_vi("s_last", None, T.FLOAT16), _vi("ys", None)])
    xs = np.array([[1, -2], [3, 4], [-5, 6]], np.float16)
    _, got, pm = _run_both(m, {"s0": np.zeros(2, np.float16), "xs": xs})
    vals = pm.values(got)
    rev = xs[::-1]
    np.testing.assert_array_equal(vals["xt"], rev)                    # in the order the body ran
    np.testing.assert_array_equal(vals["st_new"], np.cumsum(rev, axis=0))
    assert vals["st_new"].dtype == np.float16


def test_learnt_shape_changes_in_later_sample_falls_back():
    """Sample 0 teaches a per-iteration shape that sample 1 does not have, with an If inside the loop (whose
    filler needs that shape): the run fails once, the probe falls back to min/max pairs, calibration goes on."""
    from qcompiler.quant.calibration.calibrate import calibrate
    then = h.make_graph([h.make_node("Mul", ["row", "two"], ["lf_mul"])], "t", [], [_vi("lf_mul", None)])
    els = h.make_graph([h.make_node("Neg", ["row"], ["lf_neg"])], "e", [], [_vi("lf_neg", None)])
    body = h.make_graph([h.make_node("Identity", ["c"], ["c_out"]),
                         h.make_node("Gather", ["xs", "i"], ["row"], axis=0),
                         h.make_node("Mod", ["i", "two_i"], ["par"]), h.make_node("Equal", ["par", "zero_i"], ["ev"]),
                         h.make_node("If", ["ev"], ["r2"], name="lf_if", then_branch=then, else_branch=els)],
                        "b", [_vi("i", [], T.INT64), _vi("c", [], T.BOOL)], [_vi("c_out", [], T.BOOL), _vi("r2", None)])
    nodes = [h.make_node("Shape", ["xs"], ["shp"]), h.make_node("Gather", ["shp", "zero_i"], ["n"], axis=0),
             h.make_node("Loop", ["n", ""], ["rows"], name="lf_loop", body=body)]
    m = _model(nodes, [_vi("xs", ["T", "W"])], [_vi("rows", None)],
               [_init("two", np.float32(2)), _init("two_i", np.int64(2)), _init("zero_i", np.int64(0))])
    feeds = [{"xs": np.ones((3, 2), np.float32)}, {"xs": np.full((4, 5), 3, np.float32)}]
    res = calibrate(model_from_proto(m), iter(feeds), bodies=True)
    assert res.bodies.fell_back and res.samples == 2
    assert res.observers["lf_mul"].range() == (2.0, 6.0) and res.observers["lf_neg"].range() == (-3.0, -1.0)


def test_calibrate_only_named_body_values():
    from qcompiler.quant.calibration.calibrate import calibrate
    m, _, _ = _lstm_loop()
    res = calibrate(model_from_proto(m), iter([_lstm_feed()]), bodies=["gi", "h_out"])
    assert {"gi", "h_out"} <= set(res.observers) and "z" not in res.observers and "c_out" not in res.observers
    assert {v for _, v, _ in res.bodies.probe.mapping.values()} == {"gi", "h_out"}


def test_calibrate_bodies_on_a_model_without_bodies_changes_nothing():
    from qcompiler.quant.calibration.calibrate import calibrate
    nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("Neg", ["r"], ["y"])]
    m = model_from_proto(_model(nodes, [_vi("x", [2])], [_vi("y", [2])]))
    feeds = [{"x": np.array([1, -2], np.float32)}]
    a, b = calibrate(m, iter(feeds)), calibrate(m, iter(feeds), bodies=True)
    assert b.bodies is None and {k: o.range() for k, o in a.observers.items()} == \
        {k: o.range() for k, o in b.observers.items()}


def test_idle_branch_values_mirrored_from_the_taken_one():
    """then_branch never taken: its Conv reads the same captured x and W as else_branch's, so it may borrow
    e_conv's statistics; its Relu has no twin (else applies Sigmoid)."""
    from qcompiler.quant.calibration.body_probe import mirrored_values
    from qcompiler.quant.calibration.calibrate import calibrate
    m, _, _ = _conv_if()
    then = next(a.g for a in m.graph.node[2].attribute if a.name == "then_branch")
    del then.node[0].input[2:]                 # then's Conv now reads exactly what else's reads
    ir = model_from_proto(m)
    rng = np.random.default_rng(7)
    feeds = [{"x": -np.abs(rng.standard_normal((1, 3, 5, 5))).astype(np.float32)} for _ in range(2)]
    res = calibrate(ir, iter(feeds), bodies=True)
    idle = res.bodies.tally.never_taken()
    assert idle == [("", "branchy", "then_branch")]
    assert mirrored_values(ir, idle) == {"t_conv": "e_conv"}
    assert "t_conv" not in res.observers and "e_conv" in res.observers


def test_old_opset_is_skipped_with_a_reason():
    then = h.make_graph([h.make_node("Relu", ["x"], ["o_relu"])], "t", [], [_vi("o_relu", None)])
    els = h.make_graph([h.make_node("Neg", ["x"], ["o_neg"])], "e", [], [_vi("o_neg", None)])
    m = _model([h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els)],
               [_vi("c", [], T.BOOL), _vi("x", [2])], [_vi("y", None)], opset=10)
    pm = build_probe(model_from_proto(m), extra_outputs=["x"])
    assert not pm.probes and "opset 10" in pm.skipped[0][2]
    create_session(pm.proto)


def test_minmax_values_get_a_min_max_observer_whatever_the_scheme():
    from qcompiler.quant.calibration.calibrate import MinMaxPowerObserver, calibrate
    m, wx, wh = _lstm_loop(nested=True)
    feed = _lstm_feed()
    res = calibrate(model_from_proto(m), iter([feed]), scheme="percentile", bodies=True)
    sq = np.sin(_lstm_ref(feed["x"], feed["h0"], feed["c0"], wx, wh)["h_out"]) ** 2
    assert isinstance(res.observers["in_sq"], MinMaxPowerObserver)
    np.testing.assert_allclose(res.observers["in_sq"].range(), (sq.min(), sq.max()), rtol=1e-5)
    assert not isinstance(res.observers["h_out"], MinMaxPowerObserver)    # stacked: the scheme's own observer
