"""One scheme table (qcompiler/quant/core/schemes.py): every alias works alike from the CLI, a YAML config, the API and
the onnxruntime drop-in, and an unknown name gets the same one-line message from each. Bit widths likewise."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import helper, numpy_helper

from qcompiler import model_to_proto
from qcompiler.cli import main
from qcompiler.errors import ConfigError
from qcompiler.quant.api import quantize
from qcompiler.quant.settings.config import load_config
from qcompiler.quant.core.schemes import ALIASES, SCHEMES, canonical_scheme, unknown_scheme_message
from tests.helpers import make_model, tinfo

NAMES = list(SCHEMES) + list(ALIASES) + ["KL", "Post_Training_TF"]


def _model():
    w = np.random.default_rng(0).normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["y"])]
    return make_model(nodes, [tinfo("x", [1, 3, 6, 6])], [tinfo("y", [1, 4, 6, 6])], [numpy_helper.from_array(w, "w")])


def _feeds(n=6):
    rng = np.random.default_rng(1)
    return [{"x": rng.normal(0, 1, (1, 3, 6, 6)).astype(np.float32)} for _ in range(n)]


def _scales(proto):
    return {i.name: numpy_helper.to_array(i).tobytes() for i in proto.graph.initializer if "scale" in i.name}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("schemes")
    onnx.save(_model(), str(d / "m.onnx"))
    np.savez(d / "c.npz", x=np.concatenate([f["x"] for f in _feeds()]))
    return d


@pytest.fixture(scope="module")
def reference(files):
    return {s: _scales(model_to_proto(quantize(str(files / "m.onnx"), str(files / "c.npz"), scheme=s).model))
            for s in SCHEMES}


def test_the_table_resolves_every_alias():
    assert {canonical_scheme(a) for a in ALIASES} <= set(SCHEMES)
    assert canonical_scheme("kl") == "entropy" and canonical_scheme("tf") == "min_max"
    assert canonical_scheme("post_training_tf_enhanced") == "tf_enhanced"


@pytest.mark.parametrize("name", NAMES)
def test_alias_alike_from_api_cli_and_config(name, files, reference, tmp_path):
    canon = canonical_scheme(name)
    res = quantize(str(files / "m.onnx"), str(files / "c.npz"), scheme=name)
    assert res.report["scheme"] == canon and _scales(model_to_proto(res.model)) == reference[canon]
    out = tmp_path / "q.onnx"
    r = CliRunner().invoke(main, ["quantize", str(files / "m.onnx"), "--calib", str(files / "c.npz"), "-o", str(out),
                                  "--scheme", name])
    assert r.exit_code == 0, r.output
    assert _scales(onnx.load(str(out))) == reference[canon]
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"scheme: {name}\n")
    assert load_config(str(cfg)).scheme == canon
    res = quantize(str(files / "m.onnx"), str(files / "c.npz"), config=str(cfg))
    assert res.report["scheme"] == canon and _scales(model_to_proto(res.model)) == reference[canon]


@pytest.mark.parametrize("bad", ["magic", "x" * 500])
def test_unknown_scheme_is_the_same_one_line_from_each(bad, files, tmp_path):
    msg = unknown_scheme_message(bad)
    assert "\n" not in msg and len(msg) < 200 and "kl" in msg
    with pytest.raises(ConfigError) as api:
        quantize(str(files / "m.onnx"), str(files / "c.npz"), scheme=bad)
    assert str(api.value) == msg
    r = CliRunner().invoke(main, ["quantize", str(files / "m.onnx"), "--calib", str(files / "c.npz"),
                                  "-o", str(tmp_path / "q.onnx"), "--scheme", bad])
    assert r.exit_code == 2 and r.output.strip().splitlines()[-1].endswith(msg), r.output
    assert len(r.output.strip().splitlines()) == 1
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"scheme: {bad}\n")
    with pytest.raises(ConfigError) as conf:
        load_config(str(cfg))
    assert str(conf.value).endswith(f"scheme: {msg}")
    r = CliRunner().invoke(main, ["quantize", str(files / "m.onnx"), "--calib", str(files / "c.npz"),
                                  "-o", str(tmp_path / "q.onnx"), "--config", str(cfg)])
    assert r.exit_code == 2 and r.output.strip().endswith(msg) and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "q.onnx").exists()


def test_ort_dropin_methods_resolve_through_the_table():
    for method in ("MinMax", "Entropy", "Percentile"):
        assert canonical_scheme(method) in SCHEMES


@pytest.mark.parametrize("bits", [2, 3, 64])
def test_bits_error_reads_the_same_from_config_and_cli(bits, files, tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"weights: {{bits: {bits}}}\n")
    r1 = CliRunner().invoke(main, ["quantize", str(files / "m.onnx"), "--calib", str(files / "c.npz"),
                                   "-o", str(tmp_path / "q.onnx"), "--config", str(cfg)])
    r2 = CliRunner().invoke(main, ["quantize", str(files / "m.onnx"), "--calib", str(files / "c.npz"),
                                   "-o", str(tmp_path / "q.onnx"), "--weight-bits", str(bits)])
    assert r1.exit_code == 2 and r2.exit_code == 2, (r1.output, r2.output)
    tail = f"bit width must be one of 4, 8, 16, got {bits}"
    assert r1.output.strip().endswith(tail) and r2.output.strip().endswith(tail), (r1.output, r2.output)
