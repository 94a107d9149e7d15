"""AIMET encodings files: 1.0.0 and 2.0.0 round trips (per-tensor, per-channel, signed, unsigned), legacy, errors."""
import json

import numpy as np
import pytest

from qcompiler.errors import ConfigError
from qcompiler.quant.core.encoding import compute_encoding, quantize_dequantize
from qcompiler.quant.interop.encodings_io import read_encodings, write_encodings


def _encs():
    acts = {"act_u8": compute_encoding(-0.7, 3.1, bits=8),                          # unsigned asymmetric
            "act_u16": compute_encoding(-2.0, 5.0, bits=16)}
    params = {"w_pt": compute_encoding(-1.0, 0.8, bits=8, symmetric=True),          # signed symmetric
              "w_pc": compute_encoding(np.array([-1.0, -0.2, -3.0]), np.array([0.5, 0.4, 2.0]), bits=8,
                                       symmetric=True, axis=0),
              "w4_pc": compute_encoding(np.array([-1.0, -2.0]), np.array([1.0, 0.5]), bits=4, symmetric=True,
                                        axis=1)}
    return acts, params


def _same(a, b, check_axis=True):
    assert a.bits == b.bits and a.signed == b.signed and a.symmetric == b.symmetric
    np.testing.assert_allclose(np.asarray(b.scale), np.asarray(a.scale), rtol=1e-7)
    np.testing.assert_array_equal(np.asarray(b.zero_point), np.asarray(a.zero_point))
    assert np.shape(a.scale) == np.shape(b.scale)
    if check_axis:
        assert a.axis == b.axis
    assert b.frozen


@pytest.mark.parametrize("version", ["1.0.0", "2.0.0"])
def test_round_trip(tmp_path, version):
    acts, params = _encs()
    path = str(tmp_path / "m.encodings")
    doc = write_encodings(path, acts, params, version=version, quantizer_args={"activation_bitwidth": 8})
    assert json.load(open(path)) == doc and doc["version"] == version
    ra, rp = read_encodings(path, param_names=params)
    assert set(ra) == set(acts) and set(rp) == set(params)
    for d, r in ((acts, ra), (params, rp)):
        for k in d:
            # 1.0.0 has no axis field: per-channel axes come back as 0 with meta axis_known False
            _same(d[k], r[k], check_axis=version == "2.0.0" or not d[k].per_channel)
    if version == "1.0.0":
        assert rp["w4_pc"].axis == 0 and rp["w4_pc"].meta["axis_known"] is False
    x = np.linspace(-4, 4, 101, dtype=np.float32)
    np.testing.assert_array_equal(quantize_dequantize(x, ra["act_u8"]), quantize_dequantize(x, acts["act_u8"]))


def test_v1_fields_match_aimet_convention():
    acts, params = _encs()
    doc = write_encodings(None, acts, params, version="1.0.0", excluded_layers=["n1"])
    assert set(doc) == {"version", "activation_encodings", "param_encodings", "quantizer_args", "excluded_layers"}
    w = {e["name"]: e for e in doc["param_encodings"]}
    assert w["w_pt"]["enc_type"] == "PER_TENSOR" and w["w_pt"]["offset"] == [-128] and w["w_pt"]["is_sym"]
    assert w["w_pc"]["enc_type"] == "PER_CHANNEL" and len(w["w_pc"]["scale"]) == 3 and w["w_pc"]["dtype"] == "INT"
    a = {e["name"]: e for e in doc["activation_encodings"]}["act_u8"]
    enc = acts["act_u8"]
    # AIMET: real = (q + offset) * scale on the unsigned grid
    assert a["offset"] == [-int(enc.zero_point)] and a["bw"] == 8 and not a["is_sym"]
    assert np.isclose((0 + a["offset"][0]) * a["scale"][0], float(enc.min))


def test_v2_fields_align_with_quantize_linear():
    acts, params = _encs()
    doc = write_encodings(None, acts, params, version="2.0.0")
    e = {x["name"]: x for x in doc["encodings"]}
    assert e["act_u8"]["output_dtype"] == "uint8" and e["act_u8"]["y_zero_point"] == int(acts["act_u8"].zero_point)
    assert e["w_pt"]["output_dtype"] == "int8" and "y_zero_point" not in e["w_pt"] and "axis" not in e["w_pt"]
    assert e["w_pc"]["axis"] == 0 and len(e["w_pc"]["y_scale"]) == 3
    assert e["w4_pc"]["output_dtype"] == "int4" and e["w4_pc"]["axis"] == 1
    assert e["act_u16"]["output_dtype"] == "uint16"


def test_legacy_061(tmp_path):
    doc = {"version": "0.6.1",
           "activation_encodings": {"a": [{"bitwidth": 8, "scale": 0.01, "offset": -20, "is_symmetric": "False",
                                           "dtype": "int", "min": -0.2, "max": 2.35}]},
           "param_encodings": {"w": [{"bitwidth": 8, "scale": 0.1, "offset": -128, "is_symmetric": "True",
                                      "dtype": "int"},
                                     {"bitwidth": 8, "scale": 0.2, "offset": -128, "is_symmetric": "True",
                                      "dtype": "int"}]}}
    p = tmp_path / "legacy.encodings"
    p.write_text(json.dumps(doc))
    a, w = read_encodings(str(p))
    assert int(a["a"].zero_point) == 20 and not a["a"].signed and a["a"].frozen
    assert np.isclose(float(a["a"].min), -0.2)
    assert w["w"].signed and w["w"].per_channel and list(w["w"].zero_point) == [0, 0]


@pytest.mark.parametrize("doc, match", [
    ({"version": "1.0.0", "activation_encodings": [{"name": "a", "enc_type": "PER_TENSOR", "dtype": "INT",
                                                    "bw": 8, "is_sym": False, "scale": [-1.0], "offset": [0]}],
      "param_encodings": []}, "encoding 'a': scale must be finite, positive"),
    ({"version": "1.0.0", "activation_encodings": [{"name": "a", "bw": 8, "dtype": "INT"}], "param_encodings": []},
     "encoding 'a': missing 'scale'"),
    ({"version": "1.0.0", "activation_encodings": [{"bw": 8}], "param_encodings": []}, "without a string 'name'"),
    ({"version": "2.0.0", "encodings": [{"name": "t", "output_dtype": "int8", "y_scale": [0.1, 0.2]}]},
     "encoding 't': several scales but no 'axis'"),
    ({"version": "2.0.0", "encodings": [{"name": "t", "output_dtype": "qint7", "y_scale": 0.1}]},
     "encoding 't': output_dtype 'qint7'"),
    ({"version": "2.0.0", "encodings": [{"name": "t", "output_dtype": "int8", "y_scale": 0.1,
                                         "y_zero_point": 300}]}, "y_zero_point outside"),
    ({"version": "9.9.9", "activation_encodings": []}, "version '9.9.9' is not supported"),
    ({"hello": 1}, "not an AIMET encodings file"),
])
def test_malformed_files(tmp_path, doc, match):
    p = tmp_path / "bad.encodings"
    p.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=match) as ei:
        read_encodings(str(p))
    assert "bad.encodings" in str(ei.value)


def test_duplicate_json_key_and_garbage(tmp_path):
    p = tmp_path / "dup.encodings"
    p.write_text('{"version": "2.0.0", "encodings": [], "encodings": []}')
    with pytest.raises(ConfigError, match="duplicate key 'encodings'"):
        read_encodings(str(p))
    p.write_bytes(b"\x89PNG\x00\x01")
    with pytest.raises(ConfigError, match="dup.encodings"):
        read_encodings(str(p))


def test_v2_entry_drives_onnx_qdq_like_our_reference():
    """y_scale / y_zero_point / output_dtype plug into QuantizeLinear as is (onnxruntime vs numpy reference)."""
    from onnx import helper, numpy_helper

    from tests.helpers import make_model, run, tinfo
    enc = compute_encoding(-0.7, 3.1, bits=8)
    e = write_encodings(None, {"x": enc}, {}, version="2.0.0")["encodings"][0]
    zp = np.array(e.get("y_zero_point", 0), dtype={"uint8": np.uint8, "int8": np.int8}[e["output_dtype"]])
    inits = [numpy_helper.from_array(np.array(e["y_scale"], np.float32), "s"), numpy_helper.from_array(zp, "z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    m = make_model(nodes, [tinfo("x", [101])], [tinfo("y", [101])], inits)
    x = np.linspace(-4, 4, 101, dtype=np.float32)
    np.testing.assert_allclose(run(m, {"x": x})[0], quantize_dequantize(x, enc), atol=1e-6)
