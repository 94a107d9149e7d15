"""External data: saving with it (asked for, or automatically past the size threshold), lazy loading, and the
refusal of any location outside the model's folder or any byte range past the file's end.

A real >2 GB save is too slow for CI, so the threshold logic is tested by shrinking
`qcompiler.onnx_io.files.TWO_GB`.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import qcompiler
from qcompiler.errors import ModelLoadError
from qcompiler.onnx_io import files
from tests.conformance.roundtrip import session
from tests.helpers import make_model, tinfo

W = np.arange(64 * 64, dtype=np.float32).reshape(64, 64) / 4096.0   # 16 KB, above onnx's 1 KB size threshold


def _proto():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["y"], name="add")]
    return make_model(nodes, [tinfo("x", [2, 64])], [tinfo("y", [2, 64])],
                      [numpy_helper.from_array(W, "w"), numpy_helper.from_array(np.ones(64, np.float32), "b")])


def _feeds():
    return {"x": np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)}


def _external_locations(path):
    proto = onnx.load(path, load_external_data=False)
    return {t.name: {e.key: e.value for e in t.external_data}.get("location")
            for t in proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}


def test_save_with_external_data_and_reload(tmp_path):
    path = str(tmp_path / "m.onnx")
    qcompiler.save_model(qcompiler.model_from_proto(_proto()), path, external_data=True)
    assert _external_locations(path) == {"w": "m.onnx.data"}, "w (16 KB) external, b (256 B) inline"
    assert os.path.getsize(path) < W.nbytes
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".")], "no temporary files left behind"

    model = qcompiler.load_model(path)
    w = model.graph.value("w")
    assert w.tensor.is_external, "external tensors are not decoded at load time"
    assert not model.graph.value("b").tensor.is_external
    np.testing.assert_array_equal(w.const_value(), W)
    assert not w.tensor.is_external, "decoded (and cached) once touched"

    onnx.checker.check_model(path)
    want = session(_proto()).run(None, _feeds())[0]
    got = session(onnx.load(path)).run(None, _feeds())[0]
    np.testing.assert_array_equal(got, want)


def test_untouched_external_tensor_survives_resave(tmp_path):
    first, second = str(tmp_path / "a.onnx"), str(tmp_path / "sub" / "b.onnx")
    qcompiler.save_model(qcompiler.model_from_proto(_proto()), first, external_data=True)
    model = qcompiler.load_model(first)
    assert model.graph.value("w").tensor.is_external
    os.makedirs(os.path.dirname(second))
    qcompiler.save_model(model, second)          # small: inline
    assert _external_locations(second) == {}
    np.testing.assert_array_equal(numpy_helper.to_array(onnx.load(second).graph.initializer[0]), W)


def test_threshold_switches_to_external_data(tmp_path, monkeypatch):
    small, big = str(tmp_path / "small.onnx"), str(tmp_path / "big.onnx")
    qcompiler.save_model(qcompiler.model_from_proto(_proto()), small)
    assert _external_locations(small) == {}, "under the threshold: one self-contained file"
    monkeypatch.setattr(files, "TWO_GB", 8 * 1024)
    qcompiler.save_model(qcompiler.model_from_proto(_proto()), big)
    assert _external_locations(big) == {"w": "big.onnx.data"}
    np.testing.assert_array_equal(qcompiler.load_model(big).graph.value("w").const_value(), W)


# --- refusals --------------------------------------------------------------------------------------------------
def _write_with_location(folder, location, offset=0, length=None):
    """A model whose tensor `w` points at `location` (written by hand, as a hostile file would be)."""
    proto = _proto()
    t = proto.graph.initializer[0]
    t.ClearField("raw_data")
    t.ClearField("float_data")
    t.data_location = onnx.TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(W.nbytes if length is None else length))):
        e = t.external_data.add()
        e.key, e.value = k, v
    path = os.path.join(folder, "model.onnx")
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())
    return path


def _assert_refused(path, *words):
    with pytest.raises(ModelLoadError) as ei:
        qcompiler.load_model(path)
    msg = str(ei.value)
    assert "\n" not in msg, msg
    for w in ("'w'",) + words:
        assert w in msg, f"{w!r} not in {msg!r}"
    return msg


def test_location_with_dotdot_refused(tmp_path):
    inner = tmp_path / "models"
    inner.mkdir()
    (tmp_path / "x.bin").write_bytes(W.tobytes())
    msg = _assert_refused(_write_with_location(str(inner), "../x.bin"), "../x.bin")
    assert "outside" in msg


def test_absolute_location_refused(tmp_path):
    target = tmp_path / "x.bin"
    target.write_bytes(W.tobytes())
    inner = tmp_path / "models"
    inner.mkdir()
    _assert_refused(_write_with_location(str(inner), str(target)), str(target), "absolute")


def test_symlink_pointing_out_refused(tmp_path):
    outside = tmp_path / "secret.bin"
    outside.write_bytes(W.tobytes())
    inner = tmp_path / "models"
    inner.mkdir()
    os.symlink(outside, inner / "w.bin")
    msg = _assert_refused(_write_with_location(str(inner), "w.bin"), "w.bin")
    assert "outside" in msg


def test_symlink_inside_the_folder_allowed(tmp_path):
    (tmp_path / "real.bin").write_bytes(W.tobytes())
    os.symlink(tmp_path / "real.bin", tmp_path / "w.bin")
    model = qcompiler.load_model(_write_with_location(str(tmp_path), "w.bin"))
    np.testing.assert_array_equal(model.graph.value("w").const_value(), W)


@pytest.mark.parametrize("offset,length", [(0, W.nbytes + 4), (8, W.nbytes), (W.nbytes * 2, 4)],
                         ids=["length-past-end", "offset-plus-length-past-end", "offset-past-end"])
def test_range_past_the_end_refused(tmp_path, offset, length):
    (tmp_path / "w.bin").write_bytes(W.tobytes())
    _assert_refused(_write_with_location(str(tmp_path), "w.bin", offset, length), "w.bin", "exceeds")


def test_missing_external_file_refused(tmp_path):
    _assert_refused(_write_with_location(str(tmp_path), "nowhere.bin"), "nowhere.bin", "not found")
