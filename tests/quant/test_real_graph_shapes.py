"""constructs of real graphs that crashed quantization.

- grouped and depthwise Conv / ConvTranspose, with and without bias, per channel and per tensor, at every
  target: a group-2 ConvTranspose with bias failed in apply_plan with a numpy broadcast error (its weight
  [C_in, C_out/g, kH, kW] holds C_out/g scales on the per-channel axis 1, its bias C_out);
- a 1-channel Conv/Gemm with bias: its int32 bias had a shape-(1,) per-tensor scale, which numpy 2 refuses to
  float() (the report failed after quantization had finished);
- graph inputs of rank 0 (a sample rate beside the audio), rank 1 and with symbolic dims.
Every quantized model runs in onnxruntime and stays within an SQNR floor of the float model.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from qcompiler import model_to_proto
from qcompiler.quant.api import quantize
from tests.helpers import make_model, run, sqnr_db, tinfo

FLOOR_DB = 25.0
TARGETS = ["ort_cpu", "trt", "qnn_htp",
           # ORT with the weight DQ kept in the graph (ort_cpu stores ConvTranspose weights prefolded)
           {"base": "ort_cpu", "prefold_unfused_weight_dq": False}]
TARGET_IDS = ["ort_cpu", "trt", "qnn_htp", "ort_cpu_dq"]


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def conv_model(op: str, group, bias: bool, cin: int = 4, cout: int = 6):
    """One Conv or ConvTranspose on a [1, cin, 5, 5] input; group "dw" = depthwise (group = cin = cout)."""
    rng = np.random.default_rng(0)
    if group == "dw":
        group, cout = cin, cin
    if op == "Conv":
        w = rng.normal(0, 0.3, (cout, cin // group, 3, 3))       # [C_out, C_in/g, kH, kW]
        attrs, oshape = {"pads": [1, 1, 1, 1]}, [1, cout, 5, 5]
    else:
        w = rng.normal(0, 0.3, (cin, cout // group, 3, 3))       # [C_in, C_out/g, kH, kW]
        attrs, oshape = {"strides": [2, 2]}, [1, cout, 11, 11]
    inits, ins = [_init("w", w.astype(np.float32))], ["x", "w"]
    if bias:
        inits.append(_init("b", rng.normal(0, 0.5, (cout,)).astype(np.float32)))
        ins.append("b")
    nodes = [helper.make_node(op, ins, ["y"], group=group, **attrs)]
    return make_model(nodes, [tinfo("x", [1, cin, 5, 5])], [tinfo("y", oshape)], inits)


def feeds(shapes: dict, n: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    return [{k: (rng.normal(0, 1, s).astype(np.float32) if dt is None else dt(s, rng))
             for k, (s, dt) in shapes.items()} for _ in range(n)]


def check(proto, res, fresh, floor=FLOOR_DB):
    """The quantized model passes onnx's checker, runs in onnxruntime, keeps the outputs, beats `floor` dB."""
    q = model_to_proto(res.model)
    onnx.checker.check_model(q)
    assert [o.name for o in q.graph.output] == [o.name for o in proto.graph.output]
    for feed in fresh:
        for r, g in zip(run(proto, feed), run(q, feed)):
            assert r.shape == g.shape
            assert sqnr_db(r, g) >= floor, f"SQNR {sqnr_db(r, g):.1f} dB < {floor}"
    for s in res.report["output_sqnr_db"].values():
        assert s >= floor
    return q


def _bias_dq(q):
    return next((n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "b_quantized"), None)


def _const(q, name):
    return next(numpy_helper.to_array(t) for t in q.graph.initializer if t.name == name)


@pytest.mark.parametrize("target", TARGETS, ids=TARGET_IDS)
@pytest.mark.parametrize("per_channel", [True, False], ids=["per_channel", "per_tensor"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("group", [1, 2, "dw"], ids=["g1", "g2", "depthwise"])
@pytest.mark.parametrize("op", ["Conv", "ConvTranspose"])
def test_grouped_and_depthwise_conv_at_every_target(op, group, bias, per_channel, target):
    proto = conv_model(op, group, bias)
    shape = {"x": ([1, 4, 5, 5], None)}
    res = quantize(proto, feeds(shape, 8), target=target, per_channel=per_channel)
    q = check(proto, res, feeds(shape, 2, seed=7))
    res.write_encodings(None, "1.0.0")
    res.write_encodings(None, "2.0.0")
    benc = res.encodings["params"].get("b")
    if benc is None:
        return
    # the int32 bias grid is s_in * s_w of each output channel, C_out of them (or one when both are per tensor)
    wenc = res.encodings["params"]["w"]
    s_in = float(np.asarray(res.encodings["activations"]["x"].scale).reshape(()))
    sw = np.asarray(wenc.scale, np.float64).reshape(-1)
    groups = 1 if group == 1 else (2 if group == 2 else 4)
    if op == "ConvTranspose" and wenc.per_channel:
        sw = np.tile(sw, groups)     # axis-1 scales are shared by the groups: output channel o uses o mod C_out/g
    want = s_in * sw
    got = np.asarray(benc.scale, np.float64)
    if got.ndim == 0:
        assert np.allclose(want, float(got), rtol=1e-6)
    else:
        assert got.shape == (6 if group != "dw" else 4,)
        assert np.allclose(got, want, rtol=1e-6)
    dq = _bias_dq(q)
    if dq is not None:   # not prefolded: the exported DQ carries the same scale
        assert np.allclose(_const(q, dq.input[1]), got, rtol=1e-6)


def test_grouped_conv_transpose_weight_axis_is_one_with_scales_shared_by_groups():
    """NOTE (qdq.output_channel_scales): C_out/g scales on axis 1, each the max over the g groups."""
    proto = conv_model("ConvTranspose", 2, True)
    res = quantize(proto, feeds({"x": ([1, 4, 5, 5], None)}, 8), target="qnn_htp")
    w = numpy_helper.to_array(proto.graph.initializer[0]).astype(np.float64)
    enc = res.encodings["params"]["w"]
    assert enc.axis == 1 and np.shape(enc.scale) == (3,)
    absmax = np.abs(w).max(axis=(0, 2, 3))           # over both groups (axis 0) and the taps
    assert np.allclose(np.asarray(enc.scale, np.float64), absmax / 127, rtol=1e-5)
    assert np.shape(res.encodings["params"]["b"].scale) == (6,)


@pytest.mark.parametrize("target", ["ort_cpu", "trt", "qnn_htp"])
@pytest.mark.parametrize("op", ["Conv", "Gemm"])
def test_one_output_channel_with_bias_reports_and_exports(op, target, tmp_path):
    """A 1-channel head (objectness, voice activity): per-channel weight scale (1,), bias per tensor."""
    rng = np.random.default_rng(0)
    if op == "Conv":
        wshape, ishape, oshape, kw = (1, 4, 3, 3), [1, 4, 5, 5], [1, 1, 3, 3], {}
    else:
        wshape, ishape, oshape, kw = (1, 4), [1, 4], [1, 1], {"transB": 1}
    inits = [_init("w", rng.normal(0, 0.3, wshape).astype(np.float32)),
             _init("b", np.array([0.25], np.float32))]
    proto = make_model([helper.make_node(op, ["x", "w", "b"], ["y"], **kw)], [tinfo("x", ishape)],
                       [tinfo("y", oshape)], inits)
    shape = {"x": (ishape, None)}
    cal = feeds(shape, 16)
    res = quantize(proto, cal, target=target)
    check(proto, res, cal[:3])     # one output value per sample: fresh ones may fall outside its range
    rep = res.report["quantized_params"]
    if "b" in rep:
        assert isinstance(rep["b"]["scale"], float) and rep["b"]["bits"] == 32
        assert np.isfinite(rep["b"]["min"]) and np.isfinite(rep["b"]["max"])
    for version in ("1.0.0", "2.0.0"):
        res.write_encodings(str(tmp_path / f"e{version}.json"), version)


# --- graph inputs of rank 0, rank 1 and symbolic dims -------------------------------------------------------
def _int_sr(shape, rng):
    return np.asarray(rng.choice([8000, 16000]), np.int64).reshape(shape)


def _pos_scalar(shape, rng):
    return np.asarray(rng.uniform(0.5, 1.5), np.float32).reshape(shape)


def vad_model(frames: int | str = 16):
    """audio [1, 2, T] -> Conv, scaled by Cast(sr)/16000 (int64 rank 0) and gain (float rank 0)."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["audio", "w", "bc"], ["c"]),
             helper.make_node("Cast", ["sr"], ["srf"], to=T.FLOAT),
             helper.make_node("Div", ["srf", "k"], ["ratio"]),
             helper.make_node("Mul", ["c", "ratio"], ["m"]),
             helper.make_node("Mul", ["m", "gain"], ["y"])]
    inits = [_init("w", rng.normal(0, 0.3, (3, 2, 3)).astype(np.float32)),
             _init("bc", rng.normal(0, 0.3, (3,)).astype(np.float32)),
             _init("k", np.array(16000, np.float32))]
    out_t = frames - 2 if isinstance(frames, int) else "T2"
    return make_model(nodes, [tinfo("audio", [1, 2, frames]), tinfo("sr", [], T.INT64), tinfo("gain", [])],
                      [tinfo("y", [1, 3, out_t])], inits)


VAD_SHAPES = {"audio": ([1, 2, 16], None), "sr": ((), _int_sr), "gain": ((), _pos_scalar)}


def test_rank0_inputs_from_npz_as_the_readme_lays_them_out(tmp_path):
    """The data layout (docs/promises.md): an input of rank r takes an (N, ...) array of rank r+1, so a scalar input takes (N,)."""
    proto = vad_model()
    rows = feeds(VAD_SHAPES, 8)
    path = tmp_path / "calib.npz"
    np.savez(path, audio=np.stack([r["audio"] for r in rows]), sr=np.stack([r["sr"] for r in rows]),
             gain=np.stack([r["gain"] for r in rows]))
    assert np.load(path)["sr"].shape == (8,)
    res = quantize(proto, str(path))
    check(proto, res, feeds(VAD_SHAPES, 2, seed=5))
    assert "sr" in res.report["integer_tensors_never_quantized"]


@pytest.mark.parametrize("form", ["0-d array", "numpy scalar", "python number", "(1,) array"])
def test_rank0_inputs_from_feed_dicts_in_every_form(form):
    """A feed dict may give a scalar input as a 0-d array, a numpy scalar, a Python number or a (1,) array
    (leading 1 dropped); onnxruntime gets a 0-d array each time (it refuses numpy scalars)."""
    proto = vad_model()
    conv = {"0-d array": lambda a: a, "numpy scalar": lambda a: a[()], "python number": lambda a: a.item(),
            "(1,) array": lambda a: a.reshape(1)}[form]
    rows = [{k: (conv(v) if k != "audio" else v) for k, v in r.items()} for r in feeds(VAD_SHAPES, 8)]
    res = quantize(proto, rows)
    check(proto, res, feeds(VAD_SHAPES, 2, seed=5))


def test_rank0_feed_reaches_onnxruntime_as_a_0d_array():
    from qcompiler.quant.calibration.data import input_specs, load_samples
    from qcompiler.onnx_io import model_from_proto
    g = model_from_proto(vad_model()).graph
    rows = [{"audio": np.zeros((1, 2, 16), np.float32), "sr": np.array([16000], np.int32),
             "gain": np.float32(1.0)}]
    feed = next(iter(load_samples(rows, input_specs(g))))
    for name in ("sr", "gain"):
        assert isinstance(feed[name], np.ndarray) and feed[name].shape == ()
    assert feed["sr"].dtype == np.int64       # int32 -> int64 converted with a note


def test_rank1_input_without_batch_dim():
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["v", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["y"])]
    inits = [_init("w", rng.normal(0, 0.3, (8, 5)).astype(np.float32)),
             _init("b", rng.normal(0, 0.3, (5,)).astype(np.float32))]
    proto = make_model(nodes, [tinfo("v", [8])], [tinfo("y", [5])], inits)
    shape = {"v": ([8], None)}
    res = quantize(proto, feeds(shape, 8))
    check(proto, res, feeds(shape, 2, seed=2))


def test_symbolic_dims_with_samples_of_different_lengths(tmp_path):
    """Dynamic batch and time dims: calibration samples of different T, a folder of .npz files."""
    proto = vad_model("T")
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    rng = np.random.default_rng(4)
    rows = []
    for t, sr, gain in ((12, 16000, 0.5), (16, 8000, 1.5), (20, 16000, 1.0), (31, 8000, 1.2)):
        rows.append({"audio": rng.normal(0, 1, (1, 2, t)).astype(np.float32), "sr": np.array(sr, np.int64),
                     "gain": np.array(gain, np.float32)})
    res = quantize(proto, rows)
    fresh = [{"audio": rng.normal(0, 1, (2, 2, 24)).astype(np.float32), "sr": np.array(16000, np.int64),
              "gain": np.array(0.9, np.float32)}]
    check(proto, res, fresh)
    folder = tmp_path / "calib"
    folder.mkdir()
    for i, r in enumerate(rows):
        np.savez(folder / f"{i:02d}.npz", audio=r["audio"][None], sr=r["sr"][None], gain=r["gain"][None])
    res2 = quantize(proto, str(folder))
    check(proto, res2, fresh)


def test_frozen_weight_encoding_on_the_input_channel_axis_leaves_the_bias_float(tmp_path):
    """Weight scales along C_in (a frozen encoding) give no s_in*s_w per output channel: bias float, named."""
    import json
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.3, (6, 6, 3, 3)).astype(np.float32)
    proto = make_model([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
                       [tinfo("x", [1, 6, 5, 5])], [tinfo("y", [1, 6, 5, 5])],
                       [_init("w", w), _init("b", rng.normal(0, 0.5, (6,)).astype(np.float32))])
    scales = (np.abs(w).max(axis=(0, 2, 3)) / 127).tolist()
    path = tmp_path / "enc.json"
    path.write_text(json.dumps({"version": "2.0.0", "encodings": [
        {"name": "w", "output_dtype": "int8", "y_scale": scales, "axis": 1}]}))
    shape = {"x": ([1, 6, 5, 5], None)}
    res = quantize(proto, feeds(shape, 8), load_encodings=str(path),
                   target={"base": "ort_cpu", "prefold_unfused_weight_dq": False})
    check(proto, res, feeds(shape, 2, seed=3))
    assert res.encodings["params"]["w"].axis == 1
    assert "b" not in res.encodings["params"]
    reasons = [r for k, r in res.report["left_float"].items() if k.endswith(":input2")]
    assert reasons == ["bias left float: the weight is quantized along axis 1, not its output-channel axis 0 "
                       "(no one weight scale per output channel)"]
