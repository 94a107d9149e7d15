"""Hostile configs and profiles: one line naming file and key, exit 2, bounded.

Configs and profiles are read through input_files.py (regular files, 16 MB), composed by untrusted.py's
bounded YAML loader (depth, nodes, alias expansion) or its JSON reader (depth), validated field by field
(bit widths from bitwidths.py, finite numbers), and rule regexes are RE2 (linear time).
"""
import json
import os
import subprocess
import time
from types import SimpleNamespace

import onnx
import pytest

from qcompiler.errors import ConfigError
from qcompiler.quant.core.bitwidths import INT_BITS
from qcompiler.quant.settings.config import load_config
from qcompiler.quant.targets.profiles import get_profile
from qcompiler.quant.settings.untrusted import short

from .hostile_common import assert_one_line, quantize_cli, run_cli_subprocess, sha, tiny_cnn

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [{', '.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")) + "rules: *i\n"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("cfg")
    return tiny_cnn(str(d))


def _cfg(tiny, tmp_path, text, name="c.yaml", *needles, flag="--config"):
    path = tmp_path / name
    path.write_text(text)
    before = (sha(tiny[0]), sha(tiny[1]), sha(path))
    line = assert_one_line(quantize_cli(tiny[0], tiny[1], tmp_path / "out.onnx", flag, path), name, *needles)
    assert (sha(tiny[0]), sha(tiny[1]), sha(path)) == before and not (tmp_path / "out.onnx").exists()
    return line


@pytest.mark.parametrize("text,needles", [
    ("activations: {bits: 32}\n", ("activations.bits", "one of 4, 8, 16", "32")),
    ("weights: {bits: 2}\n", ("weights.bits",)),
    ("bias: {bits: 16}\n", ("bias.bits", "one of 32")),
    ("activations: {bits: 8.0}\n", ("activations.bits",)),
    ("rules:\n  - match: {op_type: Relu}\n    activations: {bits: 64}\n", ("rules[0].activations.bits",)),
    ("rules:\n  - match: {op_type: Relu}\n    encoding_constraints: {min: .nan, max: 1}\n", ("min", "finite")),
    ("rules:\n  - match: {op_type: Relu}\n    encoding_constraints: {min: 0, max: .inf}\n", ("max", "finite")),
    ("rules:\n  - match: {op_type: Relu}\n    precision: [1]\n", ("rules[0].precision",)),
    ("rules: 5\n", ("rules",)),
    ("rules:\n  - match: {regex: '(a)\\1'}\n", ("rules[0].match.regex", "RE2")),
    ("rules:\n  - match: {regex: '(?=x)'}\n", ("rules[0].match.regex",)),
])
def test_our_config_fields(tiny, tmp_path, text, needles):
    _cfg(tiny, tmp_path, text, "c.yaml", *needles)


def test_values_python_cannot_build_are_one_line(tiny, tmp_path):
    _cfg(tiny, tmp_path, "activations: {bits: " + "9" * 5000 + "}\n", "c.yaml", "invalid YAML value")
    _cfg(tiny, tmp_path, '{"activations": {"bits": ' + "9" * 5000 + "}}", "c.json", "invalid JSON value")
    _cfg(tiny, tmp_path, "target: 2001-13-45\n", "c.yaml", "invalid YAML value")
    _cfg(tiny, tmp_path, "activations: {bits: " + "9" * 4000 + "}\n", "c.yaml", "an integer of")
    _cfg(tiny, tmp_path, "a: !!python/object/apply:os.system [echo hi]\n", "c.yaml", "invalid YAML")


def test_json_config_nan_and_inf_constraints(tiny, tmp_path):
    for bad in ("NaN", "Infinity", "-Infinity", "1e999"):
        text = '{"rules": [{"match": {"op_type": "Relu"}, "encoding_constraints": {"min": %s, "max": 1}}]}' % bad
        _cfg(tiny, tmp_path, text, "c.json", "encoding_constraints.min", "finite")
    aimet = {"defaults": {}, "params": {}, "op_type": {"Relu": {"encoding_constraints": {"min": 0,
             "max": float("nan")}}}, "supergroups": [], "model_input": {}, "model_output": {}}
    _cfg(tiny, tmp_path, json.dumps(aimet), "a.json", "op_type.Relu.encoding_constraints.max", "finite")


def test_deep_nesting(tiny, tmp_path):
    _cfg(tiny, tmp_path, "[" * 100000 + "]" * 100000, "deep.json", "nested too deeply")
    _cfg(tiny, tmp_path, "[" * 100000 + "]" * 100000, "deep.yaml", "nested deeper than")
    _cfg(tiny, tmp_path, "a:\n" + "".join(" " * i + "b:\n" for i in range(1, 200)), "deep2.yaml", "nested")
    _cfg(tiny, tmp_path, json.dumps({"rules": [{"match": {"op_type": ["x"]}}]}).replace('"x"', "[" * 40 + "]" * 40),
         "deep40.json", "nested deeper than 32")


def test_alias_bomb_refused_fast_in_small_memory(tiny, tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)
    t = time.perf_counter()
    code, _, err = run_cli_subprocess(["quantize", tiny[0], "--calib", tiny[1], "-o", tmp_path / "o.onnx",
                                       "--config", path], timeout=60, mem_bytes=2 << 30)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "bomb.yaml" in lines[0] and "aliases expand" in lines[0], err
    assert time.perf_counter() - t < 30
    with pytest.raises(ConfigError, match="aliases expand"):
        get_profile(str(tmp_path / "bomb.yaml"))


def test_shared_but_small_aliases_still_load(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("weights: &w {bits: 4}\nrules:\n"
                    "  - match: {op_type: Conv}\n    weights: *w\n")
    assert load_config(str(path)).rules[0].updates["weight_bits"] == 4


def test_messages_never_quote_whole_values(tiny, tmp_path):
    line = _cfg(tiny, tmp_path, "target: [" + ", ".join(["x" * 50] * 2000) + "]\n", "big.yaml", "target")
    assert len(line) < 300
    line = _cfg(tiny, tmp_path, "scheme: " + "y" * 100000 + "\n", "long.yaml", "scheme")
    assert len(line) < 300
    line = _cfg(tiny, tmp_path, json.dumps({"z" * 100000: 1}), "key.json", "unknown key")
    assert len(line) < 400
    assert len(short(list(range(10 ** 6)))) < 70 and len(short("q" * 10 ** 6)) < 70 and len(short(10 ** 5000)) < 70


def test_regex_is_linear_time(tiny, tmp_path):
    path = tmp_path / "re.yaml"
    path.write_text("rules:\n  - match: {regex: '^(a+)+$'}\n    keep_float: true\n")
    cfg = load_config(str(path))
    node = SimpleNamespace(op_type="Relu", name="a" * 5000 + "b")
    t = time.perf_counter()
    for _ in range(10):
        assert cfg.settings_for(node).precision == "int"
    assert cfg.settings_for(SimpleNamespace(op_type="Relu", name="a" * 5000)).precision == "float32"
    assert time.perf_counter() - t < 0.5
    # and through the CLI on a model whose node has that name
    proto = onnx.load(tiny[0])
    proto.graph.node[2].name = "a" * 5000 + "b"
    m = tmp_path / "long_name.onnx"
    onnx.save(proto, str(m))
    t = time.perf_counter()
    code, lines = quantize_cli(m, tiny[1], tmp_path / "o.onnx", "--config", path)
    assert code == 0, lines
    assert time.perf_counter() - t < 20


def test_re2_error_is_one_line_in_a_child(tiny, tmp_path):
    path = tmp_path / "re.yaml"
    path.write_text("rules:\n  - match: {regex: '(a)\\1'}\n")
    code, _, err = run_cli_subprocess(["quantize", tiny[0], "--calib", tiny[1], "-o", tmp_path / "o.onnx",
                                       "--config", path], timeout=60)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "rules[0].match.regex" in lines[0], err


@pytest.mark.parametrize("text,needles", [
    ("activation: 5\n", ("activation", "expected a mapping, got 5")),
    ("weights: [1, 2]\n", ("weights", "expected a mapping")),
    ("activation: {bits: 32, symmetric: false}\n", ("activation.bits", "32")),
    ("weight: {bits: 8, symmetric: yes-please}\n", ("weight.symmetric",)),
    ("weight: {bits: 8, symmetric: true, range_bits: 9}\n", ("weight.range_bits",)),
    ("wide_activation_bits: 12\n", ("wide_activation_bits",)),
    ("per_block_weight_bits: [4, 64]\n", ("per_block_weight_bits[1]",)),
    ("per_channel_ops: Conv\n", ("per_channel_ops",)),
    ("fixed_output_range: {Tanh: [.nan, 1]}\n", ("fixed_output_range.Tanh", "finite")),
    ("fixed_output_range: {Tanh: [1, -1]}\n", ("fixed_output_range.Tanh",)),
    ("weights: {Conv: {1: 99}}\n", ("weights.Conv.1",)),
    ("bias: {Conv: -1}\n", ("bias.Conv",)),
    ("fused_activations: [[Conv]]\n", ("fused_activations",)),
    ("integer_weight_kernels: {Conv: {act_bits: 7}}\n", ("integer_weight_kernels.Conv.act_bits",)),
    ("base: [1]\n", ("unknown base",)),
    ("- 1\n", ("expected a mapping",)),
    ("[" * 5000 + "]" * 5000, ("nested",)),
    ("1: 2\n", ("unknown key",)),
])
def test_profile_fields(tiny, tmp_path, text, needles):
    _cfg(tiny, tmp_path, text, "p.yaml", *needles, flag="--target")


def test_profile_json_slot_keys_are_numbers(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"base": "trt", "weights": {"Conv": {"1": 0}}}))
    assert get_profile(str(path)).weights == {"Conv": {1: 0}}


@pytest.mark.parametrize("flag,name", [("--config", "c.yaml"), ("--target", "p.yaml")])
def test_dev_zero_folder_oversize(tiny, tmp_path, flag, name):
    for path, needle in (("/dev/zero", "is a device"), (str(tmp_path), "folder")):
        if flag == "--target":
            path = path if path.endswith(".yaml") else path
        code_lines = quantize_cli(tiny[0], tiny[1], tmp_path / "o.onnx", flag, path)
        if flag == "--target" and not path.endswith((".yaml", ".yml", ".json")):
            assert_one_line(code_lines, "unknown target")   # a profile file is named by its extension
        else:
            assert_one_line(code_lines, path, needle)
    big = tmp_path / name
    with open(big, "wb") as f:
        f.truncate((16 << 20) + 1)
    assert_one_line(quantize_cli(tiny[0], tiny[1], tmp_path / "o.onnx", flag, big), name, "limit")
    link = tmp_path / ("zero" + name)
    os.symlink("/dev/zero", link)
    assert_one_line(quantize_cli(tiny[0], tiny[1], tmp_path / "o.onnx", flag, link), name, "is a device")


@pytest.mark.parametrize("flag,name", [("--config", "c.yaml"), ("--target", "p.yaml")])
def test_fifo_does_not_hang(tiny, tmp_path, flag, name):
    fifo = tmp_path / name
    os.mkfifo(fifo)
    try:
        code, _, err = run_cli_subprocess(["quantize", tiny[0], "--calib", tiny[1], "-o", tmp_path / "o.onnx",
                                           flag, fifo], timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"quantize hung on a FIFO as {flag}")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "FIFO" in lines[0] and name in lines[0], err


def test_bit_width_table_is_what_the_api_accepts():
    assert INT_BITS == (4, 8, 16)
