"""Calibration sources users of the peers bring: onnxruntime's CalibrationDataReader (a
subclass, whose len() raises), a get_next()-only object, generators, .npy for a single-input model, folders of
.npz/.npy. Every one quantizes to the same model as the same samples in an .npz; the hostile checks stay."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
from onnx import helper
from onnxruntime.quantization import CalibrationDataReader

from qcompiler import model_to_proto
from qcompiler.errors import ArgumentError, DataError
from qcompiler.quant.api import quantize
from qcompiler.quant.calibration.data import load_samples
from tests.helpers import make_model, run, sqnr_db, tinfo
from tests.quant.test_quantize_fieldnotes import init

N = 6


def _model():
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    return make_model(nodes, [tinfo("x", ["batch", 8])], [tinfo("y", ["batch", 4])],
                      [init("w", rng.normal(0, 0.3, (8, 16)).astype(np.float32)),
                       init("w2", rng.normal(0, 0.3, (16, 4)).astype(np.float32))])


def _data():
    return np.random.default_rng(1).normal(0, 1, (N, 1, 8)).astype(np.float32)


class OrtReader(CalibrationDataReader):
    """What onnxruntime's examples write: len() is not defined (the base class raises)."""

    def __init__(self, data):
        self.data, self.i = data, 0

    def get_next(self):
        if self.i >= len(self.data):
            return None
        self.i += 1
        return {"x": self.data[self.i - 1]}


class GetNextOnly:
    """Intel's and NVIDIA's readers have this shape: get_next() only, no __iter__, no __len__."""

    def __init__(self, data):
        self.data, self.i = data, 0

    def get_next(self):
        if self.i >= len(self.data):
            return None
        self.i += 1
        return {"x": self.data[self.i - 1]}


def _weights(res) -> dict:
    return {n: (e.scale.tolist(), e.zero_point.tolist()) for n, e in res.encodings["activations"].items()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("ref")
    np.savez(d / "calib.npz", x=_data())
    return _weights(quantize(_model(), str(d / "calib.npz")))


def test_ort_calibration_data_reader_subclass(reference):
    reader = OrtReader(_data())
    with pytest.raises(NotImplementedError):
        len(reader)      # what used to crash quantize()
    res = quantize(_model(), reader)
    assert _weights(res) == reference
    assert res.report["calibration_samples"] == N
    proto = model_to_proto(res.model)
    x = _data()[0]
    assert sqnr_db(run(_model(), {"x": x})[0], run(proto, {"x": x})[0]) > 20


def test_get_next_only_object(reference):
    assert _weights(quantize(_model(), GetNextOnly(_data()))) == reference


def test_generator_and_list(reference):
    assert _weights(quantize(_model(), ({"x": a} for a in _data()))) == reference
    assert _weights(quantize(_model(), [{"x": a} for a in _data()])) == reference


def test_npy_for_a_single_input_model(tmp_path, reference):
    p = tmp_path / "x.npy"
    np.save(p, _data())
    before = hashlib.sha256(p.read_bytes()).hexdigest()
    assert _weights(quantize(_model(), str(p))) == reference
    assert hashlib.sha256(p.read_bytes()).hexdigest() == before
    # rank r (no per-sample batch axis): batch-1 samples along axis 0, as for .npz
    np.save(p, _data()[:, 0])
    assert _weights(quantize(_model(), str(p))) == reference


def test_folder_of_npy_and_npz(tmp_path, reference):
    np.save(tmp_path / "a.npy", _data()[:3])
    np.savez(tmp_path / "b.npz", x=_data()[3:])
    assert _weights(quantize(_model(), str(tmp_path))) == reference


def test_npy_refused_for_a_two_input_model(tmp_path):
    p = tmp_path / "x.npy"
    np.save(p, _data())
    with pytest.raises(DataError, match=r"x\.npy: an \.npy file holds one array, but the model has 2 inputs"):
        load_samples(str(p), {"a": (np.dtype(np.float32), (1, 8)), "b": (np.dtype(np.float32), (1, 8))})


def test_hostile_npy_is_one_line(tmp_path):
    spec = {"x": (np.dtype(np.float32), ("batch", 8))}
    p = tmp_path / "big.npy"
    np.save(p, _data())
    raw = p.read_bytes()
    p.write_bytes(raw[:-40])                     # truncated data
    with pytest.raises(DataError, match=r"big\.npy: header claims shape \(6, 1, 8\)"):
        load_samples(str(p), spec)
    p.write_bytes(raw.replace(b"'shape': (6,", b"'shape': (9,"))   # header claims more samples than stored
    with pytest.raises(DataError, match="header claims"):
        load_samples(str(p), spec)
    p.write_bytes(b"not an npy file at all")
    with pytest.raises(DataError, match=r"big\.npy: not a readable \.npy file"):
        load_samples(str(p), spec)
    q = tmp_path / "obj.npy"
    np.save(q, np.array([{"a": 1}] * 3, dtype=object), allow_pickle=True)
    with pytest.raises(DataError, match="object arrays are not accepted"):
        load_samples(str(q), spec)
    w = tmp_path / "f64.npy"
    np.save(w, np.full((2, 1, 8), np.nan))
    with pytest.raises(DataError, match=r"f64\.npy: input 'x' sample 0: contains NaN"):
        list(load_samples(str(w), spec))


def test_reader_errors_name_the_sample():
    class Bad(GetNextOnly):
        def get_next(self):
            feed = super().get_next()
            if feed is not None and self.i == 3:
                feed = {"x": np.full((1, 8), np.inf, np.float32)}
            return feed
    with pytest.raises(DataError, match="input 'x' sample 2: contains Inf"):
        quantize(_model(), Bad(_data()))
    with pytest.raises(DataError, match="sample 0: expected a dict of input arrays, got list"):
        quantize(_model(), [[1, 2, 3]])


def test_one_shot_reader_read_twice_is_one_line():
    s = load_samples(GetNextOnly(_data()), {"x": (np.dtype(np.float32), ("batch", 8))})
    assert s.length is None          # never len() of a user's reader
    assert sum(1 for _ in s) == N
    with pytest.raises(DataError, match="already read once and has no rewind"):
        list(s)

    class Rewinding(GetNextOnly):
        def rewind(self):
            self.i = 0
    s = load_samples(Rewinding(_data()), {"x": (np.dtype(np.float32), ("batch", 8))})
    assert sum(1 for _ in s) == N and sum(1 for _ in s) == N


def test_not_a_source_is_one_argument_error():
    with pytest.raises(ArgumentError, match="calib must be an .npz/.npy path, a folder, an iterable of feed "
                                            "dicts or a reader with get_next"):
        quantize(_model(), 42)
    with pytest.raises(ArgumentError, match="wrap it in a list"):
        quantize(_model(), {"x": _data()[0]})


def test_empty_reader():
    with pytest.raises(DataError, match="empty sample set"):
        quantize(_model(), GetNextOnly([]))
