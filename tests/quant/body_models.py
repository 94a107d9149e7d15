"""Small models whose network lives inside If/Loop/Scan bodies (the body tests and benchmarks/bench_bodies.py).

Each builder returns (proto, calibration feeds, evaluation feeds per branch). The evaluation feeds reach every
branch (both If conditions); the calibration feeds reach both branches except for `if_never_taken`.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from tests.helpers import make_model, tinfo

H, D, STEPS = 8, 8, 6


def init(name, arr, dtype=np.float32):
    return numpy_helper.from_array(np.asarray(arr, dtype), name)


def rand(shape, seed, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _img_feeds(n, seed, cond=None, shape=(1, 3, 8, 8), extra=None):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        f = {"x": rng.standard_normal(shape).astype(np.float32),
             "c": np.array(bool(i % 2) if cond is None else cond)}
        if extra:
            f.update(extra(i, rng))
        out.append(f)
    return out


def if_two_convs():
    """If: then Conv(x, w_shared) -> Relu, else Conv(x, w_shared) -> Sigmoid -> Conv(body weight); w_shared is
    an outer initializer both branches read (and the main graph does not)."""
    then = helper.make_graph(
        [helper.make_node("Conv", ["x", "w_shared", "b_shared"], ["t1"], pads=[1, 1, 1, 1], name="then_conv"),
         helper.make_node("Relu", ["t1"], ["t_out"], name="then_relu")],
        "then", [], [tinfo("t_out", [1, 4, 8, 8])])
    els = helper.make_graph(
        [helper.make_node("Conv", ["x", "w_shared", "b_shared"], ["e1"], pads=[1, 1, 1, 1], name="else_conv"),
         helper.make_node("Sigmoid", ["e1"], ["e2"], name="else_sigmoid"),
         helper.make_node("Conv", ["e2", "w_else"], ["e_out"], name="else_conv2")],
        "else", [], [tinfo("e_out", [1, 4, 8, 8])], [init("w_else", rand((4, 4, 1, 1), 3, 0.5))])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els, name="branch")]
    proto = make_model(nodes, [tinfo("x", [1, 3, 8, 8]), tinfo("c", [], T.BOOL)], [tinfo("y", [1, 4, 8, 8])],
                       [init("w_shared", rand((4, 3, 3, 3), 1, 0.3)), init("b_shared", rand((4,), 2, 0.1))])
    return proto, _img_feeds(32, 0), [_img_feeds(8, 9, True), _img_feeds(8, 9, False)]


def nested_if():
    """If c: (If d: Conv -> Relu -> Flatten -> MatMul -> Tanh, else: Flatten -> MatMul -> Tanh), else: Flatten ->
    MatMul(outer weight) -> Relu; the main graph adds a Relu after the If."""
    inner_then = helper.make_graph(
        [helper.make_node("Conv", ["x", "wc"], ["it1"], name="inner_conv"),
         helper.make_node("Relu", ["it1"], ["it2"], name="inner_relu"),
         helper.make_node("Flatten", ["it2"], ["it3"], name="inner_flatten"),
         helper.make_node("MatMul", ["it3", "wt"], ["it4"], name="inner_matmul"),
         helper.make_node("Tanh", ["it4"], ["it_out"], name="inner_tanh")],
        "inner_then", [], [tinfo("it_out", [1, 16])],
        [init("wc", rand((4, 3, 3, 3), 4, 0.3)), init("wt", rand((64, 16), 5, 0.15))])
    inner_else = helper.make_graph(
        [helper.make_node("Flatten", ["x"], ["ie1"], name="inner_else_flatten"),
         helper.make_node("MatMul", ["ie1", "wo"], ["ie2"], name="inner_else_matmul"),
         helper.make_node("Tanh", ["ie2"], ["ie_out"], name="inner_else_tanh")],
        "inner_else", [], [tinfo("ie_out", [1, 16])])
    outer_then = helper.make_graph(
        [helper.make_node("If", ["d"], ["o_then"], then_branch=inner_then, else_branch=inner_else, name="inner")],
        "outer_then", [], [tinfo("o_then", [1, 16])])
    outer_else = helper.make_graph(
        [helper.make_node("Flatten", ["x"], ["oe1"], name="outer_else_flatten"),
         helper.make_node("MatMul", ["oe1", "wo"], ["oe2"], name="outer_else_matmul"),
         helper.make_node("Relu", ["oe2"], ["o_else"], name="outer_else_relu")],
        "outer_else", [], [tinfo("o_else", [1, 16])])
    nodes = [helper.make_node("If", ["c"], ["y0"], then_branch=outer_then, else_branch=outer_else, name="outer"),
             helper.make_node("Relu", ["y0"], ["y"], name="main_relu")]
    proto = make_model(nodes, [tinfo("x", [1, 3, 6, 6]), tinfo("c", [], T.BOOL), tinfo("d", [], T.BOOL)],
                       [tinfo("y", [1, 16])], [init("wo", rand((108, 16), 6, 0.1))])

    def feeds(n, seed, c=None, d=None):
        rng = np.random.default_rng(seed)
        return [{"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32),
                 "c": np.array(bool(i % 2) if c is None else c),
                 "d": np.array(bool((i // 2) % 2) if d is None else d)} for i in range(n)]
    evals = [feeds(6, 9, True, True), feeds(6, 9, True, False), feeds(6, 9, False, False)]
    return proto, feeds(48, 0), evals


def loop_lstm_cell():
    """Loop over STEPS time steps of xs [STEPS, 1, D] (captured): an LSTM-style cell of MatMul/Add/Sigmoid/Tanh
    with loop-carried h and c, h stacked as a scan output. Outputs: final h, final c, every h."""
    nodes, inits = [helper.make_node("Identity", ["cond_in"], ["cond_out"], name="cell_cond"),
                    helper.make_node("Gather", ["xs", "i"], ["xt"], axis=0, name="cell_gather")], []
    gates = {}
    for k, (g, act) in enumerate((("i", "Sigmoid"), ("f", "Sigmoid"), ("g", "Tanh"), ("o", "Sigmoid"))):
        inits += [init(f"W{g}", rand((D, H), 10 + k, 0.4)), init(f"U{g}", rand((H, H), 20 + k, 0.4)),
                  init(f"b{g}", rand((1, H), 30 + k, 0.1) + (1.0 if g == "f" else 0.0))]
        nodes += [helper.make_node("MatMul", ["xt", f"W{g}"], [f"xw{g}"], name=f"cell_xw{g}"),
                  helper.make_node("MatMul", ["h_in", f"U{g}"], [f"hu{g}"], name=f"cell_hu{g}"),
                  helper.make_node("Add", [f"xw{g}", f"hu{g}"], [f"s{g}"], name=f"cell_s{g}"),
                  helper.make_node("Add", [f"s{g}", f"b{g}"], [f"p{g}"], name=f"cell_p{g}"),
                  helper.make_node(act, [f"p{g}"], [f"gate_{g}"], name=f"cell_{g}")]
        gates[g] = f"gate_{g}"
    nodes += [helper.make_node("Mul", ["gate_f", "c_in"], ["fc"], name="cell_fc"),
              helper.make_node("Mul", ["gate_i", "gate_g"], ["ig"], name="cell_ig"),
              helper.make_node("Add", ["fc", "ig"], ["c_out"], name="cell_c"),
              helper.make_node("Tanh", ["c_out"], ["tc"], name="cell_tc"),
              helper.make_node("Mul", ["gate_o", "tc"], ["h_out"], name="cell_h"),
              helper.make_node("Identity", ["h_out"], ["h_scan"], name="cell_hscan")]
    body = helper.make_graph(nodes, "cell",
                             [tinfo("i", [], T.INT64), tinfo("cond_in", [], T.BOOL), tinfo("h_in", [1, H]),
                              tinfo("c_in", [1, H])],
                             [tinfo("cond_out", [], T.BOOL), tinfo("h_out", [1, H]), tinfo("c_out", [1, H]),
                              tinfo("h_scan", [1, H])], inits)
    main = [helper.make_node("Loop", ["trips", "go", "h0", "c0"], ["h_final", "c_final", "hs"], body=body,
                             name="cell_loop")]
    proto = make_model(main, [tinfo("xs", [STEPS, 1, D]), tinfo("h0", [1, H]), tinfo("c0", [1, H])],
                       [tinfo("h_final", [1, H]), tinfo("c_final", [1, H]), tinfo("hs", [STEPS, 1, H])],
                       [init("trips", np.array(STEPS), np.int64), init("go", np.array(True), bool)])

    def feeds(n, seed):
        rng = np.random.default_rng(seed)
        return [{"xs": rng.standard_normal((STEPS, 1, D)).astype(np.float32),
                 "h0": (rng.standard_normal((1, H)) * 0.3).astype(np.float32),
                 "c0": (rng.standard_normal((1, H)) * 0.3).astype(np.float32)} for _ in range(n)]
    return proto, feeds(32, 0), [feeds(8, 9)]


def scan_rnn():
    """Scan over xs [STEPS, D]: h' = Tanh(x_t Wx + h Wh + b), h carried, every h' stacked."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_t", "Wx"], ["xw"], name="rnn_xw"),
         helper.make_node("MatMul", ["h_prev", "Wh"], ["hw"], name="rnn_hw"),
         helper.make_node("Add", ["xw", "hw"], ["s"], name="rnn_add"),
         helper.make_node("Add", ["s", "b"], ["p"], name="rnn_bias"),
         helper.make_node("Tanh", ["p"], ["h_next"], name="rnn_tanh"),
         helper.make_node("Identity", ["h_next"], ["y_t"], name="rnn_y")],
        "rnn", [tinfo("h_prev", [H]), tinfo("x_t", [D])], [tinfo("h_next", [H]), tinfo("y_t", [H])],
        [init("Wx", rand((D, H), 40, 0.4)), init("Wh", rand((H, H), 41, 0.3)), init("b", rand((H,), 42, 0.1))])
    nodes = [helper.make_node("Scan", ["h0", "xs"], ["h_last", "ys"], body=body, num_scan_inputs=1, name="rnn")]
    proto = make_model(nodes, [tinfo("h0", [H]), tinfo("xs", [STEPS, D])],
                       [tinfo("h_last", [H]), tinfo("ys", [STEPS, H])])

    def feeds(n, seed):
        rng = np.random.default_rng(seed)
        return [{"h0": (rng.standard_normal(H) * 0.3).astype(np.float32),
                 "xs": rng.standard_normal((STEPS, D)).astype(np.float32)} for _ in range(n)]
    return proto, feeds(32, 0), [feeds(8, 9)]


def if_never_taken():
    """`if_two_convs` calibrated with c always True: the else branch is never taken."""
    proto, _, evals = if_two_convs()
    return proto, _img_feeds(32, 0, True), evals


def if_lstm_gru():
    """If: then an LSTM over xs [STEPS, 1, D], else a GRU: W/R inside bodies (per channel on the gate axis)."""
    then = helper.make_graph(
        [helper.make_node("LSTM", ["xs", "W_lstm", "R_lstm", "B_lstm"], ["ly", "lh"], hidden_size=H,
                          name="body_lstm"),
         helper.make_node("Squeeze", ["lh", "ax0"], ["t_out"], name="then_squeeze")],
        "then", [], [tinfo("t_out", [1, H])],
        [init("W_lstm", rand((1, 4 * H, D), 50, 0.3)), init("R_lstm", rand((1, 4 * H, H), 51, 0.3)),
         init("B_lstm", rand((1, 8 * H), 52, 0.1))])
    els = helper.make_graph(
        [helper.make_node("GRU", ["xs", "W_gru", "R_gru"], ["gy", "gh"], hidden_size=H, name="body_gru"),
         helper.make_node("Squeeze", ["gh", "ax0"], ["e_out"], name="else_squeeze")],
        "else", [], [tinfo("e_out", [1, H])],
        [init("W_gru", rand((1, 3 * H, D), 53, 0.3)), init("R_gru", rand((1, 3 * H, H), 54, 0.3))])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=els, name="rnn_branch")]
    proto = make_model(nodes, [tinfo("xs", [STEPS, 1, D]), tinfo("c", [], T.BOOL)], [tinfo("y", [1, H])],
                       [init("ax0", np.array([0]), np.int64)])

    def feeds(n, seed, cond=None):
        rng = np.random.default_rng(seed)
        return [{"xs": rng.standard_normal((STEPS, 1, D)).astype(np.float32),
                 "c": np.array(bool(i % 2) if cond is None else cond)} for i in range(n)]
    return proto, feeds(32, 0), [feeds(8, 9, True), feeds(8, 9, False)]


MODELS = {"if_two_convs": if_two_convs, "nested_if": nested_if, "loop_lstm_cell": loop_lstm_cell,
          "scan_rnn": scan_rnn, "if_never_taken": if_never_taken, "if_lstm_gru": if_lstm_gru}
