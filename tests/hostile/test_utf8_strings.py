"""Model string fields that are not valid UTF-8: one line and exit 2, never a crash in a later reader.

protobuf (upb) does not check UTF-8 when it parses a proto2 string field: it hands an invalid one back as bytes.
Before the importer checked, a node name, op type, domain, graph name (main or body), attribute name, value name
or opset domain of invalid UTF-8 loaded fine and then crashed whatever read it: `inspect` formatting the op
histogram (TypeError), the exporter building a NodeProto (UnicodeDecodeError), onnxruntime (a multi-line C++ log
ahead of our line): 125 internal errors (exit 1) over the string fields of the four built models.

The sweep corrupts every string field of the built sources one at a time (the same byte length, so the file
still parses) and checks, in process: loading raises one of our errors, or the model loads and both `inspect`'s
text and `save_model` work. A few cases go through the CLI in a limited child (tests/hostile/harness.py).
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from google.protobuf.descriptor import FieldDescriptor

from qcompiler.errors import QCompilerError
from qcompiler.inspect_model import format_inspect, inspect_model
from qcompiler.onnx_io import load_model, save_model
from tests.hostile.harness import check, run_cli
from tests.hostile.mutants import BUILT, WEIGHTS_BIN, source


def _string_fields(msg, path=()):
    """(path, field, message) of every non-empty string field of `msg`, depth first."""
    for fd, val in msg.ListFields():
        items = list(val) if fd.is_repeated else [val]
        for i, x in enumerate(items):
            if fd.type == FieldDescriptor.TYPE_MESSAGE:
                yield from _string_fields(x, path + (f"{fd.name}[{i}]",))
            elif fd.type == FieldDescriptor.TYPE_STRING and x:
                yield path + (f"{fd.name}[{i}]",), fd, msg, i


def corrupt(model: onnx.ModelProto, k: int) -> "tuple[str, bytes]":
    """The bytes of `model` with its k-th string field made invalid UTF-8 (same length, so it still parses)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    path, fd, msg, i = list(_string_fields(m))[k]
    mark = "QQ%06d" % k
    if fd.is_repeated:
        getattr(msg, fd.name)[i] = mark
    else:
        setattr(msg, fd.name, mark)
    data = m.SerializeToString()
    assert data.count(mark.encode()) == 1
    return ".".join(path), data.replace(mark.encode(), b"Q\xff%06d" % k)


CASES = [(name, k) for name in BUILT for k in range(len(list(_string_fields(source(name).model))))]


@pytest.mark.parametrize("name", list(BUILT))
def test_every_string_field_invalid_utf8(tmp_path, name):
    src = source(name)
    (tmp_path / WEIGHTS_BIN).write_bytes(src.weights + bytes(range(256)) * 16)
    failures = []
    for k in range(len(list(_string_fields(src.model)))):
        where, data = corrupt(src.model, k)
        p = tmp_path / "m.onnx"
        p.write_bytes(data)
        try:
            model = load_model(str(p))
        except QCompilerError as e:
            if "\n" in str(e):
                failures.append(f"{where}: message of several lines")
            continue
        try:
            format_inspect(inspect_model(model))
            save_model(model, str(tmp_path / "out.onnx"))
        except Exception as e:  # noqa: BLE001 - any escape is the finding
            failures.append(f"{where}: {type(e).__name__}: {str(e)[:100]}")
    assert not failures, "\n".join(failures)


def _cli_case(tmp_path, field_path: str):
    src = source("control")
    k = next(i for i, (p, *_) in enumerate(_string_fields(src.model)) if ".".join(p) == field_path)
    _, data = corrupt(src.model, k)
    model = tmp_path / "model.onnx"
    model.write_bytes(data)
    calib = tmp_path / "calib.npz"
    np.savez(calib, **src.calib)
    return model, calib


@pytest.mark.parametrize("field_path,word", [
    ("graph[0].node[3].op_type[0]", "op type"),
    ("graph[0].node[2].attribute[1].g[0].name[0]", "graph name"),
    ("graph[0].node[3].attribute[0].g[0].input[0].name[0]", "value name"),
    ("graph[0].node[0].name[0]", "node name"),
])
@pytest.mark.parametrize("cmd", ["inspect", "run", "quantize"])
def test_cli_invalid_utf8_one_line(tmp_path, field_path, word, cmd):
    model, calib = _cli_case(tmp_path, field_path)
    out = tmp_path / "out"
    out.mkdir()
    args = {"inspect": ["inspect", model],
            "run": ["run", model, "-o", out / "r.onnx", "--pipeline", "canonicalize"],
            "quantize": ["quantize", model, "--calib", calib, "-o", out / "q.onnx"]}[cmd]
    r = check(run_cli(args, inputs=[model, calib], cwd=tmp_path), allowed=(2,), word=word)
    assert "UTF-8" in r.stderr and os.listdir(out) == []
