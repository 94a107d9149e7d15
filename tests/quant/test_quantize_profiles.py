"""Backend profiles are data read by generic code: per-channel axes by op, target-specific grids, and the CLI."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper

from qcompiler.quant.api import quantize
from qcompiler.quant.targets.profiles import PROFILES, get_profile
from tests.helpers import make_model, run, sqnr_db, tinfo
from tests.quant.test_quantize_fieldnotes import axis_of, check_runs_and_sqnr, init, samples


def _axes_model():
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("ConvTranspose", ["x", "wt"], ["ct"], group=2, strides=[2, 2]),
             helper.make_node("Relu", ["ct"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("MatMul", ["f", "wm"], ["m"]),
             helper.make_node("Gemm", ["m", "wg"], ["y"], transB=0)]
    inits = [init("wt", rng.normal(0, 0.3, (4, 3, 2, 2)).astype(np.float32)),     # [Cin, Cout/g, kh, kw]
             init("wm", rng.normal(0, 0.1, (6 * 4 * 4, 5)).astype(np.float32)),
             init("wg", rng.normal(0, 0.3, (5, 3)).astype(np.float32))]
    return make_model(nodes, [tinfo("x", [1, 4, 2, 2])], [tinfo("y", [1, 3])], inits)


def test_per_channel_axis_by_op():
    proto = _axes_model()
    # explicit weight DQ: ort_cpu would store the ConvTranspose weight prefolded (no integer kernel in ORT)
    # (and every weight quantized: balanced leaves a float kernel's weights exact float)
    res = quantize(proto, samples([1, 4, 2, 2]), target={"base": "ort_cpu", "prefold_unfused_weight_dq": False},
                   optimize="accuracy")
    q = check_runs_and_sqnr(proto, res, samples([1, 4, 2, 2], 3))
    dq = {n.input[0].split("_quantized")[0]: n for n in q.graph.node
          if n.op_type == "DequantizeLinear" and "_quantized" in n.input[0]}
    assert axis_of(dq["wt"]) == 1          # ConvTranspose: output channels on axis 1 (with groups)
    assert axis_of(dq["wm"]) == 1          # MatMul: last axis
    assert axis_of(dq["wg"]) == 1          # Gemm transB=0: axis 1


def test_trt_profile_uses_int8_symmetric_activations_and_float_bias():
    proto = _axes_model()
    res = quantize(proto, samples([1, 4, 2, 2]), target="trt")
    check_runs_and_sqnr(proto, res, samples([1, 4, 2, 2], 3))
    for enc in res.encodings["activations"].values():
        assert enc.signed and enc.symmetric and int(np.asarray(enc.zero_point)) == 0


def test_qnn_profile_leaves_data_movement_outputs_unquantized():
    proto = _axes_model()
    res = quantize(proto, samples([1, 4, 2, 2]), target="qnn_htp")
    check_runs_and_sqnr(proto, res, samples([1, 4, 2, 2], 3))
    assert "f" not in res.encodings["activations"]                 # Flatten output
    assert "data-movement" in res.report["left_float"]["f"]
    # Gemm/MatMul per-tensor on HTP, Conv-like per-channel
    assert res.encodings["params"]["wm"].axis is None
    assert res.encodings["params"]["wt"].axis == 1


def test_profiles_are_plain_data():
    for name in PROFILES:
        json.dumps(PROFILES[name])                                   # no code inside
        p = get_profile(name).to_dict()                              # typed, and plain data again
        json.dumps(p)
        assert {"activation", "weight", "weights", "shares_input_encoding", "fixed_output_range"} <= set(p)


def test_cli_quantize_writes_model_encodings_and_report(tmp_path):
    from qcompiler.cli import main
    from qcompiler.cli_quantize import quantize_cmd
    if "quantize" not in main.commands:
        main.add_command(quantize_cmd)
    proto = _axes_model()
    mpath, cpath = tmp_path / "m.onnx", tmp_path / "calib.npz"
    onnx.save(proto, str(mpath))
    np.savez(cpath, x=np.stack([s["x"] for s in samples([1, 4, 2, 2])]))   # (N, 1, 4, 2, 2): own batch dim
    out, enc, rep = tmp_path / "q.onnx", tmp_path / "e.json", tmp_path / "r.json"
    r = CliRunner().invoke(main, ["quantize", str(mpath), "--calib", str(cpath), "-o", str(out), "--encodings",
                                  str(enc), "--encodings-version", "2.0.0", "--report", str(rep)])
    assert r.exit_code == 0, r.output
    assert json.load(open(enc))["version"] == "2.0.0"
    assert "output_sqnr_db" in json.load(open(rep))
    feed = samples([1, 4, 2, 2], 1)[0]
    assert sqnr_db(run(proto, feed)[0], run(onnx.load(str(out)), feed)[0]) > 25
    bad = CliRunner().invoke(main, ["quantize", str(mpath), "--calib", str(tmp_path / "none.npz"), "-o", str(out)])
    assert bad.exit_code == 2 and "none.npz" in bad.output


def test_profile_file_errors_are_one_line_config_errors(tmp_path):
    from qcompiler.errors import ConfigError
    bad = tmp_path / "bad.yaml"
    bad.write_text("base: ort_cpu\nweight: {symmetric: [\n")
    with pytest.raises(ConfigError, match="bad.yaml': invalid YAML"):
        get_profile(str(bad))
    typo = tmp_path / "typo.yaml"
    typo.write_text("base: ort_cpu\nweigth_bits: 4\n")
    with pytest.raises(ConfigError, match="unknown key\\(s\\) weigth_bits"):
        get_profile(str(typo))
    with pytest.raises(ConfigError, match="unknown base 'gpu'"):
        get_profile({"base": "gpu"})
    with pytest.raises(ConfigError, match="no such file"):
        get_profile(str(tmp_path / "missing.yaml"))
    ok = tmp_path / "ok.yaml"
    ok.write_text("base: trt\n")
    assert get_profile(str(ok)).name == "trt+custom"


def test_profile_is_a_typed_frozen_object():
    import dataclasses
    from qcompiler.quant.targets.profiles import Grid, KernelRule, Profile
    p = get_profile("ort_cpu")
    assert isinstance(p, Profile) and p.name == "ort_cpu"
    assert p.activation == Grid(8, False) and p.weight == Grid(8, True, 7)
    assert p.integer_weight_kernels["Conv"] == KernelRule(act_bits=8, output_q=True)
    assert ("Conv", "Relu") in p.fused_activations and "Reshape" in p.shares_input_encoding
    assert get_profile("trt").wide_activation_bits is None and not get_profile("trt").prefold_unfused_weight_dq
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.name = "x"
    custom = get_profile({"base": "qnn_htp", "wide_activation_bits": None})
    assert custom.name == "qnn_htp+custom" and custom.wide_activation_bits is None
