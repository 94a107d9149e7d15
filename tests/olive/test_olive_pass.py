"""The Olive pass: a workflow JSON given to `olive.workflows.run` with `qcompiler.olive.package_config()` quantizes
as `qcompiler quantize` does (same bytes, same corpus metric), from Olive's data config or a calib path; weight-only
without data; Olive's external-data options; Olive's accuracy metric for max_drop; the SQNR floor.

Skipped when Olive cannot be imported (pip install 'qcompiler[olive]', with torch==2.13.0 for the CPU wheel).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.corpus import corpus_file
from tests.helpers import make_model, run, sqnr_db, tinfo

os.environ.setdefault("OLIVE_DISABLE_TELEMETRY", "1")   # a test run sends nothing anywhere
try:
    from olive.workflows import run as olive_run

    from qcompiler.olive import PASS_NAME, package_config
    from qcompiler.olive.metric import olive_metric
except ImportError as e:   # olive-ai (or its torch) is not installed here
    pytest.skip(f"Olive cannot be imported ({e}): pip install 'qcompiler[olive]' torch==2.13.0",
                allow_module_level=True)

import qcompiler.onnx_io.files as files  # noqa: E402
from qcompiler.errors import ArgumentError  # noqa: E402
from qcompiler.quant import quantize  # noqa: E402

# the Olive user script that reads an .npz (registers the dataloader "qc_test_npz")
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "npz_dataloader.py")

ACCURACY = {"name": "agreement", "type": "accuracy",
            "sub_types": [{"name": "accuracy_score", "priority": 1,
                           "metric_config": {"task": "multiclass", "num_classes": 10}}]}


def workflow(tmp_path, model: str, npz=None, **options) -> dict:
    """The workflow JSON a user writes: the ONNX model, an Olive data config over `npz` (when given), our pass."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    wf = {"input_model": {"type": "ONNXModel", "model_path": model},
          "passes": {"quantize": {"type": PASS_NAME, **options}},
          "cache_dir": str(tmp_path / "cache"), "output_dir": str(tmp_path / "out"), "log_severity_level": 3}
    if npz is not None:
        wf["data_configs"] = [{"name": "calib", "user_script": SCRIPT,
                               "dataloader_config": {"type": "qc_test_npz", "params": {"path": npz}}}]
        wf["passes"]["quantize"]["data_config"] = "calib"
    return wf


def quantized(tmp_path, model: str, npz=None, **options):
    """Run the workflow; (the output model's path, its model attributes)."""
    out = olive_run(workflow(tmp_path, model, npz, **options), package_config=package_config())
    best = out.get_best_candidate()
    assert best is not None, "the workflow produced no model"
    path = best.model_path
    if os.path.isdir(path):
        path = os.path.join(path, best.model_config["onnx_file_name"])
    return path, best.model_config.get("model_attributes") or {}


def corpus_eval(name: str, model: str) -> dict:
    r = subprocess.run([sys.executable, corpus_file(name, "eval.py"), model], capture_output=True, text=True,
                       check=True)
    return json.loads(r.stdout)


def test_package_config_keeps_olives_passes_and_adds_ours():
    from olive.package_config import OlivePackageConfig
    cfg = package_config()
    default = OlivePackageConfig.load_default_config()
    merged = OlivePackageConfig.parse_file_or_obj(json.loads(json.dumps(cfg)))   # as a JSON file would hold it
    assert set(merged.passes) == set(default.passes) | {PASS_NAME.lower()}
    assert merged.import_pass_module(PASS_NAME).__name__ == PASS_NAME


@pytest.mark.skipif(not os.path.exists(corpus_file("digits_cnn")), reason="the shared corpus is not here")
def test_workflow_gives_the_cli_model_and_metric(tmp_path):
    model, calib = corpus_file("digits_cnn"), corpus_file("digits_cnn", "calib.npz")
    cli = str(tmp_path / "cli.onnx")
    subprocess.run([sys.executable, "-m", "qcompiler", "quantize", model, "--calib", calib, "-o", cli, "-q"],
                   check=True, capture_output=True)
    olive_model, attrs = quantized(tmp_path, model, npz=calib)
    with open(cli, "rb") as a, open(olive_model, "rb") as b:
        assert a.read() == b.read(), "the Olive pass wrote other bytes than `qcompiler quantize`"
    got, want = corpus_eval("digits_cnn", olive_model), corpus_eval("digits_cnn", cli)
    assert got["value"] == want["value"] and got["value"] >= got["float_value"] - 0.01, (got, want)
    assert attrs["qcompiler"]["output_sqnr_db"]["logits"] > 25


def mlp(tmp_path, classes: int = 10):
    """A two-MatMul classifier and 32 calibration samples."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.normal(0, 0.2, (64, 128)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.normal(0, 0.2, (128, classes)).astype(np.float32), "w2")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["hr"], name="act"),
             helper.make_node("MatMul", ["hr", "w2"], ["logits"], name="fc2")]
    m = make_model(nodes, [tinfo("x", ["batch", 64])], [tinfo("logits", ["batch", classes])], [w1, w2])
    path, npz = str(tmp_path / "mlp.onnx"), str(tmp_path / "mlp_calib.npz")
    onnx.save(m, path)
    x = rng.normal(0, 1, (32, 1, 64)).astype(np.float32)
    np.savez(npz, x=x)
    return path, npz, x


def test_calib_path_is_the_same_as_olives_data_config(tmp_path):
    model, npz, x = mlp(tmp_path)
    a, _ = quantized(tmp_path / "a", model, npz=npz)
    b, _ = quantized(tmp_path / "b", model, calib=npz)
    assert open(a, "rb").read() == open(b, "rb").read()
    assert any(n.op_type == "QuantizeLinear" for n in onnx.load(a).graph.node)
    feeds = {"x": x[:8, 0]}
    assert sqnr_db(run(onnx.load(model), feeds)[0], run(onnx.load(a), feeds)[0]) > 25


def test_the_execution_provider_chooses_the_profile_unless_target_is_given(tmp_path):
    model, npz, x = mlp(tmp_path)
    qnn = {"local": {"type": "LocalSystem", "accelerators": [{"device": "npu",
                                                              "execution_providers": ["QNNExecutionProvider"]}]}}
    wf = workflow(tmp_path / "qnn", model, npz)
    wf.update(systems=qnn, host="local", target="local")
    best = olive_run(wf, package_config=package_config()).get_best_candidate()
    want = quantize(model, npz, target="qnn_htp")
    feeds = {"x": x[:8, 0]}
    np.testing.assert_array_equal(run(onnx.load(best.model_path), feeds)[0], run(want.model, feeds)[0])
    cpu, _ = quantized(tmp_path / "cpu", model, npz=npz)
    assert open(cpu, "rb").read() != open(best.model_path, "rb").read()    # the profiles differ on this model
    wf = workflow(tmp_path / "given", model, npz, target="ort_cpu")
    wf.update(systems=qnn, host="local", target="local")
    given = olive_run(wf, package_config=package_config()).get_best_candidate()
    assert open(cpu, "rb").read() == open(given.model_path, "rb").read()


def test_weight_only_without_data(tmp_path):
    model, _, x = mlp(tmp_path)
    path, _ = quantized(tmp_path, model, weight_only=True, weight_bits=4)
    preset, _ = quantized(tmp_path / "preset", model, quant_config="w4a16")    # a config that asks for weight-only
    assert open(preset, "rb").read() == open(path, "rb").read()
    q = onnx.load(path)
    assert [n.op_type for n in q.graph.node].count("MatMulNBits") == 2
    api = quantize(model, None, weight_only=True, weight_bits=4)
    feeds = {"x": x[:8, 0]}
    got = run(q, feeds)[0]
    np.testing.assert_array_equal(got, run(api.model, feeds)[0])
    assert sqnr_db(run(onnx.load(model), feeds)[0], got) > 15


def test_exclusions_and_op_types_reach_the_plan(tmp_path):
    model, npz, _ = mlp(tmp_path)
    path, attrs = quantized(tmp_path, model, npz=npz, exclude=["fc2"])
    q = onnx.load(path)
    fc2 = next(n for n in q.graph.node if n.name == "fc2")
    init = {i.name for i in q.graph.initializer}
    assert "w2" in init and fc2.input[1] == "w2", "an excluded node keeps its float weight"
    assert attrs["qcompiler"]["left_float"] > 0


def external_files(path: str) -> set:
    """The external-data files the model at `path` reads (each checked to exist beside it)."""
    m = onnx.load(path, load_external_data=False)
    files = {e.value for t in m.graph.initializer if t.data_location == TensorProto.EXTERNAL
             for e in t.external_data if e.key == "location"}
    assert all(os.path.getsize(os.path.join(os.path.dirname(path), f)) > 0 for f in files), files
    return files


def test_external_data(tmp_path):
    model, npz, x = mlp(tmp_path)
    inline, _ = quantized(tmp_path / "inline", model, npz=npz)
    ext, _ = quantized(tmp_path / "ext", model, npz=npz, save_as_external_data=True)
    named, _ = quantized(tmp_path / "named", model, npz=npz, save_as_external_data=True,
                         external_data_name="weights.bin")
    assert not external_files(inline)
    assert external_files(ext) == {"mlp.onnx.data"}      # qcompiler's writer: the name Olive's default gives
    assert external_files(named) == {"weights.bin"}      # an option of Olive's own: Olive's writer
    feeds = {"x": x[:4, 0]}
    want = run(onnx.load(inline), feeds)[0]
    for p in (ext, named):
        np.testing.assert_array_equal(run(onnx.load(p), feeds)[0], want)


def test_past_protobufs_limit_the_model_keeps_external_data(tmp_path, monkeypatch):
    """Over 2 GB (here: the limit lowered to 4 KB) the default options still write external data, and Olive's
    handler points at the folder."""
    monkeypatch.setattr(files, "TWO_GB", 4096)   # the writer's switch to external data
    model, npz, x = mlp(tmp_path)
    path, _ = quantized(tmp_path, model, npz=npz)
    assert external_files(path) == {"mlp.onnx.data"}
    monkeypatch.undo()
    feeds = {"x": x[:4, 0]}
    assert sqnr_db(run(onnx.load(model), feeds)[0], run(onnx.load(path), feeds)[0]) > 25


def test_max_drop_scored_by_olives_accuracy_metric(tmp_path):
    model, npz, x = mlp(tmp_path)
    path, attrs = quantized(tmp_path, model, npz=npz, max_drop="1%", metric=ACCURACY)
    mp = attrs["qcompiler"]["mixed_precision"]
    assert mp["budget"] == 0.01 and "Olive agreement: accuracy_score" in mp["metric"] and mp["drop"] <= 0.01
    feeds = {"x": x[:, 0]}
    f, q = run(onnx.load(model), feeds)[0], run(onnx.load(path), feeds)[0]
    assert np.mean(f.argmax(-1) == q.argmax(-1)) >= 0.99 - 1e-9   # the budget holds on the calibration samples


def test_olive_metric_is_agreement_with_float_top1():
    score = olive_metric(ACCURACY)
    ref = [{"logits": np.eye(10, dtype=np.float32)[[i]]} for i in range(10)]
    out = [{"logits": np.eye(10, dtype=np.float32)[[0 if i < 3 else i]]} for i in range(10)]
    assert score(ref, ref) == pytest.approx(1.0)
    assert score(out, ref) == pytest.approx(0.8)      # samples 1 and 2 now predict class 0
    with pytest.raises(ArgumentError, match="accuracy metric"):
        olive_metric({"name": "lat", "type": "latency", "sub_types": [{"name": "avg"}]})


def test_bad_option_and_low_sqnr_fail_the_pass_with_one_line(tmp_path):
    model, npz, _ = mlp(tmp_path)
    # Olive stops the workflow on a ValueError (a user's mistake); the message is qcompiler's one line
    with pytest.raises(ValueError, match=rf"^{PASS_NAME}: weight_bits: .*got 7$") as e:
        olive_run(workflow(tmp_path / "bad", model, npz, weight_bits=7), package_config=package_config())
    assert isinstance(e.value.__cause__, ArgumentError)
    with pytest.raises(ValueError, match="no calibration data: give data_config .* or calib"):
        olive_run(workflow(tmp_path / "nodata", model), package_config=package_config())
    with pytest.raises(ValueError, match="give data_config or calib, not both"):
        olive_run(workflow(tmp_path / "both", model, npz, calib=npz), package_config=package_config())
    with pytest.raises(ValueError, match="below the SQNR floor"):
        olive_run(workflow(tmp_path / "low", model, npz, min_sqnr=200.0), package_config=package_config())
    path, attrs = quantized(tmp_path / "allow", model, npz, min_sqnr=200.0, allow_low_sqnr=True)
    assert os.path.exists(path) and attrs["qcompiler"]["below_floor"][0]["output"] == "logits"
