"""The public API a plug-in relies on: `qcompiler.__all__` listed once, every name there resolves, documented
and typed; `import qcompiler` stays cheap (the quantization API loads on first use); `help(qcompiler.quantize)`
works; a QuantizeResult prints a few lines, never its whole report."""
from __future__ import annotations

import inspect
import json
import pydoc
import subprocess
import sys

import numpy as np
import onnx

import qcompiler
from tests.helpers import run, sqnr_db


def test_all_is_listed_once_and_resolves():
    assert len(qcompiler.__all__) == len(set(qcompiler.__all__))
    for name in qcompiler.__all__:
        obj = getattr(qcompiler, name)
        assert obj is not None, name
        assert (inspect.getdoc(obj) or "").strip(), f"qcompiler.{name} has no docstring"
    assert {"quantize", "QuantizeResult", "load_model", "save_model", "Model"} <= set(qcompiler.__all__)
    assert set(qcompiler.__all__) <= set(dir(qcompiler))


def test_unknown_attribute_is_an_attribute_error():
    try:
        qcompiler.quantise  # noqa: B018
    except AttributeError as e:
        assert "quantise" in str(e)
    else:
        raise AssertionError("qcompiler.quantise resolved")


def test_import_stays_cheap_and_quantize_loads_on_first_use():
    code = ("import sys, qcompiler; before = 'qcompiler.quant.api' in sys.modules; f = qcompiler.quantize; "
            "print(before, 'qcompiler.quant.api' in sys.modules, f.__module__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "True", "qcompiler.quant.api"]


def test_help_of_quantize_works_and_is_typed():
    text = pydoc.render_doc(qcompiler.quantize)
    assert "Quantize a float model to QDQ ONNX" in text and "weight_bits" in text
    sig = inspect.signature(qcompiler.quantize)
    untyped = [n for n, p in sig.parameters.items() if p.annotation is inspect.Parameter.empty]
    assert not untyped, f"quantize parameters without a type hint: {untyped}"
    assert sig.return_annotation not in (inspect.Signature.empty, None)


def test_result_prints_short_and_write_encodings_returns_nothing(tiny, tmp_path):
    res = qcompiler.quantize(str(tiny / "tiny_cnn.onnx"), str(tiny / "tiny_cnn_calib.npz"))
    assert len(repr(res)) < 300 and "logits" in repr(res) and "activations=" in repr(res), repr(res)
    text = str(res)
    assert len(text) < 3000 and text.startswith("quantized ") and "output 'logits'" in text, text
    assert res.write_encodings(str(tmp_path / "enc.json")) is None
    assert json.loads((tmp_path / "enc.json").read_text()) == res.encodings_document()
    res.save(str(tmp_path / "q.onnx"))
    x = np.load(tiny / "tiny_cnn_calib.npz")["image"][0]
    ref = run(onnx.load(str(tiny / "tiny_cnn.onnx")), {"image": x})[0]
    assert sqnr_db(ref, run(onnx.load(str(tmp_path / "q.onnx")), {"image": x})[0]) > 25.0
