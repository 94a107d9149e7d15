"""float16 models as users bring them (torch `.half()`, onnxconverter-common's float16 converter with
keep_io_types False or True) quantize: exit 0 from the API and the CLI, the QDQ model runs in onnxruntime with
default session options, its outputs have the float model's dtypes, and its output SQNR against the float16
model's own outputs stays above a floor. On a profile that computes in float16 (`float16_compute: float16`: trt,
qnn_htp; NATIVE here, ort_cpu's grids otherwise) Q/DQ meet float16 values through qdq.float_route: float16 scales
at opset >= 19, Casts to float32 around float32 Q/DQ at opset 13..18. On ort_cpu (`float16_compute: float32`) the
pass upcast-float16 makes the model compute in float32 inside, its float16 inputs and outputs kept. bfloat16 models (onnxruntime CPU runs none of
their MatMul/Conv) exit 2 with one line naming bfloat16.

Floors: 8-bit 25 dB (the models here reach 33-45 dB, the float32 twins the same within 1.5 dB); int4 weights
15 dB; the converted never-crash families 20 dB (odd_blocks has a weight outlier: 24 dB in float32 too)."""
import hashlib
import subprocess
import sys

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from qcompiler.errors import OnnxRuntimeError
from qcompiler.quant import quantize
from qcompiler.quant.core.qdq import F32, FloatRoute, float_route
from tests.helpers import assert_one_line_error, run, sqnr_db
from tests.quant.fp16_models import build, feeds_float16, to_float16

FLOOR_8BIT_DB = 25.0
FLOOR_INT4_DB = 15.0
FLOOR_FAMILIES_DB = 20.0
OPSETS = (13, 17, 19, 21)
NATIVE = {"base": "ort_cpu", "float16_compute": "float16"}   # ort_cpu's grids, the model kept in float16


def _proto(res):
    from qcompiler.onnx_io import model_to_proto
    return model_to_proto(res.model)


def _check(float_model, q, feeds, floor):
    """q runs with default session options, keeps the float model's output dtypes; worst output SQNR (float
    outputs) against the float model, asserted >= floor; returns it."""
    worst = float("inf")
    ref = [run(float_model, f) for f in feeds]
    got = [run(q, f) for f in feeds]
    assert [g.dtype for g in got[0]] == [r.dtype for r in ref[0]]
    for i, r0 in enumerate(ref[0]):
        if r0.dtype.kind != "f":
            continue
        a = np.concatenate([r[i].astype(np.float64).ravel() for r in ref])
        b = np.concatenate([g[i].astype(np.float64).ravel() for g in got])
        assert np.isfinite(b).all()
        worst = min(worst, sqnr_db(a, b))
    assert worst >= floor, worst
    return worst


def _scale_types(q):
    """numpy dtypes of the scales (input 1) of the model's QuantizeLinear nodes."""
    inits = {t.name: t.data_type for t in q.graph.initializer}
    return {inits.get(n.input[1]) for n in q.graph.node if n.op_type == "QuantizeLinear"}


def test_float_route_is_one_rule():
    assert float_route(T.FLOAT, 13) == FloatRoute(T.FLOAT, F32, False)
    assert float_route(None, 21) == FloatRoute(T.FLOAT, F32, False)
    assert float_route(T.FLOAT16, 18) == FloatRoute(T.FLOAT16, F32, True)
    assert float_route(T.FLOAT16, 19) == FloatRoute(T.FLOAT16, np.dtype(np.float16), False)
    assert float_route(T.FLOAT16, 21, np.array([0.01, 0.2])).cast is False
    assert float_route(T.FLOAT16, 21, np.array([0.01, 1e-6])).cast is True    # below float16's smallest normal
    assert float_route(T.BFLOAT16, 21) == FloatRoute(T.BFLOAT16, F32, True)   # onnxruntime: no bfloat16 Q/DQ


@pytest.mark.parametrize("io", ["fp16", "keep_io"])
@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("family", ["cnn", "mlp", "transformer"])
def test_default_recipe(family, opset, io):
    """The output opset pinned to the model's: Casts around float32 Q/DQ below 19, float16 scales from 19."""
    m, feeds = build(family, opset, io)
    q = _proto(quantize(m, feeds, opset=opset, progress=False, target=NATIVE))
    _check(m, q, feeds[-3:], FLOOR_8BIT_DB)
    assert q.opset_import[0].version == opset
    internal16 = _scale_types(q) - {T.FLOAT}
    if opset < 19:
        assert internal16 == set()
    elif io == "fp16":
        assert internal16 == {T.FLOAT16}


@pytest.mark.parametrize("opset", [13, 21])
def test_as_good_as_float32(opset):
    """The fp16 transformer block loses no more than 1.5 dB against its float32 twin (both against their own
    float model)."""
    out = {}
    for io in ("fp16", "fp32"):
        m, feeds = build("transformer", opset, io)
        out[io] = _check(m, _proto(quantize(m, feeds, opset=opset, progress=False)), feeds[-3:], FLOOR_8BIT_DB)
    assert out["fp16"] >= out["fp32"] - 1.5, out


RECIPES = {
    "adaround": dict(recipe=["adaround"]),
    "seq-mse": dict(recipe=["seq-mse"]),
    "smoothquant": dict(recipe=["smoothquant"]),
    "smoothquant-alpha": dict(smoothquant_alpha=0.5),
    "cle": dict(recipe=["cle"]),
    "cle-per-tensor": dict(recipe=["cle"], per_channel=False),
    "bias-correction": dict(recipe=["bias-correction"]),
    "mixed-precision": dict(max_drop="5%"),
    "mirror": dict(untaken_branches="mirror"),
    "latency": dict(optimize="latency"),
    "accuracy": dict(optimize="accuracy"),
    "adaround-int4": dict(recipe=["adaround"], weight_bits=4, weight_block=16),
    "seq-mse-int4": dict(recipe=["seq-mse"], weight_bits=4, weight_block=16),
}
INT4 = {"adaround-int4", "seq-mse-int4"}
SLOW = {"mixed-precision", "adaround-int4"}


def _recipe_case(recipe, family, opset, io):
    marks = [pytest.mark.slow] if recipe in SLOW else []
    return pytest.param(recipe, family, opset, io, id=f"{recipe}-{family}-{opset}-{io}", marks=marks)


@pytest.mark.parametrize("recipe,family,opset,io", [
    _recipe_case(r, fam, op, io) for r in RECIPES
    for fam, op, io in (("cnn", 13, "fp16"), ("transformer", 21, "keep_io"))
    if not (r in INT4 and op < 21)])
def test_recipes(recipe, family, opset, io):
    """Each pass on an fp16 CNN through the Cast route (opset 13) and an fp16-inside transformer block with
    float16 scales (opset 21); the default SQNR floor (the safety net) stays on."""
    m, feeds = build(family, opset, io)
    res = quantize(m, feeds, opset=opset, progress=False, target=NATIVE, **RECIPES[recipe])
    assert not res.report.get("below_floor")
    _check(m, _proto(res), feeds[-3:], FLOOR_INT4_DB if recipe in INT4 else FLOOR_8BIT_DB)


@pytest.mark.parametrize("io", ["fp16", "keep_io"])
@pytest.mark.parametrize("opset", [13, 21])
@pytest.mark.parametrize("family", ["cnn", "transformer"])
def test_ort_cpu_computes_in_float32(family, opset, io):
    """ort_cpu (float16_compute: float32): the model computes in float32 (float32 Q/DQ, the float32 model's
    integer kernels) and keeps its float16 inputs and outputs; no float16 Q/DQ, and Casts only at the edges (one
    more pair for a float16 input, whose own Q/DQ stays float16)."""
    m, feeds = build(family, opset, io)
    # every Q/DQ kept (--optimize accuracy): their types are what is checked
    res = quantize(m, feeds, opset=opset, progress=False, optimize="accuracy")
    q = _proto(res)
    _check(m, q, feeds[-3:], FLOOR_8BIT_DB)
    assert _scale_types(q) - {T.FLOAT} == ({T.FLOAT16} if io == "fp16" and opset >= 19 else set())
    casts = sum(n.op_type == "Cast" for n in q.graph.node)
    assert casts <= (4 if io == "fp16" else 2), casts
    assert any("computed in float32" in n for n in res.report["notes"])
    assert [p["name"] for p in res.report["passes"] if p["name"] == "upcast-float16" and p["modified"]]


def _outlier_mlp(opset):
    """One activation channel 1000x the others that the next MatMul hardly reads: 8 bits per tensor ruin the
    output (0.4 dB) until the safety net keeps it float (opset 13: Cast route) or widens it (opset 21)."""
    r = np.random.default_rng(5)
    w1 = r.standard_normal((16, 16)) * 0.3
    w1[:, 0] *= 1000
    w2 = r.standard_normal((16, 8)) * 0.3
    w2[0] *= 1e-3
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    g = helper.make_graph(nodes, "outlier", [helper.make_tensor_value_info("x", T.FLOAT16, [4, 16])],
                          [helper.make_tensor_value_info("y", T.FLOAT16, [4, 8])],
                          [numpy_helper.from_array(w1.astype(np.float16), "w1"),
                           numpy_helper.from_array(w2.astype(np.float16), "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m, [{"x": r.standard_normal((4, 16)).astype(np.float16)} for _ in range(8)]


@pytest.mark.parametrize("opset,action", [(13, "float"), (21, "widened")])
def test_safety_net(opset, action):
    m, feeds = _outlier_mlp(opset)
    res = quantize(m, feeds, opset=opset, progress=False, target=NATIVE)
    net = res.report["safety_net"]
    assert net["triggered"] and [c["action"] for c in net["changed"]] == [action], net
    q = _proto(res)
    _check(m, q, feeds, 15.0)
    if action == "float":    # the pair went with its Casts: no float16 -> float32 -> float16 round trip left
        casts = [n for n in q.graph.node if n.op_type == "Cast"]
        assert not any(c.input[0] in {d.output[0] for d in casts} for c in casts)


def _families():
    from tests.quant.test_recipes_never_crash import FAMILIES
    return FAMILIES


@pytest.mark.slow
@pytest.mark.parametrize("target", [NATIVE, None], ids=["float16", "float32-inside"])
@pytest.mark.parametrize("keep_io", [False, True], ids=["fp16", "keep_io"])
def test_never_crash_families_in_float16(keep_io, target):
    """Every model family of test_recipes_never_crash (If/Loop/Scan bodies, LSTM, ConvTranspose, shared and
    Constant-node weights, Gemm transA, an initializer that is also an input, ...) converted to float16,
    quantized at its own opset (17: Casts around float32 Q/DQ), in float16 or computing in float32 inside."""
    done = []
    for name, fam in _families().items():
        p, feeds = fam()
        m = to_float16(p, keep_io_types=keep_io)
        f16 = feeds_float16(feeds, m)
        try:
            run(m, f16[0])
        except Exception:   # noqa: BLE001 - onnxruntime refuses the float model itself (shared_params: node names)
            continue
        q = _proto(quantize(m, f16, opset=m.opset_import[0].version, progress=False, min_sqnr=float("-inf"),
                            target=target))
        done.append((name, _check(m, q, f16[-2:], FLOOR_FAMILIES_DB)))
    assert len(done) >= 25, done


def _save(tmp_path, m, feeds, name="m"):
    onnx.save(m, str(tmp_path / f"{name}.onnx"))
    np.savez(tmp_path / f"{name}.npz", **{k: np.stack([f[k] for f in feeds]) for k in feeds[0]})
    return tmp_path / f"{name}.onnx", tmp_path / f"{name}.npz"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "qcompiler", "quantize", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("io,opset,pin", [("fp16", 17, []), ("keep_io", 13, ["--opset", "13"]),
                                          ("fp16", 13, ["--opset", "13"])])
def test_cli_exits_0(tmp_path, io, opset, pin):
    """float32 calibration data for a float16 input is converted (a note); exit 0, a model that runs."""
    m, feeds = build("transformer", opset, io)
    mp, _ = _save(tmp_path, m, feeds)
    np.savez(tmp_path / "c32.npz", x=np.stack([f["x"] for f in feeds]).astype(np.float32))
    r = _cli(mp, "--calib", tmp_path / "c32.npz", "-o", tmp_path / "q.onnx", *pin)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    _check(m, onnx.load(str(tmp_path / "q.onnx")), feeds[-3:], FLOOR_8BIT_DB)


def test_bfloat16_exits_2_naming_the_dtype(tmp_path):
    m, _ = build("mlp", 17, "bf16")
    mp = tmp_path / "m.onnx"
    onnx.save(m, str(mp))
    np.savez(tmp_path / "c.npz", x=np.zeros((2, 4, 16), np.float32))
    before = hashlib.sha256(mp.read_bytes()).hexdigest()
    r = _cli(mp, "--calib", tmp_path / "c.npz", "-o", tmp_path / "q.onnx")
    assert_one_line_error(r, "m.onnx", "bfloat16", "'x'")
    assert hashlib.sha256(mp.read_bytes()).hexdigest() == before
    assert not (tmp_path / "q.onnx").exists()
    with pytest.raises(OnnxRuntimeError, match="bfloat16"):
        quantize(m, [{"x": np.zeros((4, 16), ml_dtypes.bfloat16)}], progress=False)
