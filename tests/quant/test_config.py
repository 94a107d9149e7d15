"""Quantization config: AIMET quantsim JSON, our YAML/JSON format, per-node resolution, strict parsing."""
import json
from types import SimpleNamespace

import pytest

from qcompiler.errors import ConfigError
from qcompiler.quant.settings.config import load_config, parse_config

AIMET = {
    "defaults": {"ops": {"is_output_quantized": "True"},
                 "params": {"is_quantized": "True", "is_symmetric": "True"},
                 "strict_symmetric": "False", "unsigned_symmetric": "True", "per_channel_quantization": "True",
                 "hw_version": "V73"},
    "params": {"bias": {"is_quantized": "False"}},
    "op_type": {"Squeeze": {"is_output_quantized": "False"},
                "Gemm": {"per_channel_quantization": "False"},
                "Softmax": {"encoding_constraints": {"min": -5.0, "max": 5.0}},
                "Conv": {"is_input_quantized": "True", "params": {"weight": {"is_symmetric": "False"}}}},
    "supergroups": [{"op_list": ["Conv", "Relu"]}, {"op_list": ["Gemm", "Relu"]}],
    "model_input": {"is_input_quantized": "True"},
    "model_output": {},
}

OURS = """
target: ort_cpu
scheme: post_training_tf
weights: {bits: 8, symmetric: true, per_channel: true}
activations: {bits: 8, symmetric: false}
bias: {bits: 32}
rules:
  - match: {op_type: [Softmax]}
    activations: {bits: 16}
  - match: {regex: "^/encoder/layer\\\\.0/"}
    keep_float: true
  - match: {name: conv_3}
    weights: {bits: 4, per_block: 32}
  - match: {op_type: Softmax, name: [sm_2]}
    precision: float16
supergroups: [layernorm, gelu]
"""


def node(op, name=""):
    return SimpleNamespace(op_type=op, name=name)


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_aimet_config(tmp_path):
    cfg = load_config(_write(tmp_path, "q.json", json.dumps(AIMET)))
    assert cfg.format == "aimet" and cfg.hw_version == "V73" and cfg.unsigned_symmetric
    # read but not applied, and said so (tests/quant/test_config_fields.py)
    assert [w["value"] for w in cfg.warnings] == ["op_type.Conv.is_input_quantized", "supergroups"]
    assert cfg.supergroups == [["Conv", "Relu"], ["Gemm", "Relu"]] and cfg.model_input_quantized
    add = cfg.settings_for(node("Add"))
    assert add.output_quantized and add.weight_per_channel and add.weight_symmetric
    assert not add.bias_quantized
    assert not cfg.settings_for(node("Squeeze")).output_quantized
    assert not cfg.settings_for(node("Gemm")).weight_per_channel
    sm = cfg.settings_for(node("Softmax"))
    assert (sm.encoding_min, sm.encoding_max) == (-5.0, 5.0)
    conv = cfg.settings_for(node("Conv"))
    assert not conv.weight_symmetric


def test_aimet_unknown_keys_warn_and_bad_values_fail(tmp_path):
    d = json.loads(json.dumps(AIMET))
    d["extra_top"] = 1
    d["op_type"]["Add"] = {"is_output_quantized": "True", "whatever": "x"}
    cfg = parse_config(d, "q.json")
    assert {"extra_top", "op_type.Add.whatever"} <= {w["value"] for w in cfg.warnings}
    d["op_type"]["Add"] = {"is_output_quantized": "yes"}
    with pytest.raises(ConfigError, match="q.json: op_type.Add.is_output_quantized: expected true/false"):
        parse_config(d, "q.json")
    partial = {k: v for k, v in AIMET.items() if k != "model_output"}
    with pytest.raises(ConfigError, match="lacks required key 'model_output'"):
        parse_config(partial, "q.json")


def test_duplicate_keys_rejected(tmp_path):
    p = _write(tmp_path, "dup.json", '{"defaults": {"ops": {}, "ops": {}}}')
    with pytest.raises(ConfigError, match="dup.json: duplicate key 'ops'"):
        load_config(p)
    p = _write(tmp_path, "dup.yaml", "weights: {bits: 8}\nactivations: {bits: 8}\nweights: {bits: 4}\n")
    with pytest.raises(ConfigError, match="dup.yaml: duplicate key 'weights'"):
        load_config(p)
    p = _write(tmp_path, "dup2.yaml", "rules:\n  - match: {name: a}\n    match: {name: b}\n")
    with pytest.raises(ConfigError, match="duplicate key 'match'"):
        load_config(p)


def test_our_format_resolution(tmp_path):
    cfg = load_config(_write(tmp_path, "q.yaml", OURS))
    assert cfg.format == "qcompiler" and cfg.target == "ort_cpu" and cfg.scheme == "min_max"
    assert cfg.supergroups == ["layernorm", "gelu"]
    plain = cfg.settings_for(node("Conv", "conv_1"))
    assert (plain.weight_bits, plain.act_bits, plain.bias_bits, plain.precision) == (8, 8, 32, "int")
    assert plain.weight_block is None and not plain.keep_float
    sm = cfg.settings_for(node("Softmax", "sm_1"))
    assert sm.act_bits == 16 and sm.matched_rules == (0,)
    enc = cfg.settings_for(node("MatMul", "/encoder/layer.0/attn/MatMul"))
    assert enc.keep_float and enc.precision == "float32"
    assert not cfg.settings_for(node("MatMul", "/encoder/layer.01/MatMul")).keep_float
    c3 = cfg.settings_for(node("Conv", "conv_3"))
    assert (c3.weight_bits, c3.weight_block, c3.weight_symmetric) == (4, 32, True)
    sm2 = cfg.settings_for(node("Softmax", "sm_2"))  # later rule overrides earlier ones
    assert sm2.precision == "float16" and sm2.act_bits == 16 and sm2.matched_rules == (0, 3)


@pytest.mark.parametrize("text, match", [
    ("weigths: {bits: 8}\n", "unknown key 'weigths'"),
    ("weights: {bitz: 8}\n", "weights.bitz: unknown key 'bitz'"),
    ("weights: {bits: 99}\n", "weights.bits: bit width must be one of 4, 8, 16, got 99"),
    ("weights: {symmetric: maybe}\n", "weights.symmetric: expected true/false"),
    ("scheme: magic\n", "unknown scheme 'magic'"),
    ("rules:\n  - match: {op_typ: Conv}\n", r"rules\[0\].match.op_typ: unknown key"),
    ("rules:\n  - match: {op_type: Conv}\n    keepfloat: true\n", r"rules\[0\].keepfloat: unknown key"),
    ("rules:\n  - match: {regex: '('}\n", "invalid regular expression"),
    ("rules:\n  - match: {}\n", "needs at least one of"),
    ("rules:\n  - match: {name: a}\n    precision: int4\n", "unknown precision"),
    ("rules:\n  - match: {name: a}\n    weights: {per_block: -3}\n", "per_block must be a positive"),
    ("supergroups: 3\n", "supergroups: expected true/false"),
    ("- a\n- b\n", "config must be a mapping"),
    ("weights: [\n", "invalid YAML"),
    ("x: !!python/object/apply:os.system ['echo hi']\n", "q.yaml"),
])
def test_our_format_errors_name_file_and_key(tmp_path, text, match):
    with pytest.raises(ConfigError, match=match) as ei:
        load_config(_write(tmp_path, "q.yaml", text))
    assert "q.yaml" in str(ei.value) and "\n" not in str(ei.value)


def test_json_in_our_format_and_empty_file(tmp_path):
    cfg = load_config(_write(tmp_path, "ours.json", json.dumps({"activations": {"bits": 16}})))
    assert cfg.settings_for(node("Add")).act_bits == 16
    cfg = load_config(_write(tmp_path, "empty.yaml", ""))
    assert cfg.settings_for(node("Add")).act_bits == 8
    with pytest.raises(ConfigError, match="missing.yaml: no such file"):
        load_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="bad.json: invalid JSON at line 1"):
        load_config(_write(tmp_path, "bad.json", "{"))
