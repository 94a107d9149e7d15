"""Hostile AIMET encodings files: each is one line naming the file and entry, exit 2.

Counts and axes are checked against the model's weights before use (encodings_io.fit_param_encoding, called
from freeze.freeze_encodings); bit widths and dtypes against bitwidths.py; files are opened through input_files.py.
"""
import copy
import json
import os
import subprocess

import numpy as np
import onnx
import pytest

from qcompiler.errors import ConfigError
from qcompiler.quant.api import quantize
from qcompiler.quant.core.encoding import Encoding
from qcompiler.quant.interop.encodings_io import fit_param_encoding

from ..helpers import run
from .hostile_common import assert_one_line, quantize_cli, run_cli_subprocess, sha, tiny_cnn


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    d = tmp_path_factory.mktemp("enc")
    model, calib = tiny_cnn(str(d))
    res = quantize(model, calib, limit=2)
    return {"dir": d, "model": model, "calib": calib, "v1": res.write_encodings(None, "1.0.0"),
            "v2": res.write_encodings(None, "2.0.0")}


def _entry(doc, name):
    for key in ("param_encodings", "activation_encodings", "encodings"):
        for e in doc.get(key, []):
            if e["name"] == name:
                return e
    raise KeyError(name)


def _run(base, tmp_path, doc, *needles, raw=None):
    path = tmp_path / "bad.encodings"
    path.write_text(raw if raw is not None else json.dumps(doc))
    before = (sha(base["model"]), sha(base["calib"]), sha(path))
    line = assert_one_line(quantize_cli(base["model"], base["calib"], tmp_path / "out.onnx", "--load-encodings",
                                        path), "bad.encodings", *needles)
    assert (sha(base["model"]), sha(base["calib"]), sha(path)) == before
    assert not (tmp_path / "out.onnx").exists()
    return line


def _v1(base, name, **changes):
    doc = copy.deepcopy(base["v1"])
    _entry(doc, name).update(changes)
    return doc


def _v2(base, name, **changes):
    doc = copy.deepcopy(base["v2"])
    _entry(doc, name).update(changes)
    return doc


def test_good_files_still_load(base, tmp_path):
    for v in ("v1", "v2"):
        path = tmp_path / f"{v}.encodings"
        path.write_text(json.dumps(base[v]))
        out = tmp_path / f"{v}.onnx"
        code, lines = quantize_cli(base["model"], base["calib"], out, "--load-encodings", path)
        assert code == 0, lines
        feed = {"image": np.random.default_rng(1).random((1, 3, 16, 16)).astype(np.float32)}
        assert np.all(np.isfinite(run(onnx.load(str(out)), feed)[0]))


def test_float16_entry_leaves_the_tensor_float(base, tmp_path):
    doc = copy.deepcopy(base["v2"])
    e = _entry(doc, "r1")
    e.clear()
    e.update({"name": "r1", "output_dtype": "float16"})
    path = tmp_path / "f16.encodings"
    path.write_text(json.dumps(doc))
    res = quantize(base["model"], base["calib"], limit=2, load_encodings=str(path))
    # no quantizer on r1; its FLOAT encoding is kept, so a file written from the result says float16 again
    assert res.encodings["activations"]["r1"].dtype == "float"
    assert not any(n.op_type == "QuantizeLinear" and n.inputs[0].name == "r1" for n in res.model.graph.nodes)
    assert {"name": "r1", "output_dtype": "float16"} in res.write_encodings(None, "2.0.0")["encodings"]


@pytest.mark.parametrize("bw", [33, 64, 2, 0, True, "8"])
def test_v1_bit_width_outside_the_table(base, tmp_path, bw):
    _run(base, tmp_path, _v1(base, "w1", bw=bw), "'w1'", "bit width")


def test_v1_float8_and_unknown_dtype(base, tmp_path):
    _run(base, tmp_path, _v1(base, "w1", dtype="FLOAT", bw=8), "'w1'", "FLOAT")
    _run(base, tmp_path, _v1(base, "w1", dtype="FP8"), "'w1'", "dtype must be INT or FLOAT")


def test_v1_int32_activation_refused_against_the_model(base, tmp_path):
    line = _run(base, tmp_path, _v1(base, "r1", bw=32), "'r1'", "32-bit grid for an activation")
    assert "4, 8, 16" in line


def test_v1_channel_count_mismatch(base, tmp_path):
    e = _entry(base["v1"], "w1")
    _run(base, tmp_path, _v1(base, "w1", scale=e["scale"][:7], offset=e["offset"][:7]), "'w1'",
         "7 scales but the weight has 8 channels")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -0.5])
def test_v1_bad_scales(base, tmp_path, bad):
    e = _entry(base["v1"], "w1")
    _run(base, tmp_path, _v1(base, "w1", scale=[bad] + e["scale"][1:]), "'w1'", "scale must be finite, positive")


def test_v1_offset_outside_the_grid(base, tmp_path):
    _run(base, tmp_path, _v1(base, "r1", offset=[300]), "'r1'", "offset outside the 8-bit grid")
    _run(base, tmp_path, _v1(base, "r1", offset=[2 ** 70]), "'r1'", "offset")


def test_v1_per_block_absurd_block_size(base, tmp_path):
    e = _entry(base["v1"], "fc_w")
    _run(base, tmp_path, _v1(base, "fc_w", enc_type="PER_BLOCK", block_size=2 ** 40, scale=e["scale"],
                             offset=e["offset"]), "'fc_w'", "block_size 1099511627776 is larger than dim")


def test_v1_activation_with_several_scales(base, tmp_path):
    _run(base, tmp_path, _v1(base, "r1", enc_type="PER_CHANNEL", scale=[0.1, 0.2, 0.3], offset=[0, 0, 0]),
         "'r1'", "per tensor")


@pytest.mark.parametrize("axis", [99, -7, 2])
def test_v2_axis_out_of_range(base, tmp_path, axis):
    _run(base, tmp_path, _v2(base, "fc_w", axis=axis), "'fc_w'", f"axis {axis} is out of range")


@pytest.mark.parametrize("od", ["int64", "int33", "uint32", "float8e4m3fn", "bfloat16", "int", "complex64"])
def test_v2_unsupported_output_dtype(base, tmp_path, od):
    if od == "uint32":   # a 32-bit integer grid is read (biases) but refused for a weight
        _run(base, tmp_path, _v2(base, "fc_w", output_dtype="int32"), "'fc_w'", "32-bit grid for a weight")
        return
    _run(base, tmp_path, _v2(base, "fc_w", output_dtype=od), "'fc_w'", "is not supported")


def test_v2_block_size_does_not_fit_the_scales(base, tmp_path):
    _run(base, tmp_path, _v2(base, "fc_w", block_size=3), "'fc_w'", "do not fit block_size 3")
    _run(base, tmp_path, _v2(base, "fc_w", block_size=2 ** 40), "'fc_w'", "larger than dim")


def test_v2_zero_point_outside_the_dtype(base, tmp_path):
    _run(base, tmp_path, _v2(base, "r1", y_zero_point=1000), "'r1'", "y_zero_point outside the uint8 range")


def test_numbers_python_cannot_build(base, tmp_path):
    _run(base, tmp_path, None, "invalid JSON value", raw='{"version": "1.0.0", "activation_encodings": [{"name": '
         '"r1", "bw": ' + "9" * 5000 + '}], "param_encodings": []}')
    e = _entry(base["v1"], "w1")
    _run(base, tmp_path, _v1(base, "w1", scale=[10 ** 400] + e["scale"][1:]), "'w1'", "scale")


def test_legacy_bit_width(base, tmp_path):
    doc = {"activation_encodings": {"r1": [{"bitwidth": 64, "scale": 0.1, "offset": 0, "is_symmetric": "False"}]},
           "param_encodings": {}}
    _run(base, tmp_path, doc, "'r1'", "bit width 64")


def test_long_names_and_values_are_cut(base, tmp_path):
    doc = _v1(base, "w1", bw="x" * 100000)
    line = _run(base, tmp_path, doc, "'w1'")
    assert len(line) < 400
    doc = {"version": "1.0.0", "activation_encodings": [{"name": "n" * 100000, "bw": 64}], "param_encodings": []}
    assert len(_run(base, tmp_path, doc, "nnnn")) < 400


def test_fit_param_encoding_directly():
    # ceil(10 / 4) = 3 blocks per column (a partial last block, as ONNX DequantizeLinear's block_size allows)
    enc = Encoding(scale=np.full(6, 0.1, np.float32), zero_point=np.zeros(6, np.int64), bits=4, signed=True,
                   axis=0, block_size=4)
    assert fit_param_encoding("e.json", "w", enc, (10, 2), None).scale.shape == (3, 2)
    enc = Encoding(scale=np.full(8, 0.1, np.float32), zero_point=np.zeros(8, np.int64), axis=0,
                   meta={"axis_known": False})
    assert fit_param_encoding("e.json", "w", enc, (4, 8), 1).axis == 1      # 1.0.0: the placement's axis
    with pytest.raises(ConfigError):
        fit_param_encoding("e.json", "w", Encoding(scale=np.full(6, 0.1, np.float32),
                                                   zero_point=np.zeros(6, np.int64), axis=0, block_size=4),
                           (10, 3), None)


def test_dev_zero_folder_oversize(base, tmp_path):
    for path, needle in (("/dev/zero", "is a device"), (str(tmp_path), "folder")):
        assert_one_line(quantize_cli(base["model"], base["calib"], tmp_path / "o.onnx", "--load-encodings", path),
                        path, needle)
    big = tmp_path / "big.encodings"
    with open(big, "wb") as f:
        f.truncate((512 << 20) + 1)    # sparse: no disk used, refused from its size alone
    assert_one_line(quantize_cli(base["model"], base["calib"], tmp_path / "o.onnx", "--load-encodings", big),
                    "big.encodings", "limit")


def test_fifo_does_not_hang(base, tmp_path):
    fifo = tmp_path / "e.fifo"
    os.mkfifo(fifo)
    try:
        code, _, err = run_cli_subprocess(["quantize", base["model"], "--calib", base["calib"], "-o",
                                           tmp_path / "o.onnx", "--load-encodings", fifo], timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("quantize hung on a FIFO as --load-encodings")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "FIFO" in lines[0] and "e.fifo" in lines[0], err


def test_int16_entry_on_a_target_left_at_opset_13(base, tmp_path):
    doc = copy.deepcopy(base["v2"])
    e = _entry(doc, "r1")
    e.update({"output_dtype": "uint16", "y_zero_point": 100})
    path = tmp_path / "bad.encodings"
    path.write_text(json.dumps(doc))
    code, lines = quantize_cli(base["model"], base["calib"], tmp_path / "o.onnx", "--load-encodings", path,
                               "--target", "trt")
    if code == 0:       # the opset was raised for this target: the model must run
        feed = {"image": np.zeros((1, 3, 16, 16), np.float32)}
        assert np.all(np.isfinite(run(onnx.load(str(tmp_path / "o.onnx")), feed)[0]))
    else:
        assert_one_line((code, lines), "bad.encodings", "opset")
