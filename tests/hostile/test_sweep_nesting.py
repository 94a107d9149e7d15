"""If bodies nested inside each other, up to far past protobuf's depth limit, and sparse initializers (hostile sweep).

Up to ~30 levels parse, and inspect, run and quantize handle them (the importer recurses once per level). From
~31 levels protobuf (upb) stops at its limit of 100 nested messages; that was reported as "not an ONNX model or
truncated (... Exceeded upb_DecodeOptions_MaxDepth)", which sent users looking for a damaged file. It now says the
bodies are nested too deeply. Models are written byte by byte here: onnx.helper cannot build them (it re-parses).
A node reading a sparse initializer was refused as reading a name nothing produces; the line now names it.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.hostile.harness import check, run_cli

vi = helper.make_tensor_value_info


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def _if_node(name: str, then_g: bytes, else_g: bytes) -> bytes:
    def attr(a, g):
        return onnx.AttributeProto(name=a, type=onnx.AttributeProto.GRAPH).SerializeToString() + _field(6, g)
    return helper.make_node("If", ["cond"], ["o"], name=name).SerializeToString() + \
        _field(5, attr("then_branch", then_g)) + _field(5, attr("else_branch", else_g))


def nested_if_model(depth: int) -> bytes:
    """y = x through `depth` If nodes, each the then-branch of the one above (bodies capture x and cond)."""
    leaf = helper.make_graph([helper.make_node("Identity", ["x"], ["o"], name="leaf")], "leaf", [],
                             [vi("o", TensorProto.FLOAT, [1, 4])]).SerializeToString()
    out = vi("o", TensorProto.FLOAT, [1, 4]).SerializeToString()
    g = leaf
    for d in range(depth):
        g = _field(1, _if_node(f"if{d}", g, leaf)) + _field(2, b"g%d" % d) + _field(12, out)
    top = helper.make_graph([helper.make_node("ReduceSum", ["x"], ["s"], name="rs", keepdims=0),
                             helper.make_node("Greater", ["s", "z"], ["cond"], name="gt")], "main",
                            [vi("x", TensorProto.FLOAT, [1, 4])], [vi("o", TensorProto.FLOAT, [1, 4])],
                            [helper.make_tensor("z", TensorProto.FLOAT, [], [0.0])]).SerializeToString()
    top += _field(1, _if_node("top", g, leaf))
    m = helper.make_model(helper.make_graph([], "x", [], []), opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    m.ClearField("graph")
    return m.SerializeToString() + _field(7, top)


def test_nested_if_25_deep_quantizes(tmp_path):
    model = tmp_path / "model.onnx"
    model.write_bytes(nested_if_model(25))
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(0).random((4, 1, 4)).astype(np.float32))
    check(run_cli(["quantize", model, "--calib", calib, "-o", tmp_path / "q.onnx"], inputs=[model, calib],
                  cwd=tmp_path), allowed=(0,))


@pytest.mark.parametrize("depth", [40, 1000])
@pytest.mark.parametrize("cmd", ["inspect", "run"])
def test_nested_if_past_protobuf_limit_is_named(tmp_path, depth, cmd):
    model = tmp_path / "model.onnx"
    model.write_bytes(nested_if_model(depth))
    args = ["inspect", model] if cmd == "inspect" else ["run", model, "-o", tmp_path / "r.onnx", "--pipeline",
                                                         "canonicalize"]
    r = check(run_cli(args, inputs=[model], cwd=tmp_path), allowed=(2,), word="nested deeper")
    assert "truncated" not in r.stderr


def test_sparse_initializer_used_by_a_node_is_named(tmp_path):
    """A node reading a sparse initializer (valid ONNX) was refused as 'not produced by any node, graph input or
    initializer', which reads like a broken model; the line now says it is a sparse initializer."""
    sp = helper.make_sparse_tensor(helper.make_tensor("w", TensorProto.FLOAT, [2], [1.0, 2.0]),
                                   helper.make_tensor("wi", TensorProto.INT64, [2], [0, 5]), [4, 4])
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [vi("x", TensorProto.FLOAT, [1, 4])], [vi("y", TensorProto.FLOAT, [1, 4])],
                          sparse_initializer=[sp])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    model = tmp_path / "model.onnx"
    onnx.save(m, model)
    r = check(run_cli(["inspect", model], inputs=[model], cwd=tmp_path), allowed=(2,), word="sparse initializer")
    assert "'w'" in r.stderr and "'mm'" in r.stderr
