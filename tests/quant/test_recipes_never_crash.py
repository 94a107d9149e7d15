"""Every optional quantization pass (adaround, seq-mse, smoothquant, cle, bias-correction, mixed-precision,
mirror-untaken-branches, --optimize latency; int4 blocks where the pass has a bit-width path) over a family of
small models a user may bring: If/Loop/Scan bodies, two inputs and outputs, a dynamic batch, an embedding Gather,
an LSTM, ConvTranspose, Conv1d, grouped and depthwise Conv, a batched 3-D MatMul weight, one weight read by two
MatMuls, Constant-node weights, Gemm transA=1, an int64 input feeding Gather. A pass that cannot handle a layer
leaves it as it is and says why; it never raises. Each run finishes and its model runs in onnxruntime with finite
outputs."""
import numpy as np
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


def _body(name):
    def build():
        proto, calib, evals = BODY_MODELS[name]()
        return proto, calib[:N_CALIB] + [e[0] for e in evals if e]
    build.__name__ = name
    return build


FAMILIES = {f.__name__: f for f in (two_in_two_out, dynamic_batch, embedding, lstm, conv_transpose, conv1d,
                                    grouped_depthwise, batched_weight, shared_weight, constant_weights,
                                    gemm_trans_a, int64_gather, left_weight, dead_channels, wide_matmul,
                                    only_float_ops)}
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
}

XFAIL = {}   # (family, recipe) -> reason


def _case(fam, rec):
    marks = []
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
