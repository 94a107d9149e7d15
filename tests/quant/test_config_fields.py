"""no config field is parsed and then ignored. Every bit width in either config kind gets the
error `--weight-bits 2` gets; a setting qcompiler cannot honour is one ConfigError line saying it is not
supported; what AIMET's own configs carry and qcompiler reads but does not apply is a warning in the report and
on stderr (before, AIMET's warnings were collected and dropped)."""
import json

import pytest
from click.testing import CliRunner

from qcompiler.cli import main
from qcompiler.errors import ArgumentError, ConfigError
from qcompiler.quant import quantize
from qcompiler.quant.settings.config import QuantConfig, load_config, parse_config

BITS_2 = "bit width must be one of 4, 8, 16, got 2"


def aimet(**over):
    d = {"defaults": {"ops": {"is_output_quantized": "True"}, "params": {"is_quantized": "True"}},
         "params": {}, "op_type": {}, "supergroups": [], "model_input": {"is_input_quantized": "True"},
         "model_output": {}}
    for k, v in over.items():
        d[k] = v
    return d


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("name, text, where", [
    ("w.yaml", "weights: {bits: 2}\n", "weights.bits"),
    ("a.yaml", "activations: {bits: 2}\n", "activations.bits"),
    ("r.yaml", "rules:\n  - match: {op_type: Conv}\n    weights: {bits: 2}\n", "rules[0].weights.bits"),
    ("ra.yaml", "rules:\n  - match: {name: x}\n    activations: {bits: 2}\n", "rules[0].activations.bits"),
    ("w.json", json.dumps({"weights": {"bits": 2}}), "weights.bits"),
    ("k.json", json.dumps(aimet(defaults={"ops": {}, "params": {}, "supported_kernels": [
        {"activation": {"bitwidth": 8, "dtype": "int"}, "param": {"bitwidth": 2, "dtype": "int"}}]})),
     "defaults.supported_kernels[0].param.bitwidth"),
    ("o.json", json.dumps(aimet(op_type={"Conv": {"supported_kernels": [{"activation": {"bitwidth": 2}}]}})),
     "op_type.Conv.supported_kernels[0].activation.bitwidth"),
])
def test_bits_2_in_any_config_spelling_is_the_weight_bits_error(tmp_path, name, text, where):
    with pytest.raises(ArgumentError) as api:
        quantize("m.onnx", "c.npz", weight_bits=2)
    assert str(api.value) == f"weight_bits: {BITS_2}"
    with pytest.raises(ConfigError) as cfg:
        load_config(_write(tmp_path, name, text))
    assert str(cfg.value) == f"{tmp_path / name}: {where}: {BITS_2}"


def test_bits_2_from_the_cli_flag_and_from_a_config_exit_2_with_the_same_reason(tiny, tmp_path):
    m, c = str(tiny / "tiny_cnn.onnx"), str(tiny / "tiny_cnn_calib.npz")
    conf = _write(tmp_path, "c.yaml", "weights: {bits: 2}\n")
    lines = []
    for extra in (["--weight-bits", "2"], ["--config", conf]):
        r = CliRunner().invoke(main, ["quantize", m, "--calib", c, "-o", str(tmp_path / "o.onnx"), *extra])
        assert r.exit_code == 2, r.output
        lines.append(r.stderr.strip())
        assert len(lines[-1].splitlines()) == 1 and lines[-1].endswith(BITS_2)
    assert not (tmp_path / "o.onnx").exists()


@pytest.mark.parametrize("bad", ["2", 2.0, True, 32, "eight", None])
def test_other_bad_bit_values_are_refused_in_both_kinds(bad):
    with pytest.raises(ConfigError, match="weights.bits: bit width must be one of 4, 8, 16"):
        parse_config({"weights": {"bits": bad}}, "q.yaml")
    with pytest.raises(ConfigError, match=r"supported_kernels\[0\].param.bitwidth: bit width must be one of"):
        parse_config(aimet(defaults={"ops": {}, "supported_kernels": [{"param": {"bitwidth": bad}}]}), "q.json")


def test_float_kernels_take_float_widths_and_bias_only_32():
    cfg = parse_config(aimet(defaults={"ops": {}, "supported_kernels": [
        {"activation": {"bitwidth": 16, "dtype": "float"}, "param": {"bitwidth": 16, "dtype": "float"}}]}), "q.json")
    assert cfg.supported_kernels[0]["param"]["bitwidth"] == 16
    with pytest.raises(ConfigError, match="dtype: expected 'int' or 'float'"):
        parse_config(aimet(defaults={"ops": {}, "supported_kernels": [{"param": {"dtype": "fp8"}}]}), "q.json")
    with pytest.raises(ConfigError, match="bias.bits: bit width must be one of 32, got 8"):
        parse_config({"bias": {"bits": 8}}, "q.yaml")


@pytest.mark.parametrize("data, where, what", [
    ({"rules": [{"match": {"op_type": "Conv"}, "input_quantized": False}]}, "rules[0].input_quantized",
     "false is not supported: a node's inputs are quantized by their producers' output quantizers"),
    ({"model_output": {"quantized": False}}, "model_output.quantized", "false is not supported"),
    (aimet(defaults={"ops": {}, "strict_symmetric": "True"}), "defaults.strict_symmetric", "True is not supported"),
    (aimet(params={"bias": {"is_quantized": "True", "is_symmetric": "False"}}), "params.bias.is_symmetric",
     "False is not supported: biases are int32 on a symmetric grid"),
])
def test_settings_qcompiler_cannot_honour_are_one_config_error(data, where, what):
    with pytest.raises(ConfigError) as e:
        parse_config(data, "q.cfg")
    msg = str(e.value)
    assert msg.startswith(f"q.cfg: {where}: ") and what in msg and "\n" not in msg


def test_the_values_qcompiler_does_are_accepted_without_a_word():
    assert not parse_config({"model_output": {"quantized": True}, "model_input": {"quantized": False}},
                            "q.yaml").model_input_quantized
    cfg = parse_config(aimet(defaults={"ops": {"is_input_quantized": "False"}, "strict_symmetric": "False",
                                       "unsigned_symmetric": "True", "hw_version": "V73"},
                             params={"bias": {"is_symmetric": "True"}},
                             model_output={"is_output_quantized": "True"}), "q.json")
    assert cfg.warnings == [] and cfg.hw_version == "V73"


def test_aimet_settings_read_but_not_applied_are_warnings():
    cfg = parse_config(aimet(defaults={"ops": {"is_symmetric": "True", "is_input_quantized": "True"},
                                       "unsigned_symmetric": "True"},
                             op_type={"Gemm": {"is_input_quantized": "True"}},
                             supergroups=[{"op_list": ["Conv", "Relu"]}]), "q.json")
    got = {w["value"]: w["problem"] for w in cfg.warnings}
    assert set(got) == {"defaults.ops.is_input_quantized", "op_type.Gemm.is_input_quantized", "supergroups",
                        "defaults.unsigned_symmetric"}
    assert all(p.startswith("of q.json: ") and "not applied" in p for p in got.values())
    # without symmetric activations unsigned_symmetric changes nothing: no warning
    quiet = parse_config(aimet(defaults={"ops": {}, "unsigned_symmetric": "True"}), "q.json")
    assert quiet.warnings == []


def test_config_warnings_reach_the_report_and_stderr(tiny, tmp_path):
    m, c = str(tiny / "tiny_cnn.onnx"), str(tiny / "tiny_cnn_calib.npz")
    conf = _write(tmp_path, "a.json", json.dumps(aimet(op_type={"Conv": {"is_input_quantized": "True"}},
                                                       extra_top={"x": 1})))
    res = quantize(m, c, config=conf, min_sqnr=float("-inf"))
    values = [w["value"] for w in res.report["warnings"] if w["kind"] == "config key"]
    assert values == ["extra_top", "op_type.Conv.is_input_quantized"]
    r = CliRunner().invoke(main, ["quantize", m, "--calib", c, "-o", str(tmp_path / "o.onnx"), "--config", conf,
                                  "-q"])
    assert r.exit_code == 0, r.output
    assert f"qcompiler: warning: config key 'op_type.Conv.is_input_quantized' of {conf}: True is not applied" \
        in r.stderr


def test_every_parsed_field_is_one_placement_or_the_api_reads():
    """A guard against a field coming back dead: these are the QuantConfig fields, each read by quantize
    (target, scheme, supergroups, model_input_quantized, defaults/op_type/rules, warnings, weight_only: the
    api's resolve_early) or descriptive."""
    fields = set(QuantConfig.__dataclass_fields__)
    assert fields == {"source", "format", "target", "scheme", "defaults", "op_type", "rules", "supergroups",
                      "model_input_quantized", "unsigned_symmetric", "hw_version", "supported_kernels", "warnings",
                      "weight_only"}
