"""The ort_cpu fusion facts checked against onnxruntime itself, one generated case per fact.

qcompiler places its quantizers from data: the ort_cpu fusion table (`fusion_tables/ort_cpu.yaml`: which QDQ
units onnxruntime's CPU provider turns into integer kernels) and the profile's `fused_activations` (which
(producer, activation) pairs are one unit with no quantizer between them). A wrong fact costs speed silently (a
Conv+LeakyRelu unit ran a float Conv where onnxruntime runs QLinearConv + QLinearLeakyRelu), so each fact gets a
minimal QDQ model here, run through onnxruntime's CPU provider at its default optimization level, and the
optimized graph it writes (`optimized_model_filepath`) is compared with the claim:

- every (record, op, integer type) of the table: the kernel appears (or the Q/DQ around the op is dropped), and an
  8/16-bit type the record does not list does not fuse;
- every op a record `absorbs`: DQ -> op -> absorbed -> Q still becomes the kernel, the absorbed op gone; and a
  Relu/Clip onnxruntime drops before a unit's Q is listed in its record;
- every `fused_activations` pair: either the producer's kernel absorbs the activation, or splitting the pair with a
  Q/DQ would not give two integer kernels (otherwise the pair hides an integer kernel and must not be one unit);
- the reverse: an op onnxruntime fuses as DQ -> op -> Q that the table has no record for fails.

The cases are generated from the loaded table and profile, so a new record or pair gets its case by itself.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from qcompiler.quant.runtime.kernels import optimized_graph
from qcompiler.quant.targets.fusions import load_fusions
from qcompiler.quant.targets.profiles import get_profile
from tests.helpers import make_model, tinfo

TABLE = load_fusions("ort_cpu")
PROFILE = get_profile("ort_cpu")
OPSET = 21
DTYPES = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8, "uint16": TensorProto.UINT16,
          "int16": TensorProto.INT16}
NP = {"uint8": np.uint8, "int8": np.int8, "uint16": np.uint16, "int16": np.int16}
TYPE_MIN = {"uint8": 0, "int8": -128, "uint16": 0, "int16": -32768}
MID = {"uint8": 128, "int8": 0, "uint16": 32768, "int16": 0}
QDQ = ("QuantizeLinear", "DequantizeLinear")
X = [1, 8, 8, 8]      # NCHW activation of the image ops
RNG = np.random.default_rng(0)


class _Builder:
    """A minimal QDQ graph: float inputs -> Q -> DQ -> ... -> Q -> DQ -> float outputs."""

    def __init__(self, dtype: str):
        self.dtype, self.nodes, self.inits, self.inputs, self.outputs, self.n = dtype, [], [], [], [], 0

    def name(self, p: str) -> str:
        self.n += 1
        return f"{p}{self.n}"

    def const(self, arr, p: str = "c") -> str:
        n = self.name(p)
        self.inits.append(numpy_helper.from_array(np.asarray(arr), n))
        return n

    def qparams(self, scale: float, zp: int, dtype: str = None):
        dtype = dtype or self.dtype
        return self.const(np.float32(scale), "s"), self.const(NP[dtype](zp), "z")

    def q(self, v: str, scale=0.05, zp=None, dtype=None) -> str:
        dtype = dtype or self.dtype
        s, z = self.qparams(scale, MID[dtype] if zp is None else zp, dtype)
        out = self.name("q")
        self.nodes.append(helper.make_node("QuantizeLinear", [v, s, z], [out]))
        return out

    def dq(self, v: str, scale=0.05, zp=None, dtype=None) -> str:
        dtype = dtype or self.dtype
        s, z = self.qparams(scale, MID[dtype] if zp is None else zp, dtype)
        out = self.name("dq")
        self.nodes.append(helper.make_node("DequantizeLinear", [v, s, z], [out]))
        return out

    def qdq(self, v: str, scale=0.05, zp=None) -> str:
        return self.dq(self.q(v, scale, zp), scale, zp)

    def act_input(self, shape, scale=0.05) -> str:
        n = self.name("x")
        self.inputs.append(tinfo(n, shape))
        return self.qdq(n, scale)

    def weight(self, shape, axis: int, dtype: str = "int8") -> str:
        """A per-channel symmetric integer weight through its DQ (axis None: per tensor)."""
        w = RNG.integers(-60, 60, size=shape).astype(NP[dtype])
        scale = np.full(shape[axis], 0.01, np.float32)
        s, z = self.const(scale, "ws"), self.const(np.zeros(shape[axis], NP[dtype]), "wz")
        out = self.name("wdq")
        self.nodes.append(helper.make_node("DequantizeLinear", [self.const(w, "w"), s, z], [out], axis=axis))
        return out

    def bias(self, n: int, scale: float) -> str:
        b, s = self.const(RNG.integers(-100, 100, size=n).astype(np.int32), "b"), self.const(
            np.full(n, scale, np.float32), "bs")
        out = self.name("bdq")
        self.nodes.append(helper.make_node("DequantizeLinear", [b, s, self.const(np.zeros(n, np.int32), "bz")],
                                           [out], axis=0))
        return out

    def op(self, op_type: str, inputs: list, n_out: int = 1, **attrs) -> list:
        outs = [self.name(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=f"target_{op_type}_{self.n}", **attrs))
        return outs

    def output(self, v: str, elem=TensorProto.FLOAT) -> None:
        self.outputs.append(helper.make_tensor_value_info(v, elem, None))

    def model(self):
        return make_model(self.nodes, self.inputs, self.outputs, self.inits, opset=OPSET,
                          extra_opsets=[helper.make_opsetid("com.microsoft", 1)])


def _target(b: _Builder, op: str) -> list:
    """Build the op on quantized inputs (weights per channel, int32 bias); its float outputs."""
    i64 = lambda v: b.const(np.array(v, np.int64), "i")   # noqa: E731
    wt = "int8"
    if op == "Conv":
        x = b.act_input(X)
        return b.op("Conv", [x, b.weight([8, 8, 3, 3], 0, wt), b.bias(8, 0.05 * 0.01)], pads=[1, 1, 1, 1])
    if op == "ConvTranspose":
        x = b.act_input(X)
        return b.op("ConvTranspose", [x, b.weight([8, 8, 3, 3], 1, wt), b.bias(8, 0.05 * 0.01)], pads=[1, 1, 1, 1])
    if op == "MatMul":
        return b.op("MatMul", [b.act_input([1, 16, 32]), b.weight([32, 32], 1, wt)])
    if op == "Gemm":
        return b.op("Gemm", [b.act_input([4, 32]), b.weight([32, 32], 0, wt), b.bias(32, 0.05 * 0.01)], transB=1)
    if op in ("Add", "Mul", "Sub", "Div", "Sum", "Max", "Min", "Pow", "PRelu"):
        return b.op(op, [b.act_input(X), b.act_input(X if op != "PRelu" else [8, 1, 1])])
    if op == "Concat":
        return b.op("Concat", [b.act_input(X), b.act_input(X)], axis=1)
    if op == "Where":
        c = b.name("cond")
        b.inputs.append(tinfo(c, X, TensorProto.BOOL))
        return b.op("Where", [c, b.act_input(X), b.act_input(X)])
    x = b.act_input(X)
    extra = {
        "AveragePool": ([], dict(kernel_shape=[2, 2])), "MaxPool": ([], dict(kernel_shape=[2, 2])),
        "LeakyRelu": ([], dict(alpha=0.1)), "Softmax": ([], dict(axis=-1)), "LogSoftmax": ([], dict(axis=-1)),
        "Expand": ([i64([2, 8, 8, 8])], {}), "Flatten": ([], dict(axis=1)), "Gather": ([i64([0, 2])], dict(axis=1)),
        "GatherElements": ([i64(np.zeros(X, np.int64))], dict(axis=1)), "Reshape": ([i64([1, 8, 64])], {}),
        "Slice": ([i64([0]), i64([4]), i64([1])], {}), "Squeeze": ([i64([0])], {}), "Tile": ([i64([1, 1, 2, 1])], {}),
        "Transpose": ([], dict(perm=[0, 2, 3, 1])), "Unsqueeze": ([i64([0])], {}),
        "ReduceMax": ([i64([1])], {}), "ReduceMin": ([i64([1])], {}), "ReduceMean": ([i64([1])], {}),
        "ReduceSum": ([i64([1])], {}),
        "Resize": (["", b.const(np.array([1, 1, 2, 2], np.float32), "sc")], dict(mode="nearest")),
        "Split": ([], dict(axis=1, num_outputs=2)), "ArgMax": ([], dict(axis=1)),
        "Pad": ([i64([0, 0, 1, 1, 0, 0, 1, 1])], {}), "DepthToSpace": ([], dict(blocksize=2)),
        "SpaceToDepth": ([], dict(blocksize=2)), "Clip": ([b.const(np.float32(0)), b.const(np.float32(6))], {}),
        "GatherND": ([i64([[0]])], {}), "InstanceNormalization": (
            [b.const(np.ones(8, np.float32)), b.const(np.zeros(8, np.float32))], {}),
        "LayerNormalization": ([b.const(np.ones(8, np.float32)), b.const(np.zeros(8, np.float32))], {}),
        "BatchNormalization": (_bn_params(b), {}),
    }.get(op, ([], {}))
    return b.op(op, [x] + extra[0], n_out=2 if op == "Split" else 1, **extra[1])


def _bn_params(b: _Builder) -> list:
    return [b.const(np.full(8, v, np.float32)) for v in (1.5, 0.1, 0.2, 2.0)]


def _unit(op: str, dtype: str, output_q: bool = True, equal_qparams: bool = False, after: str = None,
          split: bool = False):
    """DQ(s) -> op [-> after] -> Q -> DQ (no Q when not `output_q`); `split`: a Q/DQ between op and `after` too."""
    b = _Builder(dtype)
    outs = _target(b, op)
    final = []
    for v in outs:
        if after is not None:
            if split:
                v = b.qdq(v, 0.05)
            extra = {"Clip": lambda: [b.const(np.float32(0)), b.const(np.float32(6))],
                     "BatchNormalization": lambda: _bn_params(b)}.get(after, lambda: [])()
            v = b.op(after, [v] + extra, **({"alpha": 0.1} if after == "LeakyRelu" else {}))[0]
        if op == "ArgMax" or not output_q:
            final.append(v)
            continue
        if equal_qparams:
            final.append(b.qdq(v))
        elif after in ("Relu", "Clip"):   # a Q whose range the Relu/Clip already clips: [0, 6]
            final.append(b.qdq(v, 6.0 / (255 if dtype in ("uint8", "int8") else 65535), TYPE_MIN[dtype]))
        else:
            final.append(b.qdq(v, 0.07, MID[dtype] + (3 if "8" in dtype else 300)))
    for v in final:
        b.output(v, TensorProto.INT64 if op == "ArgMax" else TensorProto.FLOAT)
    return b.model()


def _nodes(model) -> list:
    return list(optimized_graph(model).graph.node)


def _fused(nodes: list, record, op: str, with_q: bool = True) -> bool:
    """Whether onnxruntime did what `record` says to the op of a minimal unit."""
    types = [n.op_type for n in nodes]
    if record.action in ("replace", "weight_only"):
        return record.kernel_for(op, with_q) in types and op not in types
    # drop_qdq / drop_dq: the op stays and neither reads a DQ nor (drop_qdq) writes to a Q
    producers = {o: n.op_type for n in nodes for o in n.output}
    readers = {i: n.op_type for n in nodes for i in n.input}
    target = [n for n in nodes if n.op_type == op]
    if not target:
        return False
    t = target[0]
    if producers.get(t.input[0]) == "DequantizeLinear":
        return False
    return record.action == "drop_dq" or all(readers.get(o) != "QuantizeLinear" for o in t.output)


def _cases():
    """(record, op, dtype, expect_fused) for every record's op and integer type (listed: fuses; not listed: not)."""
    for r in TABLE.fusions:
        if r.action == "weight_only":
            continue
        for op in r.ops:
            for dt in DTYPES:
                if op == "MaxPool" and dt in ("uint16", "int16"):
                    continue                   # not an ONNX MaxPool type: no unfused model to compare with
                yield pytest.param(r, op, dt, dt in r.act_dtypes, id=f"{r.name}-{op}-{dt}")


@pytest.mark.parametrize("record,op,dtype,expect", list(_cases()))
def test_table_record_matches_onnxruntime(record, op, dtype, expect):
    model = _unit(op, dtype, output_q=record.output_q != "none", equal_qparams=record.equal_qparams)
    nodes = _nodes(model)
    assert _fused(nodes, record, op) == expect, (record.name, op, dtype, [n.op_type for n in nodes])


@pytest.mark.parametrize("record,op", [pytest.param(r, op, id=f"{r.name}-{op}") for r in TABLE.fusions
                                       if r.kernel_without_q for op in r.ops])
def test_kernel_without_output_q(record, op):
    nodes = _nodes(_unit(op, "uint8", output_q=False))
    assert _fused(nodes, record, op, with_q=False), [n.op_type for n in nodes]


@pytest.mark.parametrize("record,op,act", [pytest.param(r, op, a, id=f"{r.name}-{op}-{a}") for r in TABLE.fusions
                                           for op in r.ops for a in r.absorbs])
def test_absorbed_activation(record, op, act):
    nodes = _nodes(_unit(op, "uint8", after=act))
    types = [n.op_type for n in nodes]
    assert _fused(nodes, record, op) and act not in types, types


@pytest.mark.parametrize("record,op,act", [pytest.param(r, op, a, id=f"{r.name}-{op}-{a}") for r in TABLE.fusions
                                           if r.action == "replace" and r.output_q != "none" for op in r.ops
                                           for a in ("Relu", "Clip")])
def test_relu_clip_absorbed_only_where_listed(record, op, act):
    """The reverse of test_absorbed_activation: a Relu/Clip onnxruntime drops before the unit's Q is listed."""
    nodes = _nodes(_unit(op, "uint8", after=act))
    absorbed = act not in [n.op_type for n in nodes] and _fused(nodes, record, op)
    assert absorbed == (act in record.absorbs), (record.name, op, act, [n.op_type for n in nodes])


def _integer(op: str, nodes: list) -> bool:
    """Whether the op of a unit ran an integer kernel (a table record's kernel, or its Q/DQ dropped)."""
    return any(_fused(nodes, r, op) for r in TABLE.for_op(op) if r.action != "weight_only")


@pytest.mark.parametrize("producer,act", [pytest.param(p, a, id=f"{p}+{a}") for p, a in PROFILE.fused_activations])
def test_fused_pair_is_what_onnxruntime_does(producer, act):
    """A pair is one unit only where onnxruntime makes it one: the producer's kernel absorbs the activation (and
    then the table's record says so in `absorbs`), or a Q/DQ between them would not give two integer kernels (the
    activation has none, or the producer has none)."""
    nodes = _nodes(_unit(producer, "uint8", after=act))
    types = [n.op_type for n in nodes]
    absorbed = act not in types and _integer(producer, nodes)
    listed = any(act in r.absorbs for r in TABLE.for_op(producer))
    assert absorbed == listed, (f"{producer}+{act}: onnxruntime {'absorbs' if absorbed else 'does not absorb'} "
                                f"the {act} ({types}), the table's {producer} record says the opposite")
    if absorbed:
        return
    split = _nodes(_unit(producer, "uint8", after=act, split=True))
    assert not (_integer(producer, split) and _integer(act, split)), (
        f"{producer}+{act} is fused in the profile, but with a Q/DQ between them onnxruntime runs "
        f"{[n.op_type for n in split]}")


# ops onnxruntime might fuse as DQ -> op -> Q that the table has no record for (a fused one must get a record)
CANDIDATES = ["HardSigmoid", "Tanh", "Relu", "Clip", "HardSwish", "Elu", "Selu", "Exp", "Log", "Neg", "Abs",
              "Sqrt", "Erf", "Gelu", "PRelu", "Sub", "Div", "Sum", "Max", "Min", "Pow", "ReduceMean", "ReduceSum",
              "Pad", "DepthToSpace", "SpaceToDepth", "Identity", "GatherND", "LogSoftmax", "InstanceNormalization",
              "LayerNormalization", "ConvTranspose", "Softplus", "Floor", "Round"]


@pytest.mark.parametrize("op", [op for op in CANDIDATES if not TABLE.for_op(op)])
def test_no_fusion_missing_from_the_table(op):
    nodes = _nodes(_unit(op, "uint8"))
    types = [n.op_type for n in nodes]
    producers = {o: n.op_type for n in nodes for o in n.output}
    kept_on_integers = [n for n in nodes if n.op_type == op and producers.get(n.input[0]) != "DequantizeLinear"]
    assert not kept_on_integers and not any(t.startswith("QLinear") or t == "QGemm" for t in types), (
        f"onnxruntime fuses DQ -> {op} -> Q ({types}) and the ort_cpu table has no record for {op}")
