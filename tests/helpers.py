"""Shared test helpers: build small models, run them in onnxruntime, compare outputs, check invariants."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from qcompiler.onnx_io import model_to_proto


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


def sqnr_db(ref, got):
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    noise = np.sum((ref - got) ** 2)
    return float("inf") if noise == 0 else float(10 * np.log10(np.sum(ref ** 2) / noise))
