"""Every optional quantization pass (adaround, seq-mse, smoothquant, cle, bias-correction, mixed-precision,
mirror-untaken-branches, --optimize latency; int4 blocks where the pass has a bit-width path) over a family of
small models a user may bring: If/Loop/Scan bodies, two inputs and outputs, a dynamic batch, an embedding Gather,
an LSTM, ConvTranspose, Conv1d, grouped and depthwise Conv, a batched 3-D MatMul weight, one weight read by two
MatMuls, Constant-node weights, Gemm transA=1, an int64 input feeding Gather. A pass that cannot handle a layer
leaves it as it is and says why; it never raises. Each run finishes and its model runs in onnxruntime with finite
outputs."""
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from qcompiler.quant import quantize
from tests.helpers import make_model, run, tinfo
from tests.quant.body_models import MODELS as BODY_MODELS

F = np.float32
N_CALIB = 8


def _w(name, shape, seed, scale=0.3):
    return numpy_helper.from_array((np.random.default_rng(seed).standard_normal(shape) * scale).astype(F), name)


def _feeds(specs, n=N_CALIB, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        f = {}
        for name, shape, kind in specs:
            if kind == "ids":
                f[name] = rng.integers(0, shape[1], size=shape[0]).astype(np.int64)
            else:
                f[name] = rng.standard_normal(shape).astype(F)
        out.append(f)
    return out


def two_in_two_out():
    nodes = [helper.make_node("MatMul", ["x1", "w1"], ["a"], name="mm1"),
             helper.make_node("Relu", ["a"], ["y1"], name="relu1"),
             helper.make_node("Add", ["x1", "x2"], ["s"], name="add"),
             helper.make_node("MatMul", ["s", "w2"], ["y2"], name="mm2")]
    p = make_model(nodes, [tinfo("x1", [1, 8]), tinfo("x2", [1, 8])], [tinfo("y1", [1, 6]), tinfo("y2", [1, 4])],
                   [_w("w1", (8, 6), 1), _w("w2", (8, 4), 2)])
    return p, _feeds([("x1", (1, 8), "f"), ("x2", (1, 8), "f")])


def dynamic_batch():
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
             helper.make_node("Relu", ["a"], ["b"], name="relu"),
             helper.make_node("MatMul", ["b", "w2"], ["y"], name="mm2")]
    p = make_model(nodes, [tinfo("x", ["N", 16])], [tinfo("y", ["N", 4])], [_w("w1", (16, 8), 1), _w("w2", (8, 4), 2)])
    return p, [f for b in (1, 3, 5) for f in _feeds([("x", (b, 16), "f")], n=3, seed=b)]


def embedding():
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"], name="embed"),
             helper.make_node("MatMul", ["e", "w"], ["y"], name="proj")]
    p = make_model(nodes, [tinfo("ids", [5], T.INT64)], [tinfo("y", [5, 8])], [_w("emb", (20, 16), 1), _w("w", (16, 8), 2)])
    return p, _feeds([("ids", (5, 20), "ids")])


def lstm():
    hs, d = 8, 4
    node = helper.make_node("LSTM", ["x", "W", "R", "B"], ["y", "yh"], hidden_size=hs, name="lstm")
    p = make_model([node], [tinfo("x", [5, 1, d])], [tinfo("y", [5, 1, 1, hs]), tinfo("yh", [1, 1, hs])],
                   [_w("W", (1, 4 * hs, d), 1), _w("R", (1, 4 * hs, hs), 2), _w("B", (1, 8 * hs), 3, 0.1)])
    return p, _feeds([("x", (5, 1, d), "f")])


def conv_transpose():
    nodes = [helper.make_node("ConvTranspose", ["x", "w", "b"], ["a"], name="deconv", strides=[2, 2]),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    p = make_model(nodes, [tinfo("x", [1, 4, 5, 5])], [tinfo("y", None)], [_w("w", (4, 6, 3, 3), 1), _w("b", (6,), 2, 0.1)])
    return p, _feeds([("x", (1, 4, 5, 5), "f")])


def conv1d():
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], name="conv1", pads=[1, 1]),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2")]
    p = make_model(nodes, [tinfo("x", [1, 4, 16])], [tinfo("y", None)],
                   [_w("w1", (6, 4, 3), 1), _w("b1", (6,), 2, 0.1), _w("w2", (5, 6, 1), 3)])
    return p, _feeds([("x", (1, 4, 16), "f")])


def grouped_depthwise():
    nodes = [helper.make_node("Conv", ["x", "wg", "bg"], ["a"], name="grouped", group=4, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"], name="relu1"),
             helper.make_node("Conv", ["r", "wd", "bd"], ["d"], name="depthwise", group=8, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["d"], ["r2"], name="relu2"),
             helper.make_node("Conv", ["r2", "wp"], ["y"], name="pointwise")]
    p = make_model(nodes, [tinfo("x", [1, 8, 6, 6])], [tinfo("y", None)],
                   [_w("wg", (8, 2, 3, 3), 1), _w("bg", (8,), 2, 0.1), _w("wd", (8, 1, 3, 3), 3),
                    _w("bd", (8,), 4, 0.1), _w("wp", (4, 8, 1, 1), 5)])
    return p, _feeds([("x", (1, 8, 6, 6), "f")])


def batched_weight():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="bmm"),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    p = make_model(nodes, [tinfo("x", [2, 4, 8])], [tinfo("y", [2, 4, 6])], [_w("w", (2, 8, 6), 1)])
    return p, _feeds([("x", (2, 4, 8), "f")])


def shared_weight():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm1"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w"], ["y"], name="mm2")]
    p = make_model(nodes, [tinfo("x", [1, 8])], [tinfo("y", [1, 8])], [_w("w", (8, 8), 1)])
    return p, _feeds([("x", (1, 8), "f")])


def constant_weights():
    nodes = [helper.make_node("Constant", [], ["w"], value=_w("wv", (8, 6), 1), name="cw"),
             helper.make_node("Constant", [], ["b"], value=_w("bv", (6,), 2, 0.1), name="cb"),
             helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
             helper.make_node("Add", ["a", "b"], ["y"], name="add")]
    p = make_model(nodes, [tinfo("x", [2, 8])], [tinfo("y", [2, 6])])
    return p, _feeds([("x", (2, 8), "f")])


def gemm_trans_a():
    nodes = [helper.make_node("Gemm", ["x", "w", "c"], ["a"], name="gemm", transA=1),
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    p = make_model(nodes, [tinfo("x", [8, 3])], [tinfo("y", [3, 5])], [_w("w", (8, 5), 1), _w("c", (5,), 2, 0.1)])
    return p, _feeds([("x", (8, 3), "f")])


def int64_gather():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
             helper.make_node("Gather", ["a", "idx"], ["g"], name="pick", axis=0),
             helper.make_node("Relu", ["g"], ["y"], name="relu")]
    p = make_model(nodes, [tinfo("x", [4, 8]), tinfo("idx", [3], T.INT64)], [tinfo("y", [3, 6])], [_w("w", (8, 6), 1)])
    return p, _feeds([("x", (4, 8), "f"), ("idx", (3, 4), "ids")])


def left_weight():
    """The weight is MatMul's first input (W @ x) and Gemm has transB=1, alpha, beta and no C."""
    nodes = [helper.make_node("MatMul", ["w", "x"], ["a"], name="left_mm"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Transpose", ["r"], ["t"], name="tr", perm=[1, 0]),
             helper.make_node("Gemm", ["t", "w2"], ["y"], name="gemm", transB=1, alpha=0.5, beta=2.0)]
    p = make_model(nodes, [tinfo("x", [8, 3])], [tinfo("y", [3, 5])], [_w("w", (6, 8), 1), _w("w2", (5, 6), 2)])
    return p, _feeds([("x", (8, 3), "f")])


def dead_channels():
    """An input channel that is always zero, an all-zero output filter and an all-zero weight: ranges of 0."""
    wc = np.random.default_rng(1).standard_normal((6, 4, 3, 3)).astype(F) * 0.3
    wc[2] = 0
    wc[:, 1] = 0
    nodes = [helper.make_node("Mul", ["x", "mask"], ["xm"], name="mask_mul"),
             helper.make_node("Conv", ["xm", "wc", "bc"], ["a"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "wz"], ["c"], name="zero_conv"),
             helper.make_node("Flatten", ["c"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "wm"], ["y"], name="mm")]
    mask = numpy_helper.from_array(np.array([1, 0, 1, 1], F).reshape(1, 4, 1, 1), "mask")
    p = make_model(nodes, [tinfo("x", [1, 4, 4, 4])], [tinfo("y", [1, 8])],
                   [mask, numpy_helper.from_array(wc, "wc"), _w("bc", (6,), 2, 0.1),
                    numpy_helper.from_array(np.zeros((6, 6, 1, 1), F), "wz"), _w("wm", (96, 8), 3, 0.1)])
    return p, _feeds([("x", (1, 4, 4, 4), "f")])


def wide_matmul():
    """K = 64 so int4 blocks of 32 apply; constant (all-zero) calibration on one sample."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
             helper.make_node("Gelu", ["a"], ["g"], name="gelu", domain="com.microsoft"),
             helper.make_node("Gemm", ["g", "w2", "c"], ["y"], name="gemm")]
    p = make_model(nodes, [tinfo("x", [2, 64])], [tinfo("y", [2, 8])],
                   [_w("w1", (64, 64), 1, 0.1), _w("w2", (64, 8), 2, 0.1), _w("c", (8,), 3, 0.1)],
                   extra_opsets=[helper.make_opsetid("com.microsoft", 1)])
    feeds = _feeds([("x", (2, 64), "f")])
    feeds[0] = {"x": np.zeros((2, 64), F)}
    return p, feeds


def only_float_ops():
    """Nothing to quantize."""
    p = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [tinfo("x", [1, 8])], [tinfo("y", [1, 8])])
    return p, _feeds([("x", (1, 8), "f")])


def unnamed_nodes():
    """Nodes without names (common in exported models), an activation x activation MatMul, and an int64 ArgMax
    output next to the float one."""
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["c"]),
             helper.make_node("Reshape", ["c", "shape"], ["m"]),
             helper.make_node("Transpose", ["m"], ["mt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["m", "mt"], ["y"]),
             helper.make_node("ArgMax", ["y"], ["idx"], axis=-1)]
    shape = numpy_helper.from_array(np.array([1, 4, 16], np.int64), "shape")
    p = make_model(nodes, [tinfo("x", [1, 3, 4, 4])], [tinfo("y", [1, 4, 4]), tinfo("idx", [1, 4, 1], T.INT64)],
                   [_w("w1", (6, 3, 3, 3), 1), _w("b1", (6,), 2, 0.1), _w("w2", (4, 6, 1, 1), 3), shape])
    return p, _feeds([("x", (1, 3, 4, 4), "f")])


def residual_branches():
    """Conv -> Relu feeding two Convs and a residual Add; the inner activation is also a graph output; a Conv3d
    with dilations and a weight that is also a graph output."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"], name="c1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["b"], name="c2", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["r", "w3"], ["c"], name="c3", pads=[2, 2, 2, 2], dilations=[2, 2]),
             helper.make_node("Add", ["b", "c"], ["s"], name="add"),
             helper.make_node("Add", ["s", "r"], ["y"], name="res"),
             helper.make_node("Conv", ["v", "w4"], ["z"], name="c3d", auto_pad="SAME_UPPER")]
    p = make_model(nodes, [tinfo("x", [1, 4, 6, 6]), tinfo("v", [1, 2, 4, 4, 4])],
                   [tinfo("y", [1, 4, 6, 6]), tinfo("r", [1, 4, 6, 6]), tinfo("z", None), tinfo("w4", [3, 2, 3, 3, 3])],
                   [_w("w1", (4, 4, 3, 3), 1), _w("w2", (4, 4, 3, 3), 2), _w("w3", (4, 4, 3, 3), 3),
                    _w("w4", (3, 2, 3, 3, 3), 4)])
    return p, _feeds([("x", (1, 4, 6, 6), "f"), ("v", (1, 2, 4, 4, 4), "f")])


def recurrent_main():
    """Bidirectional GRU and an RNN in the main graph; a 1-D MatMul weight (vector output)."""
    hs, d = 4, 3
    nodes = [helper.make_node("GRU", ["x", "W", "R", "B"], ["y", "yh"], hidden_size=hs, direction="bidirectional",
                              name="gru"),
             helper.make_node("RNN", ["x", "Wr", "Rr"], ["yr"], hidden_size=hs, name="rnn"),
             helper.make_node("MatMul", ["x", "v"], ["dot"], name="vec_mm")]
    p = make_model(nodes, [tinfo("x", [5, 1, d])],
                   [tinfo("y", [5, 2, 1, hs]), tinfo("yh", [2, 1, hs]), tinfo("yr", [5, 1, 1, hs]), tinfo("dot", [5, 1])],
                   [_w("W", (2, 3 * hs, d), 1), _w("R", (2, 3 * hs, hs), 2), _w("B", (2, 6 * hs), 3, 0.1),
                    _w("Wr", (1, hs, d), 4), _w("Rr", (1, hs, hs), 5), _w("v", (d,), 6)])
    return p, _feeds([("x", (5, 1, d), "f")])


def odd_blocks():
    """K = 48 (not a multiple of the int4 block 32), Gemm with a [M, N] C and a scalar-shaped C, a weight with an
    outlier, an initializer that is also a graph input (overridable)."""
    w = np.random.default_rng(1).standard_normal((48, 8)).astype(F) * 0.1
    w[3, 2] = 50.0
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
             helper.make_node("Gemm", ["a", "w2", "c2"], ["b"], name="gemm_mn"),
             helper.make_node("Gemm", ["b", "w3", "c3"], ["y"], name="gemm_scalar_c")]
    p = make_model(nodes, [tinfo("x", [2, 48]), tinfo("w3", [6, 4])], [tinfo("y", [2, 4])],
                   [numpy_helper.from_array(w, "w"), _w("w2", (8, 6), 2), _w("c2", (2, 6), 3, 0.1),
                    _w("w3", (6, 4), 4), _w("c3", (1,), 5, 0.1)])
    return p, _feeds([("x", (2, 48), "f")])


def fp16_model():
    """Float16 weights and activations."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Conv", ["ri", "wc"], ["y"], name="conv"),
             helper.make_node("Unsqueeze", ["r", "axes"], ["ri"], name="unsq")]
    p = make_model(nodes, [tinfo("x", [1, 4, 8], T.FLOAT16)], [tinfo("y", None, T.FLOAT16)],
                   [numpy_helper.from_array((np.random.default_rng(1).standard_normal((8, 8)) * 0.3).astype(np.float16), "w"),
                    numpy_helper.from_array((np.random.default_rng(2).standard_normal((2, 1, 1, 1)) * 0.3).astype(np.float16), "wc"),
                    numpy_helper.from_array(np.array([0], np.int64), "axes")])
    rng = np.random.default_rng(0)
    return p, [{"x": rng.standard_normal((1, 4, 8)).astype(np.float16)} for _ in range(N_CALIB)]


def transformer_block():
    """Two LayerNormalizations sharing one gamma (no beta), each read by two MatMuls (4-D activations); a Gemm ->
    Relu -> Gemm pair; a grouped ConvTranspose with output_padding; all-zero calibration on one sample."""
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma"], ["n1"], name="ln1", axis=-1),
             helper.make_node("MatMul", ["n1", "wq"], ["q"], name="q_proj"),
             helper.make_node("MatMul", ["n1", "wk"], ["k"], name="k_proj"),
             helper.make_node("Add", ["q", "k"], ["s"], name="add"),
             helper.make_node("LayerNormalization", ["s", "gamma"], ["n2"], name="ln2", axis=-1),
             helper.make_node("MatMul", ["n2", "wo"], ["o"], name="o_proj"),
             helper.make_node("Reshape", ["o", "flat"], ["of"], name="flatten"),
             helper.make_node("Gemm", ["of", "g1", "gb1"], ["h"], name="gemm1", transB=1),
             helper.make_node("Relu", ["h"], ["hr"], name="relu"),
             helper.make_node("Gemm", ["hr", "g2", "gb2"], ["y"], name="gemm2"),
             helper.make_node("ConvTranspose", ["img", "wt", "bt"], ["z"], name="deconv_g", group=2, strides=[2, 2],
                              output_padding=[1, 1])]
    p = make_model(nodes, [tinfo("x", [1, 2, 3, 8]), tinfo("img", [1, 4, 3, 3])], [tinfo("y", [6, 5]), tinfo("z", None)],
                   [_w("gamma", (8,), 1, 1.0), _w("wq", (8, 8), 2), _w("wk", (8, 8), 3), _w("wo", (8, 8), 4),
                    numpy_helper.from_array(np.array([6, 8], np.int64), "flat"), _w("g1", (7, 8), 5),
                    _w("gb1", (7,), 6, 0.1), _w("g2", (7, 5), 7), _w("gb2", (5,), 8, 0.1),
                    _w("wt", (4, 3, 3, 3), 9), _w("bt", (6,), 10, 0.1)])
    feeds = _feeds([("x", (1, 2, 3, 8), "f"), ("img", (1, 4, 3, 3), "f")])
    feeds[0] = {k: np.zeros_like(v) for k, v in feeds[0].items()}
    return p, feeds


def shared_params():
    """Two Convs share one weight, two more share one bias, all four named "layer"; a Conv whose weight is a graph
    input (no constant); a MatMul weight behind Transpose; an input passed straight to an output."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["a1"], name="layer", pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["x", "w", "b"], ["a2"], name="layer", pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["a1"], ["r1"], name="relu"),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c1"], name="layer"),
             helper.make_node("Conv", ["a2", "w3", "b2"], ["c2"], name="layer"),
             helper.make_node("Conv", ["x", "wd"], ["d"], name="dyn_conv"),
             helper.make_node("Transpose", ["wt"], ["wtt"], name="tw", perm=[1, 0]),
             helper.make_node("Flatten", ["c2"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "wtt"], ["m"], name="mm"),
             helper.make_node("Identity", ["x"], ["xo"], name="pass")]
    p = make_model(nodes, [tinfo("x", [1, 4, 6, 6]), tinfo("wd", [2, 4, 1, 1])],
                   [tinfo("c1", None), tinfo("m", None), tinfo("d", None), tinfo("xo", None)],
                   [_w("w", (5, 4, 3, 3), 1), _w("b", (5,), 2, 0.1), _w("w2", (3, 5, 1, 1), 3), _w("w3", (3, 5, 1, 1), 4),
                    _w("b2", (3,), 5, 0.1), _w("wt", (4, 27), 6)])
    return p, _feeds([("x", (1, 4, 6, 6), "f"), ("wd", (2, 4, 1, 1), "f")])


def zero_output():
    """An output that is always zero (signal power 0 for SQNR and relative error) next to an ordinary one, and a
    constant output that does not depend on the input."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm"),
             helper.make_node("Mul", ["a", "zero"], ["y0"], name="times_zero"),
             helper.make_node("MatMul", ["a", "w2"], ["y"], name="mm2"),
             helper.make_node("MatMul", ["ones", "w3"], ["k"], name="const_mm")]
    p = make_model(nodes, [tinfo("x", [2, 8])], [tinfo("y0", [2, 6]), tinfo("y", [2, 4]), tinfo("k", [1, 4])],
                   [_w("w", (8, 6), 1), numpy_helper.from_array(np.zeros((1,), F), "zero"), _w("w2", (6, 4), 2),
                    numpy_helper.from_array(np.ones((1, 3), F), "ones"), _w("w3", (3, 4), 3)])
    return p, _feeds([("x", (2, 8), "f")])


def _body(name):
    def build():
        proto, calib, evals = BODY_MODELS[name]()
        return proto, calib[:N_CALIB] + [e[0] for e in evals if e]
    build.__name__ = name
    return build


FAMILIES = {f.__name__: f for f in (two_in_two_out, dynamic_batch, embedding, lstm, conv_transpose, conv1d,
                                    grouped_depthwise, batched_weight, shared_weight, constant_weights,
                                    gemm_trans_a, int64_gather, left_weight, dead_channels, wide_matmul,
                                    only_float_ops, unnamed_nodes, residual_branches, recurrent_main, odd_blocks,
                                    fp16_model, transformer_block, shared_params, zero_output)}
FAMILIES.update({n: _body(n) for n in BODY_MODELS})

RECIPES = {
    "adaround": dict(recipe=["adaround"]),
    "adaround-int4": dict(recipe=["adaround"], weight_bits=4, weight_block=32),
    "seq-mse": dict(recipe=["seq-mse"]),
    "seq-mse-int4": dict(recipe=["seq-mse"], weight_bits=4, weight_block=32),
    "smoothquant": dict(recipe=["smoothquant"]),
    "smoothquant-alpha": dict(smoothquant_alpha=0.5),
    "cle": dict(recipe=["cle"]),
    "cle-per-tensor": dict(recipe=["cle"], per_channel=False),
    "adaround-seq-mse-per-tensor": dict(recipe=["adaround", "seq-mse"], per_channel=False),
    "bias-correction": dict(recipe=["bias-correction"]),
    "bias-correction-int4": dict(recipe=["bias-correction"], weight_bits=4, weight_block=32),
    "mixed-precision": dict(max_drop="5%"),
    "mirror": dict(untaken_branches="mirror"),
    "latency": dict(optimize="latency"),
    "all-int4": dict(recipe=["cle", "smoothquant", "adaround", "seq-mse", "bias-correction"], max_drop="5%",
                     untaken_branches="mirror", optimize="latency", weight_bits=4, weight_block=32),
}

# (family, recipe) -> reason. fp16: the base pipeline (qdq.py: float32 scales for float16 values) makes a QDQ
# model onnxruntime refuses even with no recipe; a max_drop run passes only because it keeps every layer float.
FP16_REASON = "float16 model: Q/DQ scales are float32 (qdq.py), onnxruntime refuses the model with or without a recipe"
# latency alone passes too: its size rule (placement/cost.py) leaves this tiny model float
XFAIL = {("fp16_model", r): FP16_REASON for r in RECIPES if "max_drop" not in RECIPES[r] and r != "latency"}


SLOW = {"all-int4"}


def _case(fam, rec):
    marks = [pytest.mark.slow] if rec in SLOW else []   # every pass at once is also run by the CLI test
    if (fam, rec) in XFAIL:
        marks.append(pytest.mark.xfail(reason=XFAIL[(fam, rec)], strict=True))
    return pytest.param(fam, rec, id=f"{fam}-{rec}", marks=marks)


@pytest.mark.parametrize("family,recipe", [_case(f, r) for f in FAMILIES for r in RECIPES])
def test_recipe_never_crashes(family, recipe):
    proto, feeds = FAMILIES[family]()
    res = quantize(proto, feeds, min_sqnr=float("-inf"), progress=False, **RECIPES[recipe])
    for f in feeds[-2:]:
        for out in run(res.model, f):
            out = np.asarray(out)
            if out.dtype.kind == "f":
                assert np.isfinite(out).all()


def test_cli_every_switch_exits_0(tmp_path):
    """The switches (`--smoothquant-alpha 0.5 --max-drop 5% --untaken-branches mirror --optimize latency`) and the
    recipes at once, int4 blocks, on the transformer block: exit 0 and a model onnxruntime runs."""
    proto, feeds = transformer_block()
    onnx.save(proto, str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "c.npz", **{k: np.stack([f[k] for f in feeds]) for k in feeds[0]})
    r = subprocess.run([sys.executable, "-m", "qcompiler", "quantize", str(tmp_path / "m.onnx"), "--calib",
                        str(tmp_path / "c.npz"), "-o", str(tmp_path / "q.onnx"), "--recipe",
                        "adaround,seq-mse,cle,bias-correction", "--smoothquant-alpha", "0.5", "--max-drop", "5%",
                        "--untaken-branches", "mirror", "--optimize", "latency", "--weight-bits", "4",
                        "--block-size", "32", "--min-sqnr", "-inf"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    for out in run(onnx.load(str(tmp_path / "q.onnx")), feeds[1]):
        assert np.isfinite(out).all()
