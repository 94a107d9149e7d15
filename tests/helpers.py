"""Shared test helpers: build small models, run them in onnxruntime, compare outputs, check invariants."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from qcompiler.onnx_io import model_to_proto
from qcompiler.sqnr import sqnr_db  # noqa: F401 - the one definition, re-exported for the tests


def make_model(nodes, inputs, outputs, initializers=(), opset=17, **kw):
    g = helper.make_graph(nodes, kw.pop("name", "g"), inputs, outputs, list(initializers), value_info=kw.pop("value_info", None))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)] + kw.pop("extra_opsets", []), **kw)
    m.ir_version = min(m.ir_version, 10)
    return m


def tinfo(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def run(proto_or_model, feeds, opt_level=None):
    proto = proto_or_model if isinstance(proto_or_model, onnx.ModelProto) else model_to_proto(proto_or_model)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if opt_level is not None:
        so.graph_optimization_level = opt_level
    s = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return s.run(None, feeds)


def relative_error(model, quantized, feeds) -> float:
    """The mixed-precision search's default drop, measured in onnxruntime on the first output over `feeds`:
    sqrt(sum (q - f)^2 / sum f^2)."""
    num = den = 0.0
    for f in feeds:
        a, b = run(model, f)[0].astype(np.float64), run(quantized, f)[0].astype(np.float64)
        num += float(np.sum((b - a) ** 2))
        den += float(np.sum(a * a))
    return float(np.sqrt(num / den))


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def make_tiny_cnn(folder) -> None:
    """The README's example model and calibration set (`examples/make_tiny_cnn.py`) written into `folder`."""
    subprocess.run([sys.executable, os.path.join(ROOT, "examples", "make_tiny_cnn.py"), str(folder)], check=True,
                   capture_output=True)


def assert_one_line_error(r, *needles) -> str:
    """A finished CLI process `r` exited 2 with one stderr line, no traceback, holding every needle; the line."""
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]
