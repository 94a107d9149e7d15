"""`read_initializers` reads a few named main-graph initializers of an ONNX file (inline or external data) and
nothing else: the values onnx.load gives, external data only from inside the model's folder, a malformed file
one ModelLoadError line."""
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from qcompiler.errors import QCompilerError
from qcompiler.onnx_io.exporter import _TAG_GRAPH, _TAG_INITIALIZER, _varint   # the writer's wire encoding
from qcompiler.onnx_io.initializers import proto_initializers, read_initializers
from tests.helpers import make_model, tinfo


def _model():
    """Main graph: w (float32 [64, 8]), b (float16), k (int64), s (float scalar, not raw: float_data); an If body
    holds its own initializer 'inner'."""
    rng = np.random.default_rng(0)
    body = h.make_graph([h.make_node("Add", ["y", "inner"], ["t"])], "then", [], [tinfo("t", [8])],
                        [nh.from_array(np.ones(8, np.float32), "inner")])
    s = h.make_tensor("s", T.FLOAT, [], [0.5])          # typed field, not raw_data
    nodes = [h.make_node("MatMul", ["x", "w"], ["m"]), h.make_node("Add", ["m", "b32"], ["y"]),
             h.make_node("Mul", ["y", "s"], ["z"]),
             h.make_node("If", ["c"], ["o"], then_branch=body, else_branch=body)]
    inits = [nh.from_array(rng.standard_normal((64, 8)).astype(np.float32), "w"),
             nh.from_array(rng.standard_normal(8).astype(np.float16), "b"),
             nh.from_array(rng.standard_normal(8).astype(np.float32), "b32"),
             nh.from_array(np.arange(3, dtype=np.int64), "k"), s]
    return make_model(nodes, [tinfo("x", [1, 64]), tinfo("c", [], T.BOOL)], [tinfo("z", [1, 8]), tinfo("o", [8])],
                      inits)


def _expected(proto):
    return {t.name: nh.to_array(t) for t in proto.graph.initializer}


@pytest.mark.parametrize("external", [False, True])
def test_the_named_main_graph_initializers_and_only_those(tmp_path, external):
    proto = _model()
    path = str(tmp_path / "m.onnx")
    onnx.save_model(proto, path, save_as_external_data=external, all_tensors_to_one_file=True, location="m.data",
                    size_threshold=0)
    want = _expected(onnx.load(path))
    got = read_initializers(path, ["w", "b", "s", "k", "inner", "missing"])
    assert sorted(got) == ["b", "k", "s", "w"]          # 'inner' is a body's, 'missing' is nowhere
    for name, arr in got.items():
        assert arr.dtype == want[name].dtype and np.array_equal(arr, want[name])
    assert read_initializers(path, []) == {}
    if external:   # a ModelProto has no folder: external data is refused
        with pytest.raises(QCompilerError, match="no folder"):
            proto_initializers(onnx.load(path, load_external_data=False), ["w"])
    else:
        in_memory = proto_initializers(onnx.load(path), ["w", "b", "s", "k", "inner", "missing"])
        assert sorted(in_memory) == sorted(got) and all(np.array_equal(in_memory[n], got[n]) for n in got)


def test_a_name_field_after_the_data_is_still_found(tmp_path):
    # protobuf writes fields in number order (name 8 before raw_data 9); another writer may not
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    data = nh.from_array(w, "w2").SerializeToString()
    name_field = b"\x42\x02w2"                            # field 8, length 2, "w2"
    assert data.count(name_field) == 1
    moved = data.replace(name_field, b"") + name_field
    proto = _model()
    graph = proto.graph.SerializeToString() + _TAG_INITIALIZER + _varint(len(moved)) + moved   # field 5: one more initializer
    proto.ClearField("graph")
    path = tmp_path / "m.onnx"
    path.write_bytes(proto.SerializeToString() + _TAG_GRAPH + _varint(len(graph)) + graph)   # field 7: the graph
    assert [t.name for t in onnx.load(str(path)).graph.initializer][-1] == "w2"
    got = read_initializers(str(path), ["w2", "w"])
    assert np.array_equal(got["w2"], w) and got["w"].shape == (64, 8)


def test_external_data_outside_the_model_folder_is_refused(tmp_path):
    proto = _model()
    inner = tmp_path / "inner"
    inner.mkdir()
    onnx.save_model(proto, str(tmp_path / "m.onnx"), save_as_external_data=True, location="m.data",
                    size_threshold=0)
    loaded = onnx.load(str(tmp_path / "m.onnx"), load_external_data=False)
    for t in loaded.graph.initializer:
        for e in t.external_data:
            if e.key == "location":
                e.value = "../m.data"
    path = str(inner / "m.onnx")
    onnx.save_model(loaded, path)
    with pytest.raises(QCompilerError, match="outside the model's folder"):
        read_initializers(path, ["w"])


def test_a_truncated_or_foreign_file_is_one_error_line(tmp_path):
    proto = _model()
    data = proto.SerializeToString()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(QCompilerError, match="cut.onnx") as e:
        read_initializers(str(cut), ["w"])
    assert "\n" not in str(e.value)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(os.urandom(64) + b"\xff" * 16)
    with pytest.raises(QCompilerError, match="junk.onnx"):
        read_initializers(str(junk), ["w"])


def test_a_name_listed_twice_is_refused(tmp_path):
    proto = _model()
    proto.graph.initializer.append(nh.from_array(np.zeros((64, 8), np.float32), "w"))
    path = str(tmp_path / "m.onnx")
    onnx.save_model(proto, path)
    with pytest.raises(QCompilerError, match="'w' is listed twice"):
        read_initializers(path, ["w"])
