"""Small decoder LLMs built in the tests, in the idioms exporters write them.

`decoder(...)` returns (ModelProto, feeds list): token ids -> embedding Gather -> `layers` blocks (RMSNorm, q/k/v
projections, single-head attention, o_proj, residual, SiLU-gated MLP, residual) -> final RMSNorm -> head. The head
is one of:
- "tied_transpose": `MatMul(x, Transpose(E))` (torch dynamo / legacy export of tied embeddings),
- "tied_gemm": `Gemm(x2d, E, transB=1)` on a flattened x (older exporters),
- "untied": `MatMul(x, W_head)` with W_head [H, V] of its own,
- "transposed_init": `MatMul(x, Transpose(W))` with W [V, H] its own initializer (not the embedding).
Weights are random with a few outlier input channels (trained LLMs have them; random ones do not), so
algorithms and grids have something to do.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper


def _w(rng, shape, outliers: int = 2, scale: float = 0.05):
    w = rng.standard_normal(shape).astype(np.float32) * scale
    if outliers:
        rows = rng.choice(shape[0], size=min(outliers, shape[0]), replace=False)
        w[rows] *= 8.0          # a few input channels 8x the rest
    return w


def decoder(vocab: int = 96, hidden: int = 64, inter: int = 128, layers: int = 2, head: str = "tied_transpose",
            seq: int = 12, samples: int = 6, seed: int = 0, opset: int = 17, dtype=np.float32):
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def init(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr).astype(dtype) if np.asarray(arr).dtype.kind == "f"
                                             else np.asarray(arr), name))
        return name

    def node(op, ins, outs, **attrs):
        nodes.append(helper.make_node(op, ins, outs, name=outs[0] + "_node", **attrs))
        return outs[0]

    emb = init("embed.weight", _w(rng, (vocab, hidden), outliers=0, scale=0.5))
    x = node("Gather", [emb, "input_ids"], ["embed_out"], axis=0)
    eps = init("eps", np.array(1e-5))
    two = init("two", np.array(2.0))

    def rmsnorm(x, name):
        g = init(f"{name}.weight", 1.0 + 0.1 * rng.standard_normal(hidden))
        sq = node("Pow", [x, two], [f"{name}_sq"])
        ms = node("ReduceMean", [sq], [f"{name}_ms"], axes=[-1], keepdims=1) if opset < 18 else \
            node("ReduceMean", [sq, init(f"{name}_axes", np.array([-1], np.int64))], [f"{name}_ms"], keepdims=1)
        r = node("Sqrt", [node("Add", [ms, eps], [f"{name}_mse"])], [f"{name}_rms"])
        return node("Mul", [node("Div", [x, r], [f"{name}_n"]), g], [f"{name}_out"])

    scale = init("attn_scale", np.array(1.0 / np.sqrt(hidden)))
    for i in range(layers):
        p = f"layers.{i}"
        h = rmsnorm(x, f"{p}.input_layernorm")
        q = node("MatMul", [h, init(f"{p}.q_proj.weight", _w(rng, (hidden, hidden)))], [f"{p}_q"])
        k = node("MatMul", [h, init(f"{p}.k_proj.weight", _w(rng, (hidden, hidden)))], [f"{p}_k"])
        v = node("MatMul", [h, init(f"{p}.v_proj.weight", _w(rng, (hidden, hidden)))], [f"{p}_v"])
        kt = node("Transpose", [k], [f"{p}_kt"], perm=[0, 2, 1])
        s = node("Mul", [node("MatMul", [q, kt], [f"{p}_qk"]), scale], [f"{p}_scores"])
        a = node("MatMul", [node("Softmax", [s], [f"{p}_probs"], axis=-1), v], [f"{p}_ctx"])
        o = node("MatMul", [a, init(f"{p}.o_proj.weight", _w(rng, (hidden, hidden)))], [f"{p}_o"])
        x = node("Add", [x, o], [f"{p}_res1"])
        h = rmsnorm(x, f"{p}.post_attention_layernorm")
        gate = node("MatMul", [h, init(f"{p}.gate_proj.weight", _w(rng, (hidden, inter)))], [f"{p}_gate"])
        up = node("MatMul", [h, init(f"{p}.up_proj.weight", _w(rng, (hidden, inter)))], [f"{p}_up"])
        act = node("Mul", [gate, node("Sigmoid", [gate], [f"{p}_sig"])], [f"{p}_silu"])
        down = node("MatMul", [node("Mul", [act, up], [f"{p}_gu"]),
                               init(f"{p}.down_proj.weight", _w(rng, (inter, hidden)))], [f"{p}_down"])
        x = node("Add", [x, down], [f"{p}_res2"])
    x = rmsnorm(x, "norm")
    if head == "tied_transpose":
        et = node("Transpose", [emb], ["embed_t"], perm=[1, 0])
        node("MatMul", [x, et], ["logits"])
    elif head == "tied_gemm":
        shape = init("flat_shape", np.array([-1, hidden], np.int64))
        x2 = node("Reshape", [x, shape], ["x2d"])
        y2 = node("Gemm", [x2, emb], ["logits2d"], transB=1)
        out_shape = init("out_shape", np.array([1, -1, vocab], np.int64))
        node("Reshape", [y2, out_shape], ["logits"])
    elif head == "untied":
        node("MatMul", [x, init("lm_head.weight", _w(rng, (hidden, vocab)))], ["logits"])
    elif head == "transposed_init":
        wt = node("Transpose", [init("lm_head.weight", _w(rng, (vocab, hidden)))], ["lm_head_t"], perm=[1, 0])
        node("MatMul", [x, wt], ["logits"])
    else:
        raise ValueError(head)
    elem = T.FLOAT16 if dtype == np.float16 else T.FLOAT
    graph = helper.make_graph(nodes, "decoder", [helper.make_tensor_value_info("input_ids", T.INT64, [1, seq])],
                              [helper.make_tensor_value_info("logits", elem, [1, seq, vocab])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    feeds = [{"input_ids": rng.integers(0, vocab, (1, seq)).astype(np.int64)} for _ in range(samples)]
    return model, feeds


def decoder_with_bodies(vocab: int = 96, hidden: int = 64, inter: int = 128, seq: int = 12, samples: int = 8,
                        seed: int = 0):
    """A decoder whose MLP sits in an If and a shared refinement layer in a Loop, as exporters write a
    data-dependent branch or a recurrent stack: Gather -> If(use_mlp: then SiLU-gated MLP on outer weights,
    else one projection on a weight of the branch's own) + residual -> Loop(2 trips: x + x @ W_loop) -> norm ->
    tied head `MatMul(x, Transpose(E))`. The calibration feeds take both branches."""
    rng = np.random.default_rng(seed)
    inits = []

    def init(name, arr, where=inits):
        where.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def mk(op, ins, outs, **attrs):
        return helper.make_node(op, ins, outs, name=outs[0] + "_node", **attrs)

    emb = init("embed.weight", _w(rng, (vocab, hidden), outliers=0, scale=0.5))
    gate = init("mlp.gate_proj.weight", _w(rng, (hidden, inter)))
    up = init("mlp.up_proj.weight", _w(rng, (hidden, inter)))
    down = init("mlp.down_proj.weight", _w(rng, (inter, hidden)))
    w_loop = init("loop.proj.weight", _w(rng, (hidden, hidden), scale=0.03))
    then = helper.make_graph(
        [mk("MatMul", ["x0", gate], ["t_gate"]), mk("Sigmoid", ["t_gate"], ["t_sig"]),
         mk("Mul", ["t_gate", "t_sig"], ["t_silu"]), mk("MatMul", ["x0", up], ["t_up"]),
         mk("Mul", ["t_silu", "t_up"], ["t_gu"]), mk("MatMul", ["t_gu", down], ["t_down"])],
        "then", [], [helper.make_tensor_value_info("t_down", T.FLOAT, None)])
    else_inits: list = []
    init("branch.proj.weight", _w(rng, (hidden, hidden)), else_inits)
    els = helper.make_graph([mk("MatMul", ["x0", "branch.proj.weight"], ["e_proj"])], "else", [],
                            [helper.make_tensor_value_info("e_proj", T.FLOAT, None)], else_inits)
    body = helper.make_graph(
        [mk("MatMul", ["x_in", w_loop], ["l_proj"]), mk("Add", ["x_in", "l_proj"], ["x_next"]),
         mk("Identity", ["cond_in"], ["cond_out"])],
        "loop_body", [helper.make_tensor_value_info("iter", T.INT64, []),
                      helper.make_tensor_value_info("cond_in", T.BOOL, []),
                      helper.make_tensor_value_info("x_in", T.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", T.BOOL, []), helper.make_tensor_value_info("x_next", T.FLOAT, None)])
    init("trips", np.array(2, np.int64))
    init("true", np.array(True))
    et = "embed_t"
    nodes = [mk("Gather", [emb, "input_ids"], ["x0"], axis=0),
             mk("If", ["use_mlp"], ["mlp_out"], then_branch=then, else_branch=els),
             mk("Add", ["x0", "mlp_out"], ["x1"]),
             mk("Loop", ["trips", "true", "x1"], ["x2"], body=body),
             mk("Transpose", [emb], [et], perm=[1, 0]),
             mk("MatMul", ["x2", et], ["logits"])]
    graph = helper.make_graph(nodes, "decoder_bodies",
                              [helper.make_tensor_value_info("input_ids", T.INT64, [1, seq]),
                               helper.make_tensor_value_info("use_mlp", T.BOOL, [])],
                              [helper.make_tensor_value_info("logits", T.FLOAT, [1, seq, vocab])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    feeds = [{"input_ids": rng.integers(0, vocab, (1, seq)).astype(np.int64), "use_mlp": np.array(i % 2 == 0)}
             for i in range(samples)]
    return model, feeds


def gemm_mlp(rows: int = 6, hidden: int = 64, inter: int = 128, samples: int = 6, seed: int = 0, dtype=np.float32):
    """Every Gemm form older exporters write for a Linear, on flattened tokens x [rows, hidden]:
    up: Gemm(x, W [inter, hidden], C [1, inter], transB=1) -> Relu -> down: Gemm(h, W [inter, hidden],
    C [rows, hidden] (a full 2-D bias), alpha 0.5, beta 2) -> a Gemm with transA=1 on the transposed result ->
    out [rows, hidden]. Returns (ModelProto, feeds)."""
    rng = np.random.default_rng(seed)
    elem = T.FLOAT16 if dtype == np.float16 else T.FLOAT
    inits = [numpy_helper.from_array(a.astype(dtype), n) for n, a in (
        ("up.weight", _w(rng, (inter, hidden))), ("up.bias", 0.1 * rng.standard_normal((1, inter))),
        ("down.weight", _w(rng, (inter, hidden))), ("down.bias", 0.1 * rng.standard_normal((rows, hidden))),
        ("out.weight", _w(rng, (hidden, hidden))), ("out.bias", 0.1 * rng.standard_normal(hidden)))]
    nodes = [helper.make_node("Gemm", ["x", "up.weight", "up.bias"], ["up"], name="up", transB=1),
             helper.make_node("Relu", ["up"], ["act"], name="act"),
             helper.make_node("Gemm", ["act", "down.weight", "down.bias"], ["down"], name="down", alpha=0.5,
                              beta=2.0),
             helper.make_node("Transpose", ["down"], ["down_t"], name="down_t", perm=[1, 0]),
             helper.make_node("Gemm", ["down_t", "out.weight", "out.bias"], ["y"], name="out", transA=1)]
    graph = helper.make_graph(nodes, "gemm_mlp", [helper.make_tensor_value_info("x", elem, [rows, hidden])],
                              [helper.make_tensor_value_info("y", elem, [rows, hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    feeds = [{"x": rng.standard_normal((rows, hidden)).astype(dtype)} for _ in range(samples)]
    return model, feeds
