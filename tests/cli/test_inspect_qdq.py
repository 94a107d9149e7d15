"""`qcompiler inspect` on quantized models: Q/DQ counts by grid and granularity, compute nodes left float, and
weight-only / integer operators."""
from __future__ import annotations

import json

import numpy as np
import onnx
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from qcompiler.cli import main


def _conv_matmul(path):
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.normal(0, 0.3, (8 * 6 * 6, 10)).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array([1, -1], np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "w2"], ["y"], name="fc")]
    g = helper.make_graph(nodes, "cm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return rng.normal(0, 1, (8, 1, 3, 8, 8)).astype(np.float32)


def _inspect(path) -> dict:
    r = CliRunner().invoke(main, ["inspect", str(path), "--json", "--no-patterns"])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_inspect_tells_a_qdq_model_apart(tmp_path):
    x = _conv_matmul(tmp_path / "m.onnx")
    np.savez(tmp_path / "c.npz", x=x)
    assert "quantization" not in _inspect(tmp_path / "m.onnx")      # a float model has none
    r = CliRunner().invoke(main, ["quantize", str(tmp_path / "m.onnx"), "--calib", str(tmp_path / "c.npz"), "-o",
                                  str(tmp_path / "q.onnx"), "--optimize", "accuracy", "-q", "--act-bits", "16",
                                  "--per-tensor"])
    assert r.exit_code == 0, r.output
    q = _inspect(tmp_path / "q.onnx")["quantization"]
    model = onnx.load(str(tmp_path / "q.onnx"))
    n_q = sum(n.op_type == "QuantizeLinear" for n in model.graph.node)
    rows = q["qdq"]
    assert sum(r["count"] for r in rows if r["op"] == "QuantizeLinear") == n_q > 0
    assert all(r["grid"].startswith("16-bit") for r in rows if r["kind"] == "activation"), rows
    assert all(r["granularity"] == "per-tensor" for r in rows), rows
    assert q["float_compute"] == []
    text = CliRunner().invoke(main, ["inspect", str(tmp_path / "q.onnx"), "--no-patterns"]).output
    assert "quantization:" in text and "16-bit" in text


def test_inspect_counts_weight_only_operators(tmp_path):
    _conv_matmul(tmp_path / "m.onnx")
    r = CliRunner().invoke(main, ["quantize", str(tmp_path / "m.onnx"), "-o", str(tmp_path / "w.onnx"),
                                  "--weight-only", "--weight-bits", "4", "--block-size", "32", "-q"])
    assert r.exit_code == 0, r.output
    q = _inspect(tmp_path / "w.onnx")["quantization"]
    assert q["quantized_ops"].get("MatMulNBits") == 1, q
    # the Conv keeps float weights under --weight-only: listed as a compute node reading float values
    assert [f["node"] for f in q["float_compute"]] == ["conv"], q
