"""A calibration .npz whose member inflates hundreds of times over (a zip bomb: 80 MB of zeros in ~80 kB) is
one exit-2 line naming the member, before any sample is read; a real compressed calibration file still reads."""
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper


def _model(path):
    w = np.ones((16, 4), np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, ["n", 16])],
                          [helper.make_tensor_value_info("y", T.FLOAT, ["n", 4])], [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.save(m, str(path))


def _quantize(tmp_path, calib):
    return subprocess.run([sys.executable, "-m", "qcompiler", "quantize", str(tmp_path / "m.onnx"), "--calib",
                           str(calib), "-o", str(tmp_path / "q.onnx")], capture_output=True, text=True, timeout=300)


def test_zip_bomb_is_one_line(tmp_path):
    _model(tmp_path / "m.onnx")
    np.savez_compressed(tmp_path / "bomb.npz", x=np.zeros((80 << 20) // 4, np.float32).reshape(-1, 1, 16))
    assert (tmp_path / "bomb.npz").stat().st_size < 1 << 20
    r = _quantize(tmp_path, tmp_path / "bomb.npz")
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "zip bomb" in lines[0] and "x.npy" in lines[0], r.stderr
    assert not (tmp_path / "q.onnx").exists()


def test_compressed_calibration_still_reads(tmp_path):
    _model(tmp_path / "m.onnx")
    np.savez_compressed(tmp_path / "c.npz", x=np.random.default_rng(0).standard_normal((32, 1, 16), np.float32))
    r = _quantize(tmp_path, tmp_path / "c.npz")
    assert r.returncode == 0, r.stderr
