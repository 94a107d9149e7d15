"""`qcompiler.ort.quantize_static`, the drop-in for onnxruntime's: same signature and meaning,
onnxruntime's enums or their names, each argument's effect on a small model, one ArgumentError line for what
cannot be honoured, and a corpus figure at least as good as onnxruntime's own quantize_static with the same
arguments (measured here)."""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import onnx
import pytest
from onnx import helper
from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType
from onnxruntime.quantization import quantize_static as ort_quantize_static

from qcompiler.errors import ArgumentError
from qcompiler.ort import quantize_static
from tests.corpus import corpus_file
from tests.helpers import make_model, run, sqnr_db, tinfo
from tests.quant.test_quantize_fieldnotes import init


def _model(hidden=16):
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["m2"], name="mm2"),
             helper.make_node("Sigmoid", ["m2"], ["y"], name="sig")]
    return make_model(nodes, [tinfo("x", ["batch", 8])], [tinfo("y", ["batch", 4])],
                      [init("w", rng.normal(0, 0.3, (8, hidden)).astype(np.float32)),
                       init("w2", rng.normal(0, 0.3, (hidden, 4)).astype(np.float32))], opset=13)


class Reader(CalibrationDataReader):
    def __init__(self, n=8):
        self.data = np.random.default_rng(1).normal(0, 1, (n, 1, 8)).astype(np.float32)
        self.i = 0

    def get_next(self):
        if self.i >= len(self.data):
            return None
        self.i += 1
        return {"x": self.data[self.i - 1]}


def _q(tmp_path, **kw):
    out = str(tmp_path / "q.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # no warning unless a test asks for one
        res = quantize_static(_model(), out, Reader(), **kw)
    q = onnx.load(out)
    x = Reader().data[0]
    assert sqnr_db(run(_model(), {"x": x})[0], run(q, {"x": x})[0]) > 15
    return res, q


def test_signature_is_onnxruntimes():
    ours = list(inspect.signature(quantize_static).parameters)
    theirs = list(inspect.signature(ort_quantize_static).parameters)
    assert ours == theirs


def test_enums_and_their_names(tmp_path):
    a, _ = _q(tmp_path, quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8,
              weight_type=QuantType.QInt8, calibrate_method=CalibrationMethod.MinMax)
    b, _ = _q(tmp_path, quant_format="QDQ", activation_type="QUInt8", weight_type="QuantType.QInt8",
              calibrate_method="MinMax")
    assert a.report["quantized_activations"] == b.report["quantized_activations"]
    assert a.report["scheme"] == "min_max"


@pytest.mark.parametrize("kw, msg", [
    ({"quant_format": QuantFormat.QOperator}, "quant_format: QOperator is not supported"),
    ({"calibrate_method": CalibrationMethod.Distribution}, "calibrate_method: Distribution"),
    ({"activation_type": QuantType.QFLOAT8E4M3FN}, "activation_type: QFLOAT8E4M3FN is not supported"),
    ({"weight_type": "QInt7"}, "weight_type: unknown QuantType 'QInt7'"),
    ({"quant_format": CalibrationMethod.MinMax}, "quant_format must be a QuantFormat"),
    ({"calibration_cache_path": "cache.json"}, "calibration_cache_path is not supported"),
    ({"per_channel": "yes"}, "per_channel must be True or False"),
    ({"extra_options": {"SmoothQuant": True}}, r"extra_options\['SmoothQuant'\] = True: not supported"),
    ({"extra_options": {"CalibMovingAverage": True}}, "CalibMovingAverage"),
    ({"extra_options": {"TensorQuantOverrides": {"w": [{"scale": 1.0, "zero_point": 0}]}}},
     "key 'scale' is not supported on a weight"),
    ({"extra_options": {"TensorQuantOverrides": {"x": [{"rmin": 0.0, "rmax": 1.0}]}}},
     "overrides of a graph input are not supported"),
    ({"extra_options": {"TensorQuantOverrides": {"h": [{"rmin": 0.0}]}}}, "needs both 'rmin' and 'rmax'"),
    ({"nodes_to_exclude": "mm"}, None),   # a str is taken as one name
])
def test_what_cannot_be_honoured_is_one_line(tmp_path, kw, msg):
    if msg is None:
        _q(tmp_path, **kw)
        return
    with pytest.raises(ArgumentError, match=msg) as e:
        quantize_static(_model(), str(tmp_path / "q.onnx"), Reader(), **kw)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "q.onnx").exists()


def test_off_values_of_refused_keys_and_ignored_keys_are_accepted(tmp_path):
    _q(tmp_path, extra_options={"SmoothQuant": False, "CalibMovingAverage": False, "MatMulConstBOnly": True,
                                "ForceQuantizeNoInputCheck": True, "DedicatedQDQPair": False})
    with pytest.warns(UserWarning, match="extra_options key 'NoSuchKey' is unknown and ignored"):
        quantize_static(_model(), str(tmp_path / "q.onnx"), Reader(), extra_options={"NoSuchKey": 1})


def test_per_channel_and_reduce_range(tmp_path):
    res, _ = _q(tmp_path, per_channel=True, reduce_range=True)
    w = res.report["quantized_params"]["w"]
    assert w["axis"] == 1 and w["range_bits"] == 7
    res, _ = _q(tmp_path, per_channel=False, reduce_range=False)
    w = res.report["quantized_params"]["w"]
    assert "axis" not in w and w.get("range_bits", 8) == 8


def test_activation_and_weight_types(tmp_path):
    res, q = _q(tmp_path, activation_type=QuantType.QInt16, weight_type=QuantType.QInt8)
    assert {e["bits"] for e in res.report["quantized_activations"].values()} == {16}
    res, q = _q(tmp_path, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt4)
    assert {e["bits"] for e in res.report["quantized_params"].values() if "range_bits" in e or e["bits"] < 32} \
        == {4}
    assert q.opset_import[0].version >= 21


def test_calibrate_methods(tmp_path):
    for method, scheme in ((CalibrationMethod.Entropy, "entropy"), (CalibrationMethod.Percentile, "percentile")):
        res, _ = _q(tmp_path, calibrate_method=method)
        assert res.report["scheme"] == scheme


def test_nodes_to_exclude(tmp_path):
    res, q = _q(tmp_path, nodes_to_exclude=["mm2"])
    assert "w2" not in res.report["quantized_params"] and "w" in res.report["quantized_params"]
    assert "m2" not in res.report["quantized_activations"]
    assert "mm2" in res.report["layers"]
    with pytest.warns(UserWarning, match="nodes_to_exclude 'nope' matches no node"):
        quantize_static(_model(), str(tmp_path / "q.onnx"), Reader(), nodes_to_exclude=["nope"])
    # a name is never a regex here: 'mm' leaves mm2 quantized
    res, _ = _q(tmp_path, nodes_to_exclude=["mm"])
    assert "w" not in res.report["quantized_params"] and "w2" in res.report["quantized_params"]


def test_op_types_and_nodes_to_quantize(tmp_path):
    res, q = _q(tmp_path, op_types_to_quantize=["MatMul"])
    params = res.report["quantized_params"]
    assert "w" in params and "w2" in params
    assert "y" not in res.report["quantized_activations"]        # Sigmoid output: no quantizer
    # m2 (a MatMul output read only by the float Sigmoid) has no Q of its own under --optimize balanced: the
    # MatMul runs MatMulIntegerToFloat and a Q/DQ pair there would only cost time
    assert "m2" not in res.report["quantized_activations"]
    res, q = _q(tmp_path, nodes_to_quantize=["mm2"])
    assert "w2" in res.report["quantized_params"] and "w" not in res.report["quantized_params"]
    assert "r" in res.report["quantized_activations"]             # mm2's input keeps its quantizer
    with pytest.warns(UserWarning, match="op_types_to_quantize 'Conv' matches no node"):
        quantize_static(_model(), str(tmp_path / "q.onnx"), Reader(), op_types_to_quantize=["MatMul", "Conv"])


def test_symmetric_extra_options(tmp_path):
    res, _ = _q(tmp_path, extra_options={"ActivationSymmetric": True})
    acts = res.report["quantized_activations"]
    assert all(e["symmetric"] for n, e in acts.items() if n != "y")   # Sigmoid's [0, 1] is fixed
    res, _ = _q(tmp_path, extra_options={"WeightSymmetric": False})
    assert not res.report["quantized_params"]["w"]["symmetric"]


def test_tensor_quant_overrides(tmp_path):
    res, _ = _q(tmp_path, extra_options={"TensorQuantOverrides": {
        "r": [{"rmin": 0.0, "rmax": 2.0}],
        "m2": [{"quant_type": QuantType.QUInt16}],
        "w2": [{"quant_type": QuantType.QInt16, "symmetric": True}]}})
    acts = res.report["quantized_activations"]
    assert acts["r"]["min"] == pytest.approx(0.0, abs=1e-6) and acts["r"]["max"] == pytest.approx(2.0, rel=1e-3)
    assert acts["m2"]["bits"] == 16
    assert res.report["quantized_params"]["w2"]["bits"] == 16
    res, _ = _q(tmp_path, extra_options={"TensorQuantOverrides": {"r": [{"scale": 0.01, "zero_point": 0}]}})
    assert res.report["quantized_activations"]["r"]["scale"] == pytest.approx(0.01)
    with pytest.warns(UserWarning, match=r"TensorQuantOverrides 'h' not applied: the tensor is left float \(inside"):
        quantize_static(_model(), str(tmp_path / "q.onnx"), Reader(),       # MatMul -> Relu: no quantizer between
                        extra_options={"TensorQuantOverrides": {"h": [{"rmin": 0.0, "rmax": 1.0}]}})
    with pytest.warns(UserWarning, match="TensorQuantOverrides 'ghost' matches no tensor"):
        quantize_static(_model(), str(tmp_path / "q.onnx"), Reader(),
                        extra_options={"TensorQuantOverrides": {"ghost": [{"rmin": 0.0, "rmax": 1.0}]}})


def test_use_external_data_format(tmp_path):
    out = tmp_path / "q.onnx"
    quantize_static(_model(512), str(out), Reader(), use_external_data_format=True)
    assert (tmp_path / "q.onnx.data").stat().st_size > 4096      # the weights, beside the model
    x = Reader().data[0]
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    got = ort.InferenceSession(str(out), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert sqnr_db(run(_model(512), {"x": x})[0], got) > 15


def test_model_path_and_npz_source(tmp_path):
    onnx.save(_model(), str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "c.npz", x=Reader().data)
    res = quantize_static(str(tmp_path / "m.onnx"), str(tmp_path / "q.onnx"), str(tmp_path / "c.npz"))
    assert res.report["calibration_samples"] == 8


# ------------------------------------------------------------------------------------------ corpus figure

class NpzReader(CalibrationDataReader):
    """The reader of the corpus's ort_baseline.py."""

    def __init__(self, path):
        d = np.load(path)
        self.data = {k: d[k] for k in d.files}
        self.n = next(iter(self.data.values())).shape[0]
        self.i = 0

    def get_next(self):
        if self.i >= self.n:
            return None
        feed = {k: v[self.i] for k, v in self.data.items()}
        self.i += 1
        return feed


def _eval(model_dir, path) -> float:
    r = subprocess.run([sys.executable, os.path.join(model_dir, "eval.py"), path], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-500:]
    return json.loads(r.stdout.strip().splitlines()[-1])["value"]


def test_digits_cnn_at_least_as_good_as_onnxruntime(tmp_path, per_channel=True):
    """ort_baseline.py's arguments (QDQ, MinMax, per channel, default types), both measured here."""
    model = corpus_file("digits_cnn")
    if not os.path.exists(model):
        pytest.skip("corpus not present")
    model_dir = os.path.dirname(model)
    calib = os.path.join(model_dir, "calib.npz")
    kw = dict(quant_format=QuantFormat.QDQ, per_channel=per_channel, calibrate_method=CalibrationMethod.MinMax)
    theirs, ours = str(tmp_path / "ort.onnx"), str(tmp_path / "qc.onnx")
    import logging
    logging.getLogger().setLevel(logging.ERROR)     # onnxruntime's "consider pre-processing" lines
    ort_quantize_static(model, theirs, NpzReader(calib), **kw)
    quantize_static(model, ours, NpzReader(calib), **kw)
    t, o = _eval(model_dir, theirs), _eval(model_dir, ours)
    assert o >= t, f"qcompiler.ort {o} < onnxruntime {t}"
    assert o >= 0.99722 - 0.005     # the corpus target: drop <= 0.005 from float
