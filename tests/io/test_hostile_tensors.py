"""Hostile tensors (items 1, 2, 3, 4, 5, 8, 9): every TensorProto anywhere in a model goes through one
check at import; external data never comes from outside the model's folder; a size that does not match the
shape is one line before anything is allocated; recursive local functions, hostile model paths and huge random
feeds are one line, exit 2.

The "secret" is a file outside the model's folder (or in the working directory, where a relative location
would land if it were resolved against the cwd or a temporary session file's folder): its values must never
come out of `load_model`, `inspect`, `run` or `quantize`. The same model with the file inside its folder works,
and its non-initializer tensors come out inline (no external location in any output).
"""
from __future__ import annotations

import hashlib
import os
import socket
import stat
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import qcompiler
from qcompiler.cli import main as cli_main
from qcompiler.errors import DataError, InvalidModelError, ModelLoadError, QCompilerError
from qcompiler.onnx_io import load_model, model_from_proto, model_to_proto
from qcompiler.onnx_io.tensor_check import check_tensor
from qcompiler.passmanager.instrumentation import RANDOM_FEED_LIMIT, random_feeds
from tests.helpers import run as ort_run

SECRET = np.array([13.25, -7.5, 42.0, 99.125], np.float32)
SECRET_IDX = np.array([1, 3], np.int64)
X = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)


# --- building hostile models ---------------------------------------------------------------------------------
def _ext(t: TensorProto, location: str, length: int, offset: int = 0) -> TensorProto:
    """Turn `t` into an external tensor pointing at `location`, as a hostile file would."""
    t.ClearField("raw_data")
    t.data_location = TensorProto.EXTERNAL
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t


def _ext_tensor(name: str, location: str, arr=SECRET) -> TensorProto:
    t = numpy_helper.from_array(arr, name)
    return _ext(t, location, length=arr.nbytes)


def _model(nodes, inits=(), sparse=(), functions=(), opsets=(), training=(), x_shape=(1, 4)):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], list(inits),
                          sparse_initializer=list(sparse))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)] + list(opsets), functions=list(functions))
    m.ir_version = 9
    m.training_info.extend(training)
    return m


def _add(c="c"):
    return helper.make_node("Add", ["x", c], ["y"], name="add")


def place_initializer(loc):
    return _model([_add()], inits=[_ext_tensor("c", loc)])


def place_constant(loc):
    return _model([helper.make_node("Constant", [], ["c"], name="const", value=_ext_tensor("c", loc)), _add()])


def place_constant_of_shape(loc):
    """A tensor attribute on an op other than Constant."""
    one = numpy_helper.from_array(np.array([4], np.int64), "shape")
    fill = _ext_tensor("fill", loc, SECRET[:1].copy())
    return _model([helper.make_node("ConstantOfShape", ["shape"], ["c"], name="cos", value=fill), _add()],
                  inits=[one])


# NOTE: the importer does not link nodes to sparse initializers (kept verbatim, unused here)
def _dense_c():
    return numpy_helper.from_array(np.ones(4, np.float32), "c")


def place_sparse_values(loc):
    vals = _ext_tensor("s", loc, SECRET[:2].copy())
    idx = numpy_helper.from_array(SECRET_IDX, "s_idx")
    return _model([_add()], inits=[_dense_c()], sparse=[helper.make_sparse_tensor(vals, idx, [4])])


def place_sparse_indices(loc):
    vals = numpy_helper.from_array(np.array([5.0, 6.0], np.float32), "s")
    idx = _ext_tensor("s_idx", loc, np.array([0, 1], np.int64))
    return _model([_add()], inits=[_dense_c()], sparse=[helper.make_sparse_tensor(vals, idx, [4])])


def place_sparse_constant(loc):
    vals = _ext_tensor("v", loc, SECRET[:2].copy())
    idx = numpy_helper.from_array(SECRET_IDX, "i")
    sp = helper.make_sparse_tensor(vals, idx, [4])
    return _model([helper.make_node("Constant", [], ["c"], name="const", sparse_value=sp), _add()])


def _if_with_body(body_nodes, body_inits=()):
    then = helper.make_graph(body_nodes, "then", [], [helper.make_tensor_value_info("c", TensorProto.FLOAT, [4])],
                             list(body_inits))
    other = helper.make_graph([helper.make_node("Constant", [], ["c0"], name="zero",
                                                value=numpy_helper.from_array(np.zeros(4, np.float32), "z"))],
                              "else", [], [helper.make_tensor_value_info("c0", TensorProto.FLOAT, [4])])
    cond = helper.make_node("Constant", [], ["cond"], name="cond", value=numpy_helper.from_array(np.array(True), "t"))
    return [cond, helper.make_node("If", ["cond"], ["c"], name="if", then_branch=then, else_branch=other), _add()]


def place_if_body_constant(loc):
    return _model(_if_with_body([helper.make_node("Constant", [], ["c"], name="body_const",
                                                  value=_ext_tensor("c", loc))]))


def place_if_body_initializer(loc):
    return _model(_if_with_body([helper.make_node("Identity", ["w"], ["c"], name="body_id")],
                                [_ext_tensor("w", loc)]))


def place_nested_if(loc):
    inner = _if_with_body([helper.make_node("Constant", [], ["c"], name="deep_const", value=_ext_tensor("c", loc))])
    inner[-1] = helper.make_node("Identity", ["c"], ["c2"], name="deep_id")   # the inner If's result, renamed
    outer_then = helper.make_graph(inner, "outer_then", [],
                                   [helper.make_tensor_value_info("c2", TensorProto.FLOAT, [4])])
    other = helper.make_graph([helper.make_node("Constant", [], ["c3"], name="z3",
                                                value=numpy_helper.from_array(np.zeros(4, np.float32), "z"))],
                              "outer_else", [], [helper.make_tensor_value_info("c3", TensorProto.FLOAT, [4])])
    cond = helper.make_node("Constant", [], ["ocond"], name="ocond", value=numpy_helper.from_array(np.array(True), "t"))
    return _model([cond, helper.make_node("If", ["ocond"], ["c"], name="outer_if", then_branch=outer_then,
                                          else_branch=other), _add()])


def _function(loc):
    return helper.make_function("local", "AddSecret", ["X"], ["Y"],
                                [helper.make_node("Constant", [], ["K"], name="fconst", value=_ext_tensor("K", loc)),
                                 helper.make_node("Add", ["X", "K"], ["Y"], name="fadd")],
                                [helper.make_opsetid("", 17)])


def place_function(loc):
    return _model([helper.make_node("AddSecret", ["x"], ["y"], name="call", domain="local")],
                  functions=[_function(loc)], opsets=[helper.make_opsetid("local", 1)])


def place_function_default_attr(loc):
    f = helper.make_function("local", "AddDefault", ["X"], ["Y"],
                             [helper.make_node("Add", ["X", "X"], ["Y"], name="fadd")], [helper.make_opsetid("", 17)])
    f.attribute_proto.append(helper.make_attribute("k", _ext_tensor("k", loc)))
    return _model([helper.make_node("AddDefault", ["x"], ["y"], name="call", domain="local")],
                  functions=[f], opsets=[helper.make_opsetid("local", 1)])


def _training(init_graph=None, algo_graph=None):
    ti = onnx.TrainingInfoProto()
    if init_graph is not None:
        ti.initialization.CopyFrom(init_graph)
    if algo_graph is not None:
        ti.algorithm.CopyFrom(algo_graph)
    return ti


def place_training_initialization(loc):
    init = helper.make_graph([helper.make_node("Identity", ["w"], ["w2"], name="ti")], "init", [],
                             [helper.make_tensor_value_info("w2", TensorProto.FLOAT, [4])], [_ext_tensor("w", loc)])
    return _model([_add()], inits=[numpy_helper.from_array(np.ones(4, np.float32), "c")], training=[_training(init)])


def place_training_algorithm(loc):
    algo = helper.make_graph([helper.make_node("Constant", [], ["k"], name="algo_const", value=_ext_tensor("k", loc))],
                             "algo", [], [helper.make_tensor_value_info("k", TensorProto.FLOAT, [4])])
    return _model([_add()], inits=[numpy_helper.from_array(np.ones(4, np.float32), "c")],
                  training=[_training(None, algo)])


def place_custom_op_tensors(loc):
    """A TENSORS attribute on a custom-domain node (never run; it is kept and written out)."""
    node = helper.make_node("Mystery", ["x"], ["y"], name="mystery", domain="custom",
                            payload=[numpy_helper.from_array(np.ones(2, np.float32), "a"), _ext_tensor("b", loc)])
    return _model([node], opsets=[helper.make_opsetid("custom", 1)])


PLACES = {f.__name__[len("place_"):]: f for f in [
    place_initializer, place_constant, place_constant_of_shape, place_sparse_values, place_sparse_indices,
    place_sparse_constant, place_if_body_constant, place_if_body_initializer, place_nested_if, place_function,
    place_function_default_attr, place_training_initialization, place_training_algorithm, place_custom_op_tensors]}
# expected y for X when the tensor holds SECRET (None: not run, or values not in y)
RUNNABLE = {"initializer", "constant", "constant_of_shape", "if_body_constant", "if_body_initializer", "nested_if",
            "function"}


def _layout(tmp_path):
    """models/ (the model's folder), models/data/secret.bin (inside), outside/secret.bin and cwd/attack/secret.bin."""
    models, outside, cwd = tmp_path / "models", tmp_path / "outside", tmp_path / "cwd"
    for d in (models / "data", outside, cwd / "attack"):
        d.mkdir(parents=True)
    blob = SECRET.tobytes()
    for p in (models / "data" / "secret.bin", outside / "secret.bin", cwd / "attack" / "secret.bin"):
        p.write_bytes(blob)
    return models, outside, cwd


def _write(folder, proto, name="m.onnx") -> str:
    path = os.path.join(str(folder), name)
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())
    return path


def _sha(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _one_line(exc_info, *words):
    msg = str(exc_info.value)
    assert msg and "\n" not in msg, msg
    for w in words:
        assert w in msg, f"{w!r} not in {msg!r}"
    return msg


def _secret_bytes_in(proto_bytes: bytes) -> bool:
    return SECRET[:1].tobytes() in proto_bytes   # every place reads the file from offset 0


def _external_anywhere(proto: onnx.ModelProto) -> list:
    """Every tensor in `proto` (any depth) that still names an external location."""
    found = []

    def tensors_of_graph(g):
        yield from g.initializer
        for sp in g.sparse_initializer:
            yield sp.values
            yield sp.indices
        for n in g.node:
            yield from tensors_of_attrs(n.attribute)

    def tensors_of_attrs(attrs):
        for a in attrs:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            if a.HasField("sparse_tensor"):
                yield a.sparse_tensor.values
                yield a.sparse_tensor.indices
            for sp in a.sparse_tensors:
                yield sp.values
                yield sp.indices
            if a.HasField("g"):
                yield from tensors_of_graph(a.g)
            for g in a.graphs:
                yield from tensors_of_graph(g)

    all_t = list(tensors_of_graph(proto.graph))
    for f in proto.functions:
        for n in f.node:
            all_t += list(tensors_of_attrs(n.attribute))
        all_t += list(tensors_of_attrs(f.attribute_proto))
    for ti in proto.training_info:
        all_t += list(tensors_of_graph(ti.initialization)) + list(tensors_of_graph(ti.algorithm))
    for t in all_t:
        if t.data_location == TensorProto.EXTERNAL or len(t.external_data):
            found.append(t.name)
    return found


# --- item 1: every place, refused from outside, inlined from inside --------------------------------------------
@pytest.mark.parametrize("place", sorted(PLACES))
@pytest.mark.parametrize("location", ["../outside/secret.bin", "attack/secret.bin", "data/../../outside/secret.bin"])
def test_location_outside_the_folder_refused_everywhere(tmp_path, place, location, monkeypatch):
    models, outside, cwd = _layout(tmp_path)
    monkeypatch.chdir(cwd)   # "attack/secret.bin" exists relative to the cwd, never relative to the model
    path = _write(models, PLACES[place](location))
    with pytest.raises(ModelLoadError) as ei:
        load_model(path)
    msg = _one_line(ei, path, location)
    assert ("outside" in msg) if location.startswith(("..", "data/..")) else ("not found" in msg), msg


@pytest.mark.parametrize("place", sorted(PLACES))
def test_location_inside_the_folder_loads_and_comes_out_inline(tmp_path, place):
    models, _, _ = _layout(tmp_path)
    path = _write(models, PLACES[place]("data/secret.bin"))
    model = load_model(path)
    assert model.external_files == {os.path.realpath(models / "data" / "secret.bin")}, "for writers to protect"
    if place == "initializer":
        assert model.graph.value("c").tensor.is_external, "initializers stay lazy"
    out = model_to_proto(model)
    assert _external_anywhere(out) == [], "no external location is ever written out again"
    assert _secret_bytes_in(out.SerializeToString()), "the tensor's bytes were read in (from inside the folder)"
    saved = str(tmp_path / "elsewhere.onnx")
    qcompiler.save_model(model, saved)
    assert _external_anywhere(onnx.load(saved, load_external_data=False)) == []
    if place in RUNNABLE:
        want = X + (SECRET if place != "constant_of_shape" else SECRET[0])
        np.testing.assert_allclose(ort_run(onnx.load(saved), {"x": X})[0], want)


def test_caller_proto_is_never_changed_by_inlining(tmp_path):
    models, _, _ = _layout(tmp_path)
    proto = place_function("data/secret.bin")
    proto.graph.node.insert(0, helper.make_node("Constant", [], ["unused"], name="k2",
                                                value=_ext_tensor("k2", "data/secret.bin")))
    before = proto.SerializeToString()
    model_from_proto(proto, str(models))
    assert proto.SerializeToString() == before


@pytest.mark.parametrize("place", ["initializer", "constant", "function", "sparse_values", "training_algorithm"])
def test_model_proto_without_a_folder_refuses_any_external_tensor(place, tmp_path):
    proto = PLACES[place]("data/secret.bin")
    with pytest.raises(ModelLoadError) as ei:
        model_from_proto(proto)
    _one_line(ei, "external data", "no folder")
    from qcompiler.quant import quantize
    calib = [{"x": X}]
    with pytest.raises(ModelLoadError):
        quantize(proto, calib)


def _location_cases(tmp_path):
    models, _, _ = _layout(tmp_path)
    (models / "sub").mkdir()
    os.mkfifo(models / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(models / "sock"))
    cases = {"folder": ("sub", "a folder"), "fifo": ("fifo", "a FIFO"), "socket": ("sock", "a socket"),
             "nul": ("data/secret.bin\x00.txt", "NUL"), "absolute": (str(models / "data" / "secret.bin"), "absolute"),
             "the folder itself": (".", "a folder"), "dev-zero": ("/dev/zero", "absolute"),
             "symlink to a device": ("zero", "outside")}
    os.symlink("/dev/zero", models / "zero")
    try:
        os.mknod(str(models / "dev"), 0o600 | stat.S_IFCHR, os.makedev(1, 5))
        cases["device"] = ("dev", "a device")
    except OSError:
        pass
    return models, sock, cases


def test_nul_fifo_device_socket_folder_locations_refused(tmp_path):
    models, sock, cases = _location_cases(tmp_path)
    try:
        for label, (loc, word) in cases.items():
            for place in ("initializer", "constant", "function"):
                path = _write(models, PLACES[place](loc))
                t0 = time.monotonic()
                with pytest.raises(ModelLoadError) as ei:
                    load_model(path)
                assert time.monotonic() - t0 < 5, "a FIFO must never be opened for reading"
                msg = _one_line(ei, word)
                assert "'c'" in msg or "'K'" in msg, msg
    finally:
        sock.close()


@pytest.mark.parametrize("offset,length,word", [(0, 20, "exceeds"), (8, 16, "exceeds"), (0, 8, "does not match"),
                                                (-4, 16, "exceeds"), ("x", 16, "not an integer")])
def test_offset_and_length_checked_against_file_and_shape(tmp_path, offset, length, word):
    models, _, _ = _layout(tmp_path)
    proto = place_constant("data/secret.bin")
    t = proto.graph.node[0].attribute[0].t
    del t.external_data[:]
    for k, v in (("location", "data/secret.bin"), ("offset", str(offset)), ("length", str(length))):
        e = t.external_data.add()
        e.key, e.value = k, v
    with pytest.raises(ModelLoadError) as ei:
        load_model(_write(models, proto))
    _one_line(ei, word, "'c'")


def test_duplicate_location_key_refused(tmp_path):
    models, _, _ = _layout(tmp_path)
    proto = place_constant("data/secret.bin")
    e = proto.graph.node[0].attribute[0].t.external_data.add()
    e.key, e.value = "location", "../outside/secret.bin"
    with pytest.raises(ModelLoadError) as ei:
        load_model(_write(models, proto))
    _one_line(ei, "twice")


# --- item 1 through the CLI: the secret never comes out ---------------------------------------------------------
def _cli(args, cwd=None):
    """CliRunner on qcompiler.cli.main (in process, so fast); returns (exit code, stdout, stderr)."""
    old = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        r = CliRunner().invoke(cli_main, [str(a) for a in args])
    finally:
        os.chdir(old)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r.exit_code, r.stdout, r.stderr


def _assert_cli_one_line(code, out, err, *words):
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qcompiler: error:") and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], lines[0]


def _calib(folder) -> str:
    path = os.path.join(str(folder), "calib.npz")
    np.savez(path, x=np.repeat(X[None], 4, axis=0))
    return path


@pytest.mark.parametrize("place", ["initializer", "constant", "if_body_constant", "function", "sparse_values"])
def test_cli_never_lets_the_secret_out(tmp_path, place):
    models, outside, cwd = _layout(tmp_path)
    calib = _calib(tmp_path)
    for location in ("attack/secret.bin", "../outside/secret.bin"):
        path = _write(models, PLACES[place](location))
        hashes = {p: _sha(p) for p in (path, str(outside / "secret.bin"), calib)}
        out = tmp_path / "out.onnx"
        runs = [["inspect", path], ["inspect", path, "--json"],
                ["run", path, "-o", out, "--pipeline", "fold-constants,constant-to-initializer"],
                ["quantize", path, "--calib", calib, "-o", out]]
        for args in runs:
            code, stdout, stderr = _cli(args, cwd=cwd)
            _assert_cli_one_line(code, stdout, stderr, "m.onnx", location)
            assert not out.exists(), "nothing is written"
            for v in ("13.25", "99.125", "42.0"):
                assert v not in stdout + stderr
        assert hashes == {p: _sha(p) for p in hashes}, "inputs unchanged"


@pytest.mark.parametrize("place", ["constant", "if_body_constant", "function", "initializer"])
def test_cli_same_model_with_the_file_inside_the_folder_works(tmp_path, place):
    models, _, cwd = _layout(tmp_path)
    calib = _calib(tmp_path)
    path = _write(models, PLACES[place]("data/secret.bin"))
    code, stdout, stderr = _cli(["inspect", path], cwd=cwd)
    assert code == 0, stderr
    out = tmp_path / "run.onnx"
    code, _, stderr = _cli(["run", path, "-o", out, "--pipeline", "fold-constants,constant-to-initializer"], cwd=cwd)
    assert code == 0, stderr
    got = onnx.load(str(out), load_external_data=False)
    assert _external_anywhere(got) == []
    np.testing.assert_allclose(ort_run(got, {"x": X})[0], X + SECRET)
    if place == "function":
        return   # NOTE: quantize drops model-local functions when it raises the opset (not an import matter)
    q = tmp_path / "q.onnx"
    code, _, stderr = _cli(["quantize", path, "--calib", calib, "-o", q], cwd=cwd)
    assert code == 0, stderr
    qp = onnx.load(str(q), load_external_data=False)
    assert _external_anywhere(qp) == []
    np.testing.assert_allclose(ort_run(qp, {"x": X})[0], X + SECRET, atol=1.0)


# --- item 2: byte length against dims and dtype -------------------------------------------------------------------
def _tensor(dt, dims, **fields):
    t = TensorProto(name="t", data_type=dt, dims=dims)
    for k, v in fields.items():
        if k == "raw_data":
            t.raw_data = v
        else:
            getattr(t, k).extend(v)
    return t


GOOD = {
    "float raw": _tensor(TensorProto.FLOAT, [2, 3], raw_data=b"\0" * 24),
    "float typed": _tensor(TensorProto.FLOAT, [2, 3], float_data=[1.0] * 6),
    "scalar": _tensor(TensorProto.FLOAT, [], float_data=[1.0]),
    "empty": _tensor(TensorProto.FLOAT, [0, 5]),
    "int8 in int32_data": _tensor(TensorProto.INT8, [3], int32_data=[1, 2, 3]),
    "uint16 in int32_data": _tensor(TensorProto.UINT16, [2], int32_data=[1, 2]),
    "bool": _tensor(TensorProto.BOOL, [3], int32_data=[1, 0, 1]),
    "float16 raw": _tensor(TensorProto.FLOAT16, [3], raw_data=b"\0" * 6),
    "bfloat16 typed": _tensor(TensorProto.BFLOAT16, [3], int32_data=[0, 0, 0]),
    "float8 typed": _tensor(TensorProto.FLOAT8E4M3FN, [2], int32_data=[0, 1]),
    "int4 raw odd": _tensor(TensorProto.INT4, [5], raw_data=b"\0" * 3),
    "uint4 typed packed": _tensor(TensorProto.UINT4, [5], int32_data=[0, 0, 0]),
    "int64": _tensor(TensorProto.INT64, [2], int64_data=[1, 2]),
    "uint32 in uint64_data": _tensor(TensorProto.UINT32, [2], uint64_data=[1, 2]),
    "double": _tensor(TensorProto.DOUBLE, [1], double_data=[1.0]),
    "complex64": _tensor(TensorProto.COMPLEX64, [2], float_data=[1.0, 2.0, 3.0, 4.0]),
    "complex128 raw": _tensor(TensorProto.COMPLEX128, [1], raw_data=b"\0" * 16),
    "string": _tensor(TensorProto.STRING, [2], string_data=[b"a", b"b"]),
}
BAD = {
    "10^10 elements in 16 bytes": (_tensor(TensorProto.FLOAT, [10 ** 5, 10 ** 5], raw_data=b"\0" * 16), "16 bytes"),
    "2^62 x 2^62 (no overflow)": (_tensor(TensorProto.FLOAT, [2 ** 62, 2 ** 62], raw_data=b"\0" * 16), "needs"),
    "raw one byte short": (_tensor(TensorProto.FLOAT, [2, 3], raw_data=b"\0" * 23), "23 bytes"),
    "raw one byte long": (_tensor(TensorProto.FLOAT, [2, 3], raw_data=b"\0" * 25), "25 bytes"),
    "float_data short": (_tensor(TensorProto.FLOAT, [2, 3], float_data=[1.0] * 5), "float_data holds 5"),
    "no data at all": (_tensor(TensorProto.FLOAT, [10 ** 10]), "holds 0"),
    "int4 raw unpacked": (_tensor(TensorProto.INT4, [4], raw_data=b"\0" * 4), "needs 2"),
    "uint4 typed unpacked": (_tensor(TensorProto.UINT4, [4], int32_data=[0, 0, 0, 0]), "needs 2"),
    "complex64 one float per element": (_tensor(TensorProto.COMPLEX64, [2], float_data=[1.0, 2.0]), "needs 4"),
    "int64 in int32_data": (_tensor(TensorProto.INT64, [2], int32_data=[1, 2]), "int32_data"),
    "float with int64_data": (_tensor(TensorProto.FLOAT, [2], int64_data=[1, 2]), "int64_data"),
    "string with raw data": (_tensor(TensorProto.STRING, [2], raw_data=b"ab"), "STRING"),
    "string count": (_tensor(TensorProto.STRING, [3], string_data=[b"a"]), "string_data holds 1"),
    "undefined dtype": (_tensor(TensorProto.UNDEFINED, [2], raw_data=b"\0" * 8), "UNDEFINED"),
    "unknown dtype 99": (_tensor(99, [2], raw_data=b"\0" * 8), "99"),
    "negative dim": (_tensor(TensorProto.FLOAT, [-1, 4], raw_data=b"\0" * 16), "negative"),
    "two negative dims": (_tensor(TensorProto.FLOAT, [-2, -2], raw_data=b"\0" * 16), "negative"),
}


@pytest.mark.parametrize("label", sorted(GOOD))
def test_well_formed_tensors_pass_and_decode(label):
    t = GOOD[label]
    dt, dims, ref = check_tensor(t, lambda: "t", None)
    assert (dt, dims, ref) == (t.data_type, tuple(t.dims), None)
    assert numpy_helper.to_array(t).shape == tuple(t.dims)


@pytest.mark.parametrize("label", sorted(BAD))
def test_malformed_tensors_refused_in_one_line(label):
    t, word = BAD[label]
    with pytest.raises(InvalidModelError) as ei:
        check_tensor(t, lambda: "initializer 't'", None)
    _one_line(ei, "initializer 't'", word)
    assert len(str(ei.value)) < 300


def _with_bad_tensor(where: str, t: TensorProto):
    t = TensorProto().FromString(t.SerializeToString())
    t.name = "c"
    if where == "initializer":
        return _model([_add()], inits=[t])
    if where == "constant":
        return _model([helper.make_node("Constant", [], ["c"], name="const", value=t), _add()])
    if where == "if_body":
        return _model(_if_with_body([helper.make_node("Constant", [], ["c"], name="body_const", value=t)]))
    if where == "function":
        t.name = "K"
        f = helper.make_function("local", "F", ["X"], ["Y"],
                                 [helper.make_node("Constant", [], ["K"], name="fconst", value=t),
                                  helper.make_node("Add", ["X", "K"], ["Y"], name="fadd")],
                                 [helper.make_opsetid("", 17)])
        return _model([helper.make_node("F", ["x"], ["y"], name="call", domain="local")], functions=[f],
                      opsets=[helper.make_opsetid("local", 1)])
    if where == "sparse":
        idx = numpy_helper.from_array(np.array([0], np.int64), "i")
        t.name = "s"
        return _model([_add()], inits=[_dense_c()], sparse=[helper.make_sparse_tensor(t, idx, [4])])
    if where == "training":
        g = helper.make_graph([], "init", [], [], [t])
        return _model([_add()], inits=[numpy_helper.from_array(np.ones(4, np.float32), "c")], training=[_training(g)])
    raise AssertionError(where)


@pytest.mark.parametrize("where", ["initializer", "constant", "if_body", "function", "sparse", "training"])
def test_size_check_reaches_every_place(tmp_path, where):
    bad = _tensor(TensorProto.FLOAT, [10 ** 5, 10 ** 5], raw_data=b"\0" * 16)
    path = _write(tmp_path, _with_bad_tensor(where, bad))
    with pytest.raises(InvalidModelError) as ei:
        load_model(path)
    _one_line(ei, path, "16 bytes")


def test_huge_initializer_with_16_bytes_fails_inspect_run_quantize(tmp_path):
    """The issue's case: 10^10 elements carried by 16 bytes passed `inspect` and `run` with exit 0."""
    big = _tensor(TensorProto.FLOAT, [10 ** 10], raw_data=b"\0" * 16)
    big.name = "big"
    m = _model([helper.make_node("Add", ["x", "x"], ["y"], name="add")], inits=[big])
    path = _write(tmp_path, m)
    calib = _calib(tmp_path)
    before = _sha(path)
    out = tmp_path / "o.onnx"
    for args in (["inspect", path], ["run", path, "-o", out, "--pipeline", "canonicalize,fold-constants"],
                 ["quantize", path, "--calib", calib, "-o", out]):
        code, stdout, stderr = _cli(args)
        _assert_cli_one_line(code, stdout, stderr, "m.onnx", "'big'", "16 bytes")
    assert _sha(path) == before and not out.exists()


def _memory_limited():
    """For a child process: at most 4 GB of address space (an allocation sized by a header would fail)."""
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def test_huge_initializer_one_line_in_a_real_process(tmp_path):
    """Once through a real process under a memory limit: exit 2, one stderr line, no traceback."""
    big = _tensor(TensorProto.FLOAT, [10 ** 10], raw_data=b"\0" * 16)
    big.name = "big"
    path = _write(tmp_path, _model([helper.make_node("Add", ["x", "x"], ["y"], name="add")], inits=[big]))
    r = subprocess.run([sys.executable, "-m", "qcompiler", "inspect", path], capture_output=True, text=True, timeout=60,
                       preexec_fn=_memory_limited)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("qcompiler: error:") and "16 bytes" in r.stderr


def test_attribute_type_must_match_its_payload(tmp_path):
    m = _model([helper.make_node("Constant", [], ["c"], name="const", value=numpy_helper.from_array(SECRET, "c")),
                _add()])
    a = m.graph.node[0].attribute[0]
    a.type = onnx.AttributeProto.INT        # a tensor hidden in an INT attribute would be written out unchecked
    with pytest.raises(InvalidModelError) as ei:
        load_model(_write(tmp_path, m))
    _one_line(ei, "'value'", "'const'", "INT")
    a.ClearField("type")
    with pytest.raises(InvalidModelError) as ei:
        load_model(_write(tmp_path, m))
    _one_line(ei, "no type")


def test_graph_attribute_on_any_op_is_imported_and_checked(tmp_path):
    """A body on a default-domain op that does not take one: its tensors are checked like any body's."""
    body = helper.make_graph([], "b", [], [], [_tensor(TensorProto.FLOAT, [10 ** 10], raw_data=b"\0" * 16)])
    node = helper.make_node("Add", ["x", "x"], ["y"], name="add")
    node.attribute.append(helper.make_attribute("body", body))
    with pytest.raises(InvalidModelError) as ei:
        load_model(_write(tmp_path, _model([node])))
    _one_line(ei, "16 bytes")


def test_sparse_structure_checked(tmp_path):
    vals = numpy_helper.from_array(np.ones(2, np.float32), "v")
    cases = {
        "indices int32": (helper.make_sparse_tensor(vals, numpy_helper.from_array(np.array([0, 1], np.int32), "i"),
                                                    [4]), "INT64"),
        "indices count": (helper.make_sparse_tensor(vals, numpy_helper.from_array(np.array([0], np.int64), "i"), [4]),
                          "do not fit"),
        "dense too large": (helper.make_sparse_tensor(vals, numpy_helper.from_array(np.array([0, 1], np.int64), "i"),
                                                      [2 ** 40, 2 ** 20]), "dense"),
    }
    for label, (sp, word) in cases.items():
        with pytest.raises(InvalidModelError) as ei:
            load_model(_write(tmp_path, _model([_add()], sparse=[sp])))
        _one_line(ei, word)


# --- item 3: recursive model-local functions ----------------------------------------------------------------------
def _fn(name, calls, via_if=False):
    nodes = [helper.make_node(c, ["X"], ["Y"], name=f"call_{c}", domain="local") for c in calls]
    if not calls:
        nodes = [helper.make_node("Identity", ["X"], ["Y"], name="id")]
    if via_if:
        branch = helper.make_graph(nodes, "b", [], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)])
        nodes = [helper.make_node("Constant", [], ["cond"], value=numpy_helper.from_array(np.array(True), "t")),
                 helper.make_node("If", ["cond"], ["Y"], then_branch=branch, else_branch=branch)]
    return helper.make_function("local", name, ["X"], ["Y"], nodes,
                                [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)])


@pytest.mark.parametrize("functions,named", [
    ([("f", ["f"])], "f"),
    ([("f", ["g"]), ("g", ["h"]), ("h", ["f"])], "f"),
    ([("a", ["b"]), ("b", ["b"])], "b"),
], ids=["self", "through-two-others", "reached-from-another"])
@pytest.mark.parametrize("via_if", [False, True], ids=["direct", "inside-an-if-body"])
def test_recursive_functions_refused(tmp_path, functions, named, via_if):
    fs = [_fn(n, c, via_if) for n, c in functions]
    first = functions[0][0]
    m = _model([helper.make_node(first, ["x"], ["y"], name="call", domain="local")], functions=fs,
               opsets=[helper.make_opsetid("local", 1)])
    path = _write(tmp_path, m)
    with pytest.raises(InvalidModelError) as ei:
        load_model(path)
    _one_line(ei, path, f"function '{named}'", "calls itself")
    code, stdout, stderr = _cli(["inspect", path])
    _assert_cli_one_line(code, stdout, stderr, "calls itself")


def test_function_chain_without_a_cycle_runs(tmp_path):
    fs = [_fn("f", ["g"]), _fn("g", ["h"]), _fn("h", [])]
    m = _model([helper.make_node("f", ["x"], ["y"], name="call", domain="local")], functions=fs,
               opsets=[helper.make_opsetid("local", 1)])
    model = load_model(_write(tmp_path, m))
    np.testing.assert_allclose(ort_run(model_to_proto(model), {"x": X})[0], X)


# --- items 4, 8, 9: load_proto and load_model misuse ---------------------------------------------------------------
def test_load_model_sets_source_path(tmp_path, monkeypatch):
    path = _write(tmp_path, _model([_add()], inits=[numpy_helper.from_array(SECRET, "c")]))
    monkeypatch.chdir(tmp_path)
    model = load_model("m.onnx")
    assert model.source_path == os.path.abspath(path)
    assert model_from_proto(model_to_proto(model)).source_path is None


def test_hostile_model_paths_are_one_line(tmp_path, monkeypatch):
    from qcompiler import input_files
    os.mkfifo(tmp_path / "fifo.onnx")
    ok = _write(tmp_path, _model([_add()], inits=[numpy_helper.from_array(SECRET, "c")]))
    cases = {"/dev/zero": "a device", str(tmp_path / "fifo.onnx"): "a FIFO", str(tmp_path): "folder",
             "": "empty", "m\x00.onnx": "NUL", str(tmp_path / "none.onnx"): "no such file"}
    for path, word in cases.items():
        t0 = time.monotonic()
        with pytest.raises(ModelLoadError) as ei:
            load_model(path)
        assert time.monotonic() - t0 < 5
        _one_line(ei, word)
    monkeypatch.setitem(input_files.MAX_BYTES, "model", 64)
    with pytest.raises(ModelLoadError) as ei:
        load_model(ok)
    _one_line(ei, ok, "limit")


def test_cli_model_paths_one_line(tmp_path):
    os.mkfifo(tmp_path / "fifo.onnx")
    for path in ("/dev/zero", str(tmp_path / "fifo.onnx"), str(tmp_path), ""):
        code, stdout, stderr = _cli(["inspect", path])
        _assert_cli_one_line(code, stdout, stderr)


class _BadPath:
    def __fspath__(self):
        return 3


@pytest.mark.parametrize("arg", [None, 2.5, ["m.onnx"], b"\x08\x07\x12\x00junk" * 10, b"x" * 5000, _BadPath(), True],
                         ids=["None", "float", "list", "model-bytes", "long-bytes", "bad-pathlike", "bool"])
def test_load_model_wrong_argument_types(arg):
    with pytest.raises(QCompilerError) as ei:
        load_model(arg)
    msg = _one_line(ei)
    assert len(msg) < 300


def test_load_model_of_an_int_never_reads_or_closes_the_descriptor():
    r, w = os.pipe()
    try:
        os.write(w, b"not read by qcompiler")
        for fd in (r, w):
            with pytest.raises(ModelLoadError) as ei:
                load_model(fd)
            _one_line(ei, "int")
            os.fstat(fd)   # still open
        assert os.read(r, 100) == b"not read by qcompiler", "nothing was read from the caller's descriptor"
    finally:
        os.close(r)
        os.close(w)


# --- item 9: random feeds are bounded -------------------------------------------------------------------------------
def _input_model(shapes: dict, dtype=TensorProto.FLOAT):
    ins = [helper.make_tensor_value_info(n, dtype, s) for n, s in shapes.items()]
    first = next(iter(shapes))
    g = helper.make_graph([helper.make_node("Identity", [first], ["y"], name="id")], "g", ins,
                          [helper.make_tensor_value_info("y", dtype, shapes[first])])   # onnx.checker wants a shape
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    return m


def test_random_feeds_symbolic_dims_become_one():
    feeds = random_feeds(_input_model({"a": ["batch", 3, None], "b": [2, "seq"]}))
    assert feeds["a"].shape == (1, 3, 1) and feeds["b"].shape == (2, 1)


@pytest.mark.parametrize("shapes,named", [
    ({"big": [2 ** 20, 2 ** 20]}, "big"),
    ({"a": [1 << 25], "b": [1 << 25], "c": [4]}, "c"),
    ({"huge": [2 ** 62, 2 ** 62, 2 ** 62]}, "huge"),
])
def test_random_feeds_refuse_huge_inputs_before_allocating(shapes, named):
    t0 = time.monotonic()
    with pytest.raises(DataError) as ei:
        random_feeds(_input_model(shapes))
    assert time.monotonic() - t0 < 1
    _one_line(ei, f"'{named}'", "--verify-inputs")
    assert RANDOM_FEED_LIMIT == 1 << 26


def test_cli_verify_each_on_a_huge_input_is_one_line_quickly(tmp_path):
    path = _write(tmp_path, _input_model({"x": [2 ** 20, 2 ** 20]}))
    before = _sha(path)
    out = tmp_path / "o.onnx"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "qcompiler", "run", path, "-o", str(out), "--pipeline", "canonicalize",
                        "--verify-each"], capture_output=True, text=True, timeout=120, preexec_fn=_memory_limited)
    assert time.monotonic() - t0 < 60
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("qcompiler: error:"), r.stderr
    assert "'x'" in lines[0] and "1048576" in lines[0] and "--verify-inputs" in lines[0]
    assert _sha(path) == before and not out.exists()


def test_location_that_is_not_utf8_refused(tmp_path):
    models, _, _ = _layout(tmp_path)
    data = place_constant("data/secret.bQn").SerializeToString().replace(b"secret.bQn", b"secret.\xff\xfe\xfd")
    path = os.path.join(str(models), "m.onnx")
    with open(path, "wb") as f:
        f.write(data)
    with pytest.raises(ModelLoadError) as ei:
        load_model(path)
    _one_line(ei, "UTF-8")


@pytest.mark.parametrize("value", [dict(ints=[1, 2]), dict(i=3), dict(f=1.5), dict(strings=[b"a"])])
def test_tensor_hidden_beside_a_plain_value_is_found(tmp_path, value):
    """[t, ints, type=INTS] and the like: a tensor next to a plain value never slips past the check."""
    models, _, _ = _layout(tmp_path)
    node = helper.make_node("Add", ["x", "c"], ["y"], name="add")
    a = onnx.AttributeProto()
    a.name = "sneaky"
    for k, v in value.items():
        if isinstance(v, list):
            getattr(a, k).extend(v)
        else:
            setattr(a, k, v)
    a.type = {"ints": a.INTS, "i": a.INT, "f": a.FLOAT, "strings": a.STRINGS}[next(iter(value))]
    a.t.CopyFrom(_ext_tensor("hidden", "../outside/secret.bin"))
    node.attribute.append(a)
    m = _model([node], inits=[_dense_c()])
    with pytest.raises(InvalidModelError) as ei:
        load_model(_write(models, m))
    _one_line(ei, "'sneaky'", "holds")
    a.ClearField("name")   # [t, value, type] with no name
    with pytest.raises(InvalidModelError):
        load_model(_write(models, m))


@pytest.mark.parametrize("version", [0, -5, 2 ** 31, 2 ** 62])
def test_opset_versions_no_reader_can_hold_are_refused_at_import(tmp_path, version):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", version)])
    m.ir_version = 8
    path = _write(tmp_path, m)
    with pytest.raises(InvalidModelError) as ei:
        load_model(path)
    _one_line(ei, str(version), "ai.onnx")
