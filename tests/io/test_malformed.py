"""Malformed inputs at the API level: each raises a QCompilerError subclass with a one-line message that names
the problem (the CLI turns these into exit code 2; its own tests are elsewhere)."""
from __future__ import annotations

import os

import pytest
from onnx import helper

import qcompiler
from qcompiler.errors import InvalidModelError, ModelLoadError, QCompilerError, UnknownPassError
from qcompiler.passmanager import run_pipeline
from tests.helpers import make_model, tinfo
from tests.corpus import CORPUS

REAL_MODEL = os.path.join(CORPUS, "digits_cnn", "model.onnx")


def _raises(exc, fn, *words):
    with pytest.raises(exc) as ei:
        fn()
    assert isinstance(ei.value, QCompilerError)
    msg = str(ei.value)
    assert msg and "\n" not in msg, f"not one line: {msg!r}"
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    return msg


def _save(tmp_path, name, proto):
    path = str(tmp_path / name)
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())
    return path


def test_text_file_is_not_onnx(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("this is not a model\nat all\n")
    _raises(ModelLoadError, lambda: qcompiler.load_model(str(path)), str(path), "not an ONNX model")


@pytest.mark.skipif(not os.path.exists(REAL_MODEL), reason="corpus model not present")
@pytest.mark.parametrize("fraction", [0.5, 0.1, 0.9])
def test_truncated_model(tmp_path, fraction):
    data = open(REAL_MODEL, "rb").read()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[:int(len(data) * fraction)])
    _raises(ModelLoadError, lambda: qcompiler.load_model(str(path)), str(path), "truncated")


def test_empty_file(tmp_path):
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    _raises(ModelLoadError, lambda: qcompiler.load_model(str(path)), str(path), "empty")


def test_missing_file_and_folder(tmp_path):
    _raises(ModelLoadError, lambda: qcompiler.load_model(str(tmp_path / "nope.onnx")), "nope.onnx", "no such file")
    _raises(ModelLoadError, lambda: qcompiler.load_model(str(tmp_path)), "folder")


def test_cycle(tmp_path):
    proto = make_model([helper.make_node("Relu", ["b"], ["a"], name="r1"),
                        helper.make_node("Neg", ["a"], ["b"], name="n1"),
                        helper.make_node("Abs", ["a"], ["y"], name="out")],
                       [tinfo("x", [1])], [tinfo("y", [1])])
    path = _save(tmp_path, "cycle.onnx", proto)
    msg = _raises(InvalidModelError, lambda: qcompiler.load_model(path), "cycle", "'r1'", "'n1'")
    assert "Relu" in msg and "Neg" in msg


def test_dangling_input(tmp_path):
    proto = make_model([helper.make_node("Add", ["x", "ghost"], ["y"], name="add")],
                       [tinfo("x", [1])], [tinfo("y", [1])])
    path = _save(tmp_path, "dangling.onnx", proto)
    _raises(InvalidModelError, lambda: qcompiler.load_model(path), "'add'", "'ghost'", "input 1")


def test_dangling_graph_output():
    proto = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                       [tinfo("x", [1])], [tinfo("y", [1]), tinfo("phantom", [1])])
    _raises(InvalidModelError, lambda: qcompiler.model_from_proto(proto), "output 'phantom'")


def test_duplicate_output_name():
    proto = make_model([helper.make_node("Relu", ["x"], ["y"], name="first"),
                        helper.make_node("Neg", ["x"], ["y"], name="second")],
                       [tinfo("x", [1])], [tinfo("y", [1])])
    _raises(InvalidModelError, lambda: qcompiler.model_from_proto(proto), "'second'", "'y'", "duplicate")


def test_duplicate_graph_input_name():
    proto = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                       [tinfo("x", [1]), tinfo("x", [1])], [tinfo("y", [1])])
    _raises(InvalidModelError, lambda: qcompiler.model_from_proto(proto), "'x'", "twice")


def test_unknown_pass():
    model = qcompiler.model_from_proto(make_model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                                                  [tinfo("x", [1])], [tinfo("y", [1])]))
    msg = _raises(UnknownPassError, lambda: run_pipeline(model, "canonicalize,no-such-pass"), "'no-such-pass'")
    assert "canonicalize" in msg, "the message lists the known passes"
    _raises(UnknownPassError, lambda: run_pipeline(model, ""), "empty pipeline")
    assert [n.op_type for n in model.graph.nodes] == ["Relu"], "nothing ran before the pipeline was rejected"
