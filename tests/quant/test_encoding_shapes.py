"""a per-tensor encoding holds one number, in any form numpy 2 gives it.

A Python float, a numpy float16/float32/float64 scalar, a 0-d array, a (1,) or (1, 1) array, in float16,
float32 or float64: the report, the encodings writer (1.0.0 and 2.0.0) and the QDQ export take each
(encoding.scalar), and the exported model runs in onnxruntime. numpy 2 refuses float() on a (1,) array, which
crashed the report on trained models after quantization had finished.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import qcompiler.quant.calibration.calibrate as calibrate
from qcompiler.quant.core.encoding import Encoding, compute_encoding, quantize_dequantize, scalar
from qcompiler.quant.interop.encodings_io import read_encodings, write_encodings
from qcompiler.quant.api import quantize
from qcompiler.quant.interop.report import encoding_summary
from tests.helpers import make_model, run, sqnr_db, tinfo


def _one(a):
    return np.asarray(a).reshape(())


FORMS = {   # name: (scale form, zero point form)
    "python float": (lambda a: float(_one(a)), lambda z: int(_one(z))),
    "np.float32 scalar": (lambda a: np.float32(_one(a)), lambda z: np.int64(_one(z))),
    "np.float64 scalar": (lambda a: np.float64(_one(a)), lambda z: np.int32(_one(z))),
    "np.float16 scalar": (lambda a: np.float16(_one(a)), lambda z: np.uint8(_one(z))),
    "0-d float32": (lambda a: _one(a).astype(np.float32), lambda z: _one(z).astype(np.int64)),
    "(1,) float32": (lambda a: _one(a).astype(np.float32).reshape(1), lambda z: _one(z).astype(np.int64).reshape(1)),
    "(1, 1) float32": (lambda a: _one(a).astype(np.float32).reshape(1, 1),
                       lambda z: _one(z).astype(np.int64).reshape(1, 1)),
    "(1,) float16": (lambda a: _one(a).astype(np.float16).reshape(1), lambda z: _one(z).astype(np.int32).reshape(1)),
    "(1, 1) float64": (lambda a: _one(a).astype(np.float64).reshape(1, 1),
                       lambda z: _one(z).astype(np.int8).reshape(1, 1)),
    "0-d float16": (lambda a: _one(a).astype(np.float16), lambda z: _one(z).astype(np.int16)),
}


def _reshaped(enc: Encoding, form: str) -> Encoding:
    fs, fz = FORMS[form]
    enc.scale, enc.zero_point = fs(enc.scale), fz(enc.zero_point)
    return enc


@pytest.mark.parametrize("form", list(FORMS))
def test_scalar_reads_every_form(form):
    fs, fz = FORMS[form]
    assert scalar(fs(np.float32(0.5))) == 0.5 and type(scalar(fs(np.float32(0.5)))) is float
    assert scalar(fz(np.int64(7))) == 7 and type(scalar(fz(np.int64(7)))) is int


@pytest.mark.parametrize("bad", [np.zeros(2), np.ones((1, 3)), np.zeros(0), [0.1, 0.2]])
def test_scalar_refuses_a_real_vector_naming_it(bad):
    with pytest.raises(ValueError, match=r"input scale: expected one value \(per-tensor\), got an array of shape"):
        scalar(bad, "input scale")


def test_a_per_tensor_encoding_holding_a_vector_is_refused_not_truncated():
    enc = Encoding(scale=np.array([0.1, 0.2], np.float32), zero_point=np.zeros(2, np.int64))
    with pytest.raises(ValueError, match="shape"):
        encoding_summary(enc)
    with pytest.raises(ValueError, match="shape"):
        write_encodings(None, {"a": enc}, {}, "2.0.0")


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("signed", [False, True])
def test_report_and_encodings_files_take_every_form(form, signed, tmp_path):
    base = compute_encoding(-1.0, 3.0, bits=8, symmetric=signed, signed=signed)
    want_scale, want_zp = float(base.scale), int(base.zero_point)
    enc = _reshaped(compute_encoding(-1.0, 3.0, bits=8, symmetric=signed, signed=signed), form)
    bias = _reshaped(Encoding(scale=np.float32(1e-4), zero_point=np.int64(0), bits=32, symmetric=True, signed=True),
                     form)
    d = encoding_summary(enc)
    tol = 1e-3 if "16" in form else 1e-6
    assert type(d["scale"]) is float and type(d["zero_point"]) is int and type(d["min"]) is float
    assert np.isclose(d["scale"], want_scale, rtol=tol) and d["zero_point"] == want_zp
    assert np.isclose(d["min"], float(base.min), rtol=tol, atol=tol) and np.isclose(d["max"], float(base.max), rtol=tol)
    json.dumps(d)
    assert encoding_summary(bias)["bits"] == 32
    x = np.linspace(-1, 3, 50, dtype=np.float32)
    assert quantize_dequantize(x, enc).shape == x.shape
    for version in ("1.0.0", "2.0.0"):
        path = tmp_path / f"enc_{version}.json"
        doc = write_encodings(str(path), {"a": enc}, {"b": bias}, version)
        json.loads(path.read_text())
        if version == "2.0.0":
            assert all(isinstance(e["y_scale"], float) for e in doc["encodings"])    # a number, not [x]
        acts, params = read_encodings(str(path), param_names=["b"])
        got = acts["a"]
        assert np.shape(got.scale) == () and np.isclose(float(got.scale), want_scale, rtol=tol)
        assert int(got.zero_point) == want_zp and got.signed == signed
        assert params["b"].bits == 32 if version == "2.0.0" else "b" not in params   # 1.0.0: no int32 biases (as AIMET)


def _model():
    """Conv(+bias) -> Relu -> Flatten -> Gemm(+bias, 1 output) and a group-2 ConvTranspose(+bias) branch."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "wc", "bc"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("Gemm", ["f", "wg", "bg"], ["y"], transB=1),
             helper.make_node("ConvTranspose", ["r", "wt", "bt"], ["z"], group=2, strides=[2, 2])]
    inits = [numpy_helper.from_array(a.astype(np.float32), n) for n, a in (
        ("wc", rng.normal(0, 0.3, (4, 2, 3, 3))), ("bc", rng.normal(0, 0.2, (4,))),
        ("wg", rng.normal(0, 0.2, (1, 4 * 4 * 4))), ("bg", np.array([0.1])),
        ("wt", rng.normal(0, 0.3, (4, 3, 2, 2))), ("bt", rng.normal(0, 0.2, (6,))))]
    return make_model(nodes, [tinfo("x", [1, 2, 4, 4])], [tinfo("y", [1, 1]), tinfo("z", [1, 6, 8, 8])], inits)


@pytest.mark.parametrize("form", list(FORMS))
def test_quantize_end_to_end_with_every_form(form, monkeypatch, tmp_path):
    """Every per-tensor encoding the calibration makes (activations and per-tensor weights) in `form`: the
    quantization, its report, both encodings versions and the exported model (run in onnxruntime) all work."""
    real = calibrate.compute_encoding

    def odd(*a, **kw):
        enc = real(*a, **kw)
        return enc if enc.axis is not None else _reshaped(enc, form)
    monkeypatch.setattr(calibrate, "compute_encoding", odd)
    proto = _model()
    rng = np.random.default_rng(1)
    cal = [{"x": rng.normal(0, 1, (1, 2, 4, 4)).astype(np.float32)} for _ in range(16)]
    res = quantize(proto, cal, per_channel=False, optimize="accuracy",
                   target={"base": "ort_cpu", "prefold_unfused_weight_dq": False})
    assert isinstance(res.report["quantized_params"]["bt"]["scale"], float)
    assert np.ndim(res.encodings["params"]["bt"].scale) == 0
    for version in ("1.0.0", "2.0.0"):
        res.write_encodings(str(tmp_path / f"e{version}.json"), version)
    path = tmp_path / "q.onnx"
    res.save(str(path))
    q = onnx.load(str(path))
    onnx.checker.check_model(q)
    outs = [(run(proto, feed), run(q, feed)) for feed in cal]
    for i, name in enumerate(("y", "z")):      # over all samples: y is one number per sample
        ref, got = np.stack([o[0][i] for o in outs]), np.stack([o[1][i] for o in outs])
        assert sqnr_db(ref, got) >= 25.0, name
    # the per-tensor Q/DQ parameters are written as scalars, whatever shape the encoding held
    inits = {t.name: t for t in q.graph.initializer}
    for n in q.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and not any(a.name == "axis" for a in n.attribute):
            assert list(inits[n.input[1]].dims) == [], n.name
