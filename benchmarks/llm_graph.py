"""A synthetic LLM-shaped ONNX model: a stack of pre-LN transformer blocks with decomposed LayerNorm and GELU.

Why: benchmarks (pattern matching, IR import/export) need a ~90k-node graph shaped like an exported decoder
without shipping one. Each block is written the way PyTorch exports it:

    h  = LN(x)                          ReduceMean-Sub-Pow-ReduceMean-Add-Sqrt-Div-Mul-Add   (9 nodes)
    q,k,v = h@W+b                       MatMul+Add ×3, Reshape+Transpose ×3 (heads)
    a  = Softmax(q@kᵀ · s) @ v          MatMul, Mul, Softmax, MatMul, Transpose, Reshape
    x  = x + (a@Wo+bo)                  MatMul+Add, residual Add
    h  = LN(x)                          (9 nodes)
    x  = x + GELU(h@W1+b1)@W2+b2        MatMul+Add, erf-GELU Div-Erf-Add-Mul-Mul (5), MatMul+Add, residual Add

= NODES_PER_LAYER nodes per block. The scalar constants (0.5, √2, 1, 2, epsilon, attention scale, reshape
shapes) are ONE shared initializer each for the whole model, as exporters emit them: field notes §4 (a fold
into the shared GELU 0.5 must never rescale every GELU). Weights are per layer and small (hidden=64).
Opset 17 (ReduceMean takes `axes` as an attribute).
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

NODES_PER_LAYER = 49
OPSET = 17


def layers_for_nodes(min_nodes: int) -> int:
    """The number of blocks needed for a graph of at least `min_nodes` nodes."""
    return -(-min_nodes // NODES_PER_LAYER)


def make_llm_graph(n_layers: int, hidden: int = 64, heads: int = 4, seq: int = 16, ffn_mult: int = 1,
                   seed: int = 0, eps: float = 1e-5) -> onnx.ModelProto:
    """Build the model: input 'x' [1, seq, hidden] float32, output 'y' same shape; n_layers*49 nodes.

    ffn_mult=1 keeps the weights at 6·hidden² floats per block (≈98 KB at hidden=64, ≈180 MB for 90k nodes).
    """
    if hidden % heads:
        raise ValueError(f"hidden={hidden} must be a multiple of heads={heads}")
    rng = np.random.default_rng(seed)
    hd, ffn = hidden // heads, hidden * ffn_mult
    f32 = np.float32
    inits: list = []
    nodes: list = []

    def const(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    # shared scalars and shapes: one initializer each for the whole model
    c_half = const("c_half", np.array(0.5, f32))
    c_sqrt2 = const("c_sqrt2", np.array(math.sqrt(2.0), f32))
    c_one = const("c_one", np.array(1.0, f32))
    c_two = const("c_two", np.array(2.0, f32))
    c_eps = const("c_eps", np.array(eps, f32))
    c_scale = const("c_attn_scale", np.array(1.0 / math.sqrt(hd), f32))
    s_heads = const("shape_heads", np.array([1, seq, heads, hd], np.int64))
    s_flat = const("shape_flat", np.array([1, seq, hidden], np.int64))

    def node(op, ins, name, **attrs):
        out = f"{name}_out"
        nodes.append(helper.make_node(op, ins, [out], name=name, **attrs))
        return out

    def weight(name, shape, scale):
        return const(name, (rng.standard_normal(shape) * scale).astype(f32))

    def layernorm(x, p):
        mean = node("ReduceMean", [x], f"{p}_mean", axes=[-1], keepdims=1)
        d = node("Sub", [x, mean], f"{p}_sub")
        sq = node("Pow", [d, c_two], f"{p}_pow")
        var = node("ReduceMean", [sq], f"{p}_var", axes=[-1], keepdims=1)
        ve = node("Add", [var, c_eps], f"{p}_addeps")
        sd = node("Sqrt", [ve], f"{p}_sqrt")
        n = node("Div", [d, sd], f"{p}_div")
        g = node("Mul", [n, const(f"{p}_gamma", (1 + 0.1 * rng.standard_normal(hidden)).astype(f32))], f"{p}_scale")
        return node("Add", [g, const(f"{p}_beta", (0.1 * rng.standard_normal(hidden)).astype(f32))], f"{p}_shift")

    def linear(x, p, n_in, n_out):
        m = node("MatMul", [x, weight(f"{p}_w", (n_in, n_out), 1.0 / math.sqrt(n_in))], f"{p}_matmul")
        return node("Add", [m, const(f"{p}_b", (0.02 * rng.standard_normal(n_out)).astype(f32))], f"{p}_bias")

    def gelu(x, p):
        d = node("Div", [x, c_sqrt2], f"{p}_div")
        e = node("Erf", [d], f"{p}_erf")
        a = node("Add", [e, c_one], f"{p}_add")
        m = node("Mul", [x, a], f"{p}_mul")
        return node("Mul", [m, c_half], f"{p}_half")

    x = "x"
    for i in range(n_layers):
        p = f"l{i}"
        h = layernorm(x, f"{p}_ln1")
        qkv = []
        for nm, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
            t = linear(h, f"{p}_{nm}", hidden, hidden)
            r = node("Reshape", [t, s_heads], f"{p}_{nm}_split")
            qkv.append(node("Transpose", [r], f"{p}_{nm}_heads", perm=perm))
        s = node("MatMul", qkv[:2], f"{p}_scores")
        s = node("Mul", [s, c_scale], f"{p}_scaled")
        s = node("Softmax", [s], f"{p}_softmax", axis=-1)
        a = node("MatMul", [s, qkv[2]], f"{p}_context")
        a = node("Transpose", [a], f"{p}_merge", perm=[0, 2, 1, 3])
        a = node("Reshape", [a, s_flat], f"{p}_flat")
        a = linear(a, f"{p}_o", hidden, hidden)
        x = node("Add", [x, a], f"{p}_res1")
        h = layernorm(x, f"{p}_ln2")
        h = linear(h, f"{p}_ffn1", hidden, ffn)
        h = gelu(h, f"{p}_gelu")
        h = linear(h, f"{p}_ffn2", ffn, hidden)
        x = node("Add", [x, h], f"{p}_res2")
    nodes.append(helper.make_node("Identity", [x], ["y"], name="output"))
    graph = helper.make_graph(nodes, "llm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, seq, hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="llm_graph")
    model.ir_version = 8
    return model


if __name__ == "__main__":  # pragma: no cover
    import sys
    import time
    n = layers_for_nodes(int(sys.argv[1]) if len(sys.argv) > 1 else 90_000)
    t = time.perf_counter()
    m = make_llm_graph(n)
    print(f"{n} layers, {len(m.graph.node)} nodes, {m.ByteSize() / 1e6:.1f} MB, built in {time.perf_counter() - t:.2f} s")
