"""The flags users of the peers reach for first on `qcompiler quantize`: --exclude, --op-types,
--symmetric-activations, --bias-correction, --json, --report -, --progress/--no-progress, -q; warnings for what
matches nothing; reasons printed whole; no message cites documents users do not have; docs/cli.md documents every
flag the command has."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import onnx
import pytest
from click.testing import CliRunner

from qcompiler.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def qz(tiny, *args):
    """Run `qcompiler quantize` in-process: (exit code, stdout, stderr)."""
    r = CliRunner().invoke(main, ["quantize", str(tiny / "tiny_cnn.onnx"), "--calib", str(tiny / "tiny_cnn_calib.npz"),
                                  "-o", str(tiny / "q.onnx"), *args], catch_exceptions=False)
    return r.exit_code, r.stdout, r.stderr


def _q_inputs(path) -> set:
    m = onnx.load(str(path))
    return {n.input[0] for n in m.graph.node if n.op_type == "QuantizeLinear"} | \
        {n.input[0] for n in m.graph.node if n.op_type == "DequantizeLinear"}


def _report(tiny, *args) -> dict:
    code, out, err = qz(tiny, "--report", "-", *args)
    assert code == 0, err
    return json.loads(out)


def test_json_is_the_only_thing_on_stdout(tiny):
    # a real process: nothing written below Python (onnxruntime's own logging) may reach stdout either
    r = subprocess.run([sys.executable, "-m", "qcompiler", "quantize", str(tiny / "tiny_cnn.onnx"), "--calib",
                        str(tiny / "tiny_cnn_calib.npz"), "-o", str(tiny / "q.onnx"), "--json", "--progress"],
                       capture_output=True, text=True)
    code, out, err = r.returncode, r.stdout, r.stderr
    assert code == 0, err
    summary = json.loads(out)           # the whole of stdout is one JSON document
    assert summary["model"].endswith("q.onnx") and summary["counts"]["activations"] > 0
    assert "logits" in summary["output_sqnr_db"]
    assert "wrote" in err and "quantized" in err     # the human summary went to stderr


def test_report_to_stdout(tiny):
    code, out, err = qz(tiny, "--report", "-")
    assert code == 0, err
    report = json.loads(out)
    assert "quantized_activations" in report and "left_float" in report
    assert "wrote" in err
    code, out, err = qz(tiny, "--report", "-", "--json")
    assert code == 2 and "--json and --report - both write to stdout" in err


def test_quiet(tiny):
    code, out, err = qz(tiny, "-q")
    assert code == 0 and out == "" and err == ""
    assert os.path.exists(tiny / "q.onnx")


def test_exclude_by_name_and_regex(tiny):
    report = _report(tiny, "--exclude", "fc")
    assert "fc_w" not in report["quantized_params"] and "w1" in report["quantized_params"]
    assert "kept float32 by config (a rule, --exclude or --op-types)" in report["left_float"]["logits"]
    report = _report(tiny, "--exclude", "^conv[12]$")
    assert "w1" not in report["quantized_params"] and "w2" not in report["quantized_params"]
    assert "fc_w" in report["quantized_params"]


def test_exclude_that_matches_nothing_is_a_warning_line(tiny):
    code, out, err = qz(tiny, "--exclude", "foo", "--exclude", "fc")
    assert code == 0
    assert "qcompiler: warning: --exclude 'foo' matches no node" in err.splitlines()
    assert "fc" not in " ".join(l for l in err.splitlines() if "warning" in l)
    code, out, err = qz(tiny, "--json", "--op-types", "Conv,LSTM")
    assert "qcompiler: warning: --op-types 'LSTM' matches no node" in err
    assert json.loads(out)["warnings"] == ["--op-types 'LSTM' matches no node"]


def test_exclude_bad_regex_is_one_line(tiny):
    code, out, err = qz(tiny, "--exclude", "(unclosed")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "exclude '(unclosed': no node has that name and it is not a valid regular expression" in err


def test_op_types(tiny):
    report = _report(tiny, "--op-types", "Gemm")
    assert set(report["quantized_params"]) <= {"fc_w", "fc_b"} and "fc_w" in report["quantized_params"]
    assert "flat" in report["quantized_activations"]          # the Gemm's input keeps its quantizer
    code, _, err = qz(tiny, "--op-types", " , ")
    assert code == 2 and "--op-types" in err


def test_symmetric_activations(tiny):
    report = _report(tiny, "--symmetric-activations")
    acts = report["quantized_activations"]
    assert acts and all(e["symmetric"] and e["zero_point"] == 0 for e in acts.values())
    report = _report(tiny)
    assert not all(e["symmetric"] for e in report["quantized_activations"].values())


def test_bias_correction(tiny):
    report = _report(tiny, "--bias-correction")
    assert any("bias correction on" in n for n in report["notes"])
    report = _report(tiny, "--no-bias-correction")
    assert not any("bias correction on" in n for n in report["notes"])


def test_progress_bars_in_a_log(tiny):
    code, out, err = qz(tiny, "--progress")
    assert code == 0
    lines = err.splitlines()
    for step in ("loading", "calibrating", "report pass"):
        assert any(l.startswith(f"{step}: 100%") for l in lines), err
    assert "\r" not in err                    # whole lines, readable in a CI log
    code, out, err = qz(tiny, "--no-progress")
    assert "calibrating" not in err
    code, out, err = qz(tiny, "--progress", "-q")
    assert err == ""


def test_progress_on_bad_input_still_ends_with_one_line(tiny, tmp_path):
    import numpy as np
    bad = tmp_path / "bad.npz"
    x = np.load(tiny / "tiny_cnn_calib.npz")["image"].copy()
    x[5] = np.nan
    np.savez(bad, image=x)
    r = CliRunner().invoke(main, ["quantize", str(tiny / "tiny_cnn.onnx"), "--calib", str(bad), "-o",
                                  str(tmp_path / "q.onnx"), "--progress"])
    assert r.exit_code == 2
    lines = r.stderr.splitlines()
    assert lines[-1].startswith("qcompiler: error: ") and "sample 5: contains NaN" in lines[-1], r.stderr


def test_config_rule_that_matches_nothing_warns(tiny, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rules:\n  - match: {name: no_such_node}\n    keep_float: true\n")
    code, out, err = qz(tiny, "--config", str(cfg))
    assert code == 0
    assert re.search(r"qcompiler: warning: config rule 'rules\[0\]' of \S*c\.yaml matches no node", err), err


def test_reasons_are_printed_whole(tiny):
    from qcompiler.quant.interop.report import format_summary
    report = _report(tiny, "--exclude", "fc")
    reason = "holds sentinel values of magnitude 3.4e+38 (an additive mask?): 8 bits cannot carry them " \
             "together with the rest"
    report["left_float"] = {"a": reason, "b": reason}
    assert f"  float x2 ('a', 'b'): {reason}" in format_summary(report).splitlines()


def test_no_user_facing_string_cites_private_documents():
    """Strings users see (messages, reasons) never cite 'field notes', '§' or 'anchors' (docstrings may)."""
    import ast
    bad = []
    for base, _, files in os.walk(os.path.join(ROOT, "qcompiler")):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(base, f)
            tree = ast.parse(open(path, encoding="utf-8").read())
            docs = {id(n.body[0].value) for n in ast.walk(tree)
                    if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                    and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
            for n in ast.walk(tree):
                if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
                    if re.search(r"field notes|§|anchors", n.value, re.I):
                        bad.append(f"{os.path.relpath(path, ROOT)}:{n.lineno}: {n.value[:60]}")
    assert not bad, bad


def test_cli_reference_documents_every_quantize_flag():
    from qcompiler.cli_quantize import quantize_cmd
    readme = open(os.path.join(ROOT, "docs", "cli.md"), encoding="utf-8").read()
    flags = [o for p in quantize_cmd.params for o in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])
             if o.startswith("--")]
    missing = [f for f in flags if f not in readme]
    assert not missing, missing
    docs = [open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()] + \
        [open(os.path.join(ROOT, "docs", f), encoding="utf-8").read() for f in os.listdir(os.path.join(ROOT, "docs"))
         if f.endswith(".md")]
    assert not any("If/Loop/Scan bodies are not quantized yet" in d for d in docs)


def test_exclude_a_node_preparation_removes_is_no_warning(tiny):
    code, out, err = qz(tiny, "--exclude", "bn1", "--report", "-")
    assert code == 0 and "warning" not in err, err
    assert {"w1", "w2", "fc_w"} <= set(json.loads(out)["quantized_params"])


def test_api_selection_arguments_are_checked(tiny):
    from qcompiler.errors import ArgumentError
    from qcompiler.quant.api import quantize
    model, calib = str(tiny / "tiny_cnn.onnx"), str(tiny / "tiny_cnn_calib.npz")
    with pytest.raises(ArgumentError, match="exclude must be a list of strings, got 3"):
        quantize(model, calib, exclude=3)
    with pytest.raises(ArgumentError, match="act_symmetric"):
        quantize(model, calib, act_symmetric="yes")
    res = quantize(model, calib, exclude=["fc", "nothing"], op_types=["Conv", "Gemm"])
    assert res.report["warnings"] == [{"kind": "exclude", "value": "nothing", "problem": "matches no node"}]


def test_frozen_encoding_that_matches_nothing_warns(tiny, tmp_path):
    enc = tmp_path / "enc.json"
    code, _, err = qz(tiny, "--encodings", str(enc), "-q")
    assert code == 0, err
    doc = json.loads(enc.read_text())
    acts = doc["activation_encodings"]          # 1.0.0 layout: a list of entries with "name"
    acts.append(dict(acts[0], name="ghost_tensor"))
    enc.write_text(json.dumps(doc))
    code, out, err = qz(tiny, "--load-encodings", str(enc))
    assert code == 0, err
    assert "qcompiler: warning: --load-encodings entry 'ghost_tensor' names no quantizable value" in err.splitlines()


def test_summary_gives_the_file_size_against_float(tmp_path):
    """The file size is a first-class figure: the summary line and the --json object give it against float."""
    import json as _json
    import subprocess
    import sys

    from tests.quant.decoder_models import decoder
    import onnx as _onnx
    model, _ = decoder(seed=3, hidden=128, inter=256)
    p = tmp_path / "m.onnx"
    _onnx.save(model, p)
    r = subprocess.run([sys.executable, "-m", "qcompiler", "quantize", str(p), "-o", str(tmp_path / "q.onnx"),
                        "--weight-only", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    size = _json.loads(r.stdout)["size"]
    assert size["float_bytes"] == p.stat().st_size and size["quantized_bytes"] == (tmp_path / "q.onnx").stat().st_size
    assert size["ratio"] < 0.5 and "MB float" in r.stderr
