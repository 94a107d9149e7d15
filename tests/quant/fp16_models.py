"""Small float16 models as users export them (torch `.half()`, onnxconverter-common's float16 converter with
keep_io_types False or True): a CNN (Conv with bias, Relu, depthwise Conv, GlobalAveragePool, Gemm), a MatMul MLP
and a transformer block (LayerNormalization, Q/K/V MatMuls, Softmax attention, residual Adds, a Gelu-free MLP).

`build(family, opset, io)`: io "fp16" (every tensor float16), "keep_io" (float32 inputs and outputs with a Cast
at each edge, fp16 inside) or "bf16" (every tensor bfloat16). Returns (ModelProto, feeds).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
from onnx import TensorProto as T
from onnx import helper, numpy_helper

N_SAMPLES = 8
ELEM = {"fp16": T.FLOAT16, "keep_io": T.FLOAT16, "bf16": T.BFLOAT16, "fp32": T.FLOAT}
NP = {T.FLOAT16: np.float16, T.BFLOAT16: ml_dtypes.bfloat16, T.FLOAT: np.float32}


def _layer_norm(x, gamma, beta, out, opset, p):
    """LayerNormalization at opset >= 17, its decomposition (as exporters write it) below."""
    if opset >= 17:
        return [helper.make_node("LayerNormalization", [x, gamma, beta], [out], name=f"{p}_ln", axis=-1,
                                 epsilon=1e-5)]
    mean_kw = {"axes": [-1]} if opset < 18 else {}
    mean_in = [] if opset < 18 else [f"{p}_axes"]
    return [helper.make_node("ReduceMean", [x] + mean_in, [f"{p}_mu"], name=f"{p}_mean", **mean_kw),
            helper.make_node("Sub", [x, f"{p}_mu"], [f"{p}_d"], name=f"{p}_sub"),
            helper.make_node("Mul", [f"{p}_d", f"{p}_d"], [f"{p}_d2"], name=f"{p}_sq"),
            helper.make_node("ReduceMean", [f"{p}_d2"] + mean_in, [f"{p}_var"], name=f"{p}_var_mean", **mean_kw),
            helper.make_node("Add", [f"{p}_var", "eps"], [f"{p}_ve"], name=f"{p}_add_eps"),
            helper.make_node("Sqrt", [f"{p}_ve"], [f"{p}_std"], name=f"{p}_sqrt"),
            helper.make_node("Div", [f"{p}_d", f"{p}_std"], [f"{p}_n"], name=f"{p}_div"),
            helper.make_node("Mul", [f"{p}_n", gamma], [f"{p}_g"], name=f"{p}_mul_gamma"),
            helper.make_node("Add", [f"{p}_g", beta], [out], name=f"{p}_add_beta")]


def _cnn(opset):
    r = np.random.default_rng(1)
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "wd", "bd"], ["c2"], name="dwconv", pads=[1, 1, 1, 1], group=8),
             helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
             helper.make_node("Conv", ["r2", "w3"], ["c3"], name="conv3"),
             helper.make_node("GlobalAveragePool", ["c3"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "wg", "bg"], ["y"], name="fc", transB=1)]
    consts = {"w1": r.standard_normal((8, 3, 3, 3)) * 0.3, "b1": r.standard_normal(8) * 0.1,
              "wd": r.standard_normal((8, 1, 3, 3)) * 0.4, "bd": r.standard_normal(8) * 0.1,
              "w3": r.standard_normal((16, 8, 1, 1)) * 0.3, "wg": r.standard_normal((10, 16)) * 0.3,
              "bg": r.standard_normal(10) * 0.1}
    return nodes, consts, {"x": [1, 3, 12, 12]}, {"y": [1, 10]}


def _mlp(opset):
    r = np.random.default_rng(2)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
             helper.make_node("Add", ["a", "b1"], ["ab"], name="add1"),
             helper.make_node("Relu", ["ab"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="gemm")]
    consts = {"w1": r.standard_normal((16, 32)) * 0.3, "b1": r.standard_normal(32) * 0.1,
              "w2": r.standard_normal((32, 8)) * 0.3, "b2": r.standard_normal(8) * 0.1}
    return nodes, consts, {"x": [4, 16]}, {"y": [4, 8]}


def _transformer(opset):
    r = np.random.default_rng(3)
    d, t = 16, 6
    nodes = _layer_norm("x", "g1", "be1", "n1", opset, "ln1")
    nodes += [helper.make_node("MatMul", ["n1", "wq"], ["q"], name="q_proj"),
              helper.make_node("MatMul", ["n1", "wk"], ["k"], name="k_proj"),
              helper.make_node("MatMul", ["n1", "wv"], ["v"], name="v_proj"),
              helper.make_node("Transpose", ["k"], ["kt"], name="k_t", perm=[0, 2, 1]),
              helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
              helper.make_node("Mul", ["s", "inv_sqrt_d"], ["ss"], name="scale"),
              helper.make_node("Softmax", ["ss"], ["a"], name="softmax", axis=-1),
              helper.make_node("MatMul", ["a", "v"], ["ctx"], name="attend"),
              helper.make_node("MatMul", ["ctx", "wo"], ["o"], name="o_proj"),
              helper.make_node("Add", ["o", "bo"], ["ob"], name="o_bias"),
              helper.make_node("Add", ["x", "ob"], ["h"], name="residual1")]
    nodes += _layer_norm("h", "g2", "be2", "n2", opset, "ln2")
    nodes += [helper.make_node("MatMul", ["n2", "wf1"], ["f1"], name="ffn1"),
              helper.make_node("Add", ["f1", "bf1"], ["f1b"], name="ffn1_bias"),
              helper.make_node("Relu", ["f1b"], ["f1r"], name="ffn_act"),
              helper.make_node("MatMul", ["f1r", "wf2"], ["f2"], name="ffn2"),
              helper.make_node("Add", ["h", "f2"], ["y"], name="residual2")]
    consts = {"g1": 1 + 0.1 * r.standard_normal(d), "be1": 0.1 * r.standard_normal(d),
              "g2": 1 + 0.1 * r.standard_normal(d), "be2": 0.1 * r.standard_normal(d),
              "wq": r.standard_normal((d, d)) * 0.25, "wk": r.standard_normal((d, d)) * 0.25,
              "wv": r.standard_normal((d, d)) * 0.25, "wo": r.standard_normal((d, d)) * 0.25,
              "bo": 0.1 * r.standard_normal(d), "wf1": r.standard_normal((d, 2 * d)) * 0.25,
              "bf1": 0.1 * r.standard_normal(2 * d), "wf2": r.standard_normal((2 * d, d)) * 0.25,
              "inv_sqrt_d": np.array(1 / np.sqrt(d)), "eps": np.array(1e-5)}
    return nodes, consts, {"x": [2, t, d]}, {"y": [2, t, d]}


FAMILIES = {"cnn": _cnn, "mlp": _mlp, "transformer": _transformer}


def build(family: str, opset: int, io: str = "fp16", seed: int = 0):
    elem = ELEM[io]
    nodes, consts, ins, outs = FAMILIES[family](opset)
    used = {i for n in nodes for i in n.input}
    inits = [numpy_helper.from_array(np.asarray(a, np.float32).astype(NP[elem]), k) for k, a in consts.items()
             if k in used]
    if "ln1_axes" in used:
        inits += [numpy_helper.from_array(np.array([-1], np.int64), f"{p}_axes") for p in ("ln1", "ln2")]
    if io == "keep_io":   # onnxconverter-common's keep_io_types=True: Casts at the edges, fp16 inside
        edge = [helper.make_node("Cast", [k], [f"{k}_fp16"], name=f"{k}_cast_in", to=T.FLOAT16) for k in ins]
        for n in nodes:
            n.input[:] = [f"{i}_fp16" if i in ins or i in outs else i for i in n.input]
            n.output[:] = [f"{o}_fp16" if o in outs else o for o in n.output]
        nodes = edge + nodes + [helper.make_node("Cast", [f"{k}_fp16"], [k], name=f"{k}_cast_out", to=T.FLOAT)
                                for k in outs]
        io_elem = T.FLOAT
    else:
        io_elem = elem
    g = helper.make_graph(nodes, family, [helper.make_tensor_value_info(k, io_elem, s) for k, s in ins.items()],
                          [helper.make_tensor_value_info(k, io_elem, s) for k, s in outs.items()], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10 if opset >= 21 else 9
    rng = np.random.default_rng(seed)
    feeds = [{k: rng.standard_normal(s).astype(NP[io_elem]) for k, s in ins.items()} for _ in range(N_SAMPLES)]
    return m, feeds


def to_float16(model, keep_io_types: bool = False):
    """A float32 ModelProto converted to float16 as onnxconverter-common's float16 converter does (a copy):
    initializers, Constant values, declared types, Cast(to=float) and the bodies of If/Loop/Scan become
    float16; `keep_io_types`: float32 graph inputs/outputs with a Cast at each edge."""
    from onnx import ModelProto
    m = ModelProto()
    m.CopyFrom(model)

    def conv_tensor(t):     # clipped to +-1e4 as onnxconverter-common does (attention masks of -3.4e38)
        if t.data_type == T.FLOAT:
            t.CopyFrom(numpy_helper.from_array(np.clip(numpy_helper.to_array(t), -1e4, 1e4).astype(np.float16),
                                               t.name))

    def conv_type(vi):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.elem_type == T.FLOAT:
            tt.elem_type = T.FLOAT16

    def conv_graph(g, top):
        for t in g.initializer:
            conv_tensor(t)
        for vi in list(g.value_info) + ([] if top and keep_io_types else list(g.input) + list(g.output)):
            conv_type(vi)
        for n in g.node:
            for a in n.attribute:
                if a.name == "to" and n.op_type == "Cast" and a.i == T.FLOAT:
                    a.i = T.FLOAT16
                if a.type == a.TENSOR:
                    conv_tensor(a.t)
                for sub in ([a.g] if a.type == a.GRAPH else list(a.graphs)):
                    conv_graph(sub, False)

    conv_graph(m.graph, True)
    if keep_io_types:
        g = m.graph
        inits = {t.name for t in g.initializer}
        produced = {o for n in g.node for o in n.output}
        for vi in list(g.input) + list(g.output):   # an initializer that is also an input or output: float16
            if vi.name in inits or (vi.name not in produced and vi in g.output):
                conv_type(vi)
        ins = [i.name for i in g.input if i.type.tensor_type.elem_type == T.FLOAT and i.name not in inits]
        outs = [o.name for o in g.output if o.type.tensor_type.elem_type == T.FLOAT and o.name in produced]
        rename = {k: f"{k}_fp16" for k in ins + outs}

        def rename_in(nodes):    # bodies read the graph's inputs and outputs by name too
            for n in nodes:
                n.input[:] = [rename.get(i, i) for i in n.input]
                n.output[:] = [rename.get(o, o) for o in n.output]
                for a in n.attribute:
                    for sub in ([a.g] if a.type == a.GRAPH else list(a.graphs)):
                        rename_in(sub.node)
                        for o in sub.output:
                            o.name = rename.get(o.name, o.name)
        rename_in(g.node)
        nodes = [helper.make_node("Cast", [k], [rename[k]], name=f"{k}_to_fp16", to=T.FLOAT16) for k in ins]
        nodes += list(g.node)
        nodes += [helper.make_node("Cast", [rename[k]], [k], name=f"{k}_to_fp32", to=T.FLOAT) for k in outs]
        del g.node[:]
        g.node.extend(nodes)
    return m


def feeds_float16(feeds, model):
    """`feeds` (float32) as the converted model takes them."""
    want = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    return [{k: (v.astype(np.float16) if v.dtype == np.float32 and want.get(k) == T.FLOAT16 else v)
             for k, v in f.items()} for f in feeds]
