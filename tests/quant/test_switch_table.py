"""One source per switch: qcompiler/quant/core/switches.py declares each switch of `quantize()` once, and the
CLI options, the API's keywords and checks, QuantSettings and pipeline.SWITCHES agree with it; a bad value reads
the same from the command line, the API and a config; the report lists every pass's stats."""
from __future__ import annotations

import dataclasses
import inspect
import json
import os

import numpy as np
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from qcompiler.cli import main
from qcompiler.errors import ArgumentError, QCompilerError
from qcompiler.quant.api import quantize
from qcompiler.cli_quantize import quantize_cmd
from qcompiler.quant.core.context import QuantSettings
from qcompiler.quant.core.switches import BY_NAME, NOT_SWITCHES, SWITCHES, check_switches

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# options of `qcompiler quantize` that are not switches: the data, where the results go, the terminal, the
# instruments (cli_instruments.py)
CLI_ONLY = {"calib", "output", "encodings_path", "encodings_version", "report_path", "report_html", "allow_low_sqnr",
            "as_json", "quiet", "with_debug", "verify_each", "print_after", "dump_dir", "time_passes", "stats"}


def _readme() -> str:
    """The command-line reference (docs/cli.md, written from the commands by qcompiler/cli_reference.py)."""
    return open(os.path.join(ROOT, "docs", "cli.md"), encoding="utf-8").read()


def _readme_rows() -> list:
    """The first cell of every table row of the command-line reference."""
    return [line.split("|")[1] for line in _readme().splitlines() if line.startswith("| `")]


# ------------------------------------------------------------------------------------------------ the table

def test_quantize_keywords_are_the_table():
    """quantize() keeps its keywords written out (help(), IDEs): exactly the table's names and defaults."""
    params = inspect.signature(quantize).parameters
    assert set(params) - set(NOT_SWITCHES) == set(BY_NAME), \
        "quantize() and qcompiler/quant/core/switches.py disagree: add the keyword or the entry"
    for s in SWITCHES:
        assert params[s.name].default == s.default, (s.name, params[s.name].default, s.default)
        assert params[s.name].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert all(f"`{s.name}`" in quantize.__doc__ for s in SWITCHES)


@pytest.mark.parametrize("s", SWITCHES, ids=lambda s: s.name)
def test_every_switch_has_a_flag_a_check_and_a_reference_row(s):
    assert callable(s.check) and s.doc
    s.check(s.default)                          # the default passes its own check
    from qcompiler.passmanager import get_pass
    for name in (s.enables,) * bool(s.enables) + s.configures:
        assert get_pass(name).name == name
    params = {p.name: p for p in quantize_cmd.params}
    if s.flag is None:
        assert s.api_only, f"{s.name}: no CLI flag and no reason given"
        return
    assert s.name in params, f"{s.name}: not an option of qcompiler quantize"
    opts = set(params[s.name].opts) | set(params[s.name].secondary_opts)
    assert opts == set(s.flag.names)
    assert s.flag.help == "" or params[s.name].help == s.flag.help
    rows = _readme_rows()
    assert any(name in row for row in rows for name in s.flag.names), f"docs/cli.md has no row for {s.flag.name}"


def test_api_only_switches_are_in_the_cli_reference():
    readme = _readme()
    missing = [s.name for s in SWITCHES if s.flag is None and f"{s.name}=" not in readme]
    assert not missing, missing


def test_the_cli_options_are_the_table_and_the_outputs():
    """No switch flag written by hand beside the table: every option is a switch or a known CLI-only option."""
    names = {p.name for p in quantize_cmd.params if p.name != "model_path"}
    flags = {s.name for s in SWITCHES if s.flag is not None}
    assert names - flags == CLI_ONLY, names - flags ^ CLI_ONLY


def test_settings_and_pipeline_switches_come_from_the_table():
    from qcompiler.passmanager import get_pass
    from qcompiler.quant.core.pipeline import DEFAULT_PIPELINE, SWITCHES as PIPELINE_SWITCHES, pipeline_for
    fields = {f.name for f in dataclasses.fields(QuantSettings)}
    assert fields == set(BY_NAME) | {"selection"}
    assert PIPELINE_SWITCHES == {s.name: s.enables for s in SWITCHES if s.enables}
    on = {"bias_correction": True, "load_encodings": "x.json", "measure_latency": True,
          "untaken_branches": "mirror", "smoothquant_alpha": 0.5, "max_drop": 0.01}
    assert set(on) == set(PIPELINE_SWITCHES)
    for name, value in on.items():
        p = BY_NAME[name].enables
        after = get_pass(p).after
        assert any(a in DEFAULT_PIPELINE for a in ((after,) if isinstance(after, str) else after))
        assert p in pipeline_for(**{name: value}) and p not in pipeline_for(**{name: BY_NAME[name].default})
    # two passes after `place`: the frozen encodings are loaded before the mixed-precision search
    names = pipeline_for(load_encodings="x.json", max_drop=0.01)
    assert names.index("load-encodings") < names.index("mixed-precision")


def test_check_switches_fills_defaults_and_resolves():
    s = check_switches({"max_drop": "1%", "smoothquant_alpha": 1 / 2})
    assert s["max_drop"] == 0.01 and s["min_sqnr"] == 15.0 and s["latency_budget_db"] == 1.0
    assert s["weight_bits"] == 8 and s["optimize"] == "balanced"
    with pytest.raises(ArgumentError, match="^metric is for the mixed-precision search: give max_drop too$"):
        check_switches({"metric": len})
    assert check_switches({"ray": "auto"})["ray"] == "auto"     # the safety net's trials use it too


# ------------------------------------------------------------------------- a bad value: one line from each door

BAD = [  # (keyword, API value, CLI arguments) whose value reaches the table's check from both doors
    ("weight_bits", 7, ["--weight-bits", "7"]),
    ("act_bits", 2, ["--act-bits", "2"]),
    ("weight_block", 0, ["--block-size", "0"]),
    ("scheme", "magic", ["--scheme", "magic"]),
    ("limit", 0, ["--limit", "0"]),
    ("opset", 12, ["--opset", "12"]),
    ("min_sqnr", float("nan"), ["--min-sqnr", "nan"]),
    ("latency_budget_db", -2.0, ["--latency-budget-db", "-2"]),
    ("max_drop", "250%", ["--max-drop", "250%"]),
    ("ray", "a b", ["--ray", "a b"]),
    ("config", "", ["--config", ""]),
    ("load_encodings", "", ["--load-encodings", ""]),
    ("recipe", "no-such-pass", ["--recipe", "no-such-pass"]),
]


def _cli(tiny, tmp_path, *args):
    return CliRunner().invoke(main, ["quantize", str(tiny / "tiny_cnn.onnx"), "--calib",
                                     str(tiny / "tiny_cnn_calib.npz"), "-o", str(tmp_path / "q.onnx"), *args])


@pytest.mark.parametrize("name, value, argv", BAD, ids=[b[0] for b in BAD])
def test_a_bad_value_is_the_same_line_from_the_cli_and_the_api(name, value, argv, tiny, tmp_path):
    with pytest.raises(QCompilerError) as api:
        quantize(str(tiny / "tiny_cnn.onnx"), str(tiny / "tiny_cnn_calib.npz"), **{name: value})
    msg = str(api.value)
    assert "\n" not in msg and len(msg) < 600, msg     # (an unknown pass lists the known ones)
    r = _cli(tiny, tmp_path, *argv)
    assert r.exit_code == 2, r.output
    assert r.stderr.strip().splitlines() == [f"qcompiler: error: {msg}"], (r.stderr, msg)
    assert not (tmp_path / "q.onnx").exists()


@pytest.mark.parametrize("name, bad, argv", [
    ("optimize", "fast", ["--optimize", "fast"]),
    ("untaken_branches", "copy", ["--untaken-branches", "copy"]),
    ("smoothquant_alpha", 1.5, ["--smoothquant-alpha", "1.5"]),
])
def test_click_typed_switches_refuse_with_the_tables_range(name, bad, argv, tiny, tmp_path):
    """These flags keep click's Choice/FloatRange (built from the table's choices): the command line refuses at
    parse time naming the flag, the API with one line naming the keyword; both exit/raise before any work."""
    with pytest.raises(ArgumentError, match=f"^{name} must be"):
        quantize(str(tiny / "tiny_cnn.onnx"), str(tiny / "tiny_cnn_calib.npz"), **{name: bad})
    r = _cli(tiny, tmp_path, *argv)
    assert r.exit_code == 2 and argv[0] in r.stderr and str(argv[1]) in r.stderr, r.stderr
    if BY_NAME[name].flag.type is not None and name != "smoothquant_alpha":
        choices = BY_NAME[name].flag.type().choices
        assert all(c in r.stderr for c in choices)


@pytest.mark.parametrize("key, argv, kw", [
    ("weights: {bits: 2}", ["--weight-bits", "2"], {"weight_bits": 2}),
    ("activations: {bits: 64}", ["--act-bits", "64"], {"act_bits": 64}),
    ("scheme: magic", ["--scheme", "magic"], {"scheme": "magic"}),
])
def test_a_bad_value_reads_the_same_from_a_config(key, argv, kw, tiny, tmp_path):
    """A config key that sets a switch refuses a bad value with the same words, after the file and the key."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(key + "\n")
    with pytest.raises(QCompilerError) as api:
        quantize(str(tiny / "tiny_cnn.onnx"), str(tiny / "tiny_cnn_calib.npz"), **kw)
    body = str(api.value).split(": ", 1)[1] if str(api.value).startswith(tuple(kw)) else str(api.value)
    r_flag, r_cfg = _cli(tiny, tmp_path, *argv), _cli(tiny, tmp_path, "--config", str(cfg))
    for r in (r_flag, r_cfg):
        lines = r.stderr.strip().splitlines()
        assert r.exit_code == 2 and len(lines) == 1 and lines[0].endswith(body), (r.stderr, body)
    section = key.split(":")[0]
    assert f"c.yaml: {section}" in r_cfg.stderr
    assert BY_NAME[next(iter(kw))].config_key.split(".")[0] == section


# ------------------------------------------------------------------------------------ pass stats in the report

def test_the_report_lists_every_pass_with_its_stats(tiny):
    res = quantize(str(tiny / "tiny_cnn.onnx"), str(tiny / "tiny_cnn_calib.npz"), bias_correction=True)
    passes = res.report["passes"]
    assert [p["name"] for p in passes] == res.report["pipeline"]
    json.dumps(passes)                          # plain JSON, no numpy scalars
    for p in passes:
        assert p["seconds"] >= 0 and isinstance(p["modified"], bool) and isinstance(p["stats"], dict)
    by = {p["name"]: p for p in passes}
    assert by["insert-qdq"]["modified"] and by["insert-qdq"]["stats"]["activations"] == \
        res.report["counts"]["activations"]
    assert by["fold-batchnorm"]["stats"]["folded"] == 2
    assert by["calibrate"]["stats"]["samples"] == res.report["calibration_samples"]
    assert "corrected" in by["bias-correction"]["stats"]


def _conv_and_matmul():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    m = numpy_helper.from_array(rng.standard_normal((8 * 8 * 4, 5)).astype(np.float32), "m")
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
                           helper.make_node("Relu", ["c"], ["r"], name="relu"),
                           helper.make_node("Reshape", ["r", "shape"], ["f"], name="flat"),
                           helper.make_node("MatMul", ["f", "m"], ["y"], name="fc")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], [w, m, shape])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_seq_mse_names_the_op_types_it_leaves_alone():
    feeds = [{"x": np.random.default_rng(i).standard_normal((1, 3, 8, 8)).astype(np.float32)} for i in range(8)]
    res = quantize(_conv_and_matmul(), feeds, recipe=["seq-mse"])
    stats = {p["name"]: p["stats"] for p in res.report["passes"]}["seq-mse"]
    assert stats["layers"] == 1
    assert stats["skipped_op_types"] == {"Conv": "1 node: seq-mse handles MatMul, Gemm only; their weights keep "
                                                  "the assigned grids"}
    assert any(n.startswith("seq-mse left alone: Conv (1 node") for n in res.report["notes"])
    from qcompiler.quant.interop.report import format_summary
    assert "  seq-mse left alone Conv: 1 node: seq-mse handles MatMul, Gemm only; their weights keep the assigned " \
           "grids" in format_summary(res.report).splitlines()
