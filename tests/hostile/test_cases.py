"""The hand-written hostile-input cases, one per promise, each a CLI run (or a small API script) in a limited
child process: the expected exit code, the word the one error line must name, no traceback, no hang, no input
changed (harness.check), and for some an extra check afterwards (output mode, a device left a device, ...).

Ids start with the issue's item number. A case that hangs on a FIFO or a bomb is killed by the wall timeout and
fails; FIFO cases use a short timeout.
"""
from __future__ import annotations

import json
import os
import stat
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.hostile.harness import check, run_cli
from tests.hostile.mutants import source

CASES = {}
HANG = 6.0      # wall timeout for the cases that hang today (FIFOs, /dev/zero): a fixed product answers at once


def case(cid, slow=False):
    def deco(fn):
        CASES[cid] = (fn, slow)
        return fn
    return deco


class Ctx:
    """A case's folder: tmp/m holds the model, tmp/cwd is the working directory, tmp/out the outputs."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.m = tmp / "m"
        self.cwd = tmp / "cwd"
        self.out = tmp / "out"
        for d in (self.m, self.cwd, self.out):
            d.mkdir()

    def cnn(self, name="model.onnx", mutate=None):
        src = source("cnn")
        m = onnx.ModelProto()
        m.CopyFrom(src.model)
        if mutate:
            mutate(m)
        path = self.m / name
        path.write_bytes(m.SerializeToString())
        calib = self.tmp / "calib.npz"
        if not calib.exists():
            np.savez(calib, **src.calib)
        return path, calib

    def write(self, name, text, where=None):
        p = (where or self.tmp) / name
        p.write_text(text) if isinstance(text, str) else p.write_bytes(text)
        return p

    def fifo(self, name, where=None):
        p = (where or self.tmp) / name
        os.mkfifo(p)
        return p


def _x_model(nodes, inits=(), functions=(), opsets=(("", 13),), inp=("x", [1, 4]), out="y", ir=8, **kw):
    vi = helper.make_tensor_value_info
    g = helper.make_graph(nodes, "g", [vi(inp[0], TensorProto.FLOAT, inp[1])], [vi(out, TensorProto.FLOAT, None)],
                          list(inits), **kw)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], functions=list(functions))
    m.ir_version = ir
    return m


def _external(t, location, length=16):
    t.ClearField("raw_data")
    t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    t.external_data.add(key="location", value=location)
    t.external_data.add(key="offset", value="0")
    if length is not None:
        t.external_data.add(key="length", value=str(length))
    return t


SECRET = np.full((1, 4), 1234.5, np.float32)


def _ext_tensor(name, location):
    return _external(numpy_helper.from_array(np.zeros((1, 4), np.float32), name), location)


def _leaky_model(where, location):
    """A model whose tensor at `where` reads external data from `location`."""
    if where == "constant":
        return _x_model([helper.make_node("Constant", [], ["c"], name="const", value=_ext_tensor("c_value", location)),
                         helper.make_node("Add", ["x", "c"], ["y"], name="add")])
    if where == "function":
        fn = helper.make_function("local", "AddC", ["a"], ["out"],
                                  [helper.make_node("Constant", [], ["c"], name="fn_const",
                                                    value=_ext_tensor("c_value", location)),
                                   helper.make_node("Add", ["a", "c"], ["out"], name="fn_add")],
                                  [helper.make_opsetid("", 13)])
        return _x_model([helper.make_node("AddC", ["x"], ["y"], name="addc", domain="local")], functions=[fn],
                        opsets=(("", 13), ("local", 1)))
    if where == "if-body":
        vi = helper.make_tensor_value_info
        then_g = helper.make_graph([helper.make_node("Add", ["x", "bc"], ["t"], name="then_add")], "then", [],
                                   [vi("t", TensorProto.FLOAT, [1, 4])], [_ext_tensor("bc", location)])
        else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"], name="else_id")], "else", [],
                                   [vi("e", TensorProto.FLOAT, [1, 4])])
        return _x_model([helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
                         helper.make_node("Greater", ["s", "zero"], ["pos"], name="gt"),
                         helper.make_node("If", ["pos"], ["y"], name="if", then_branch=then_g, else_branch=else_g)],
                        inits=[numpy_helper.from_array(np.array(-1e9, np.float32), "zero")])
    if where == "sparse-initializer":
        sp = helper.make_sparse_tensor(_external(numpy_helper.from_array(np.zeros(4, np.float32), "c"), location),
                                       numpy_helper.from_array(np.arange(4, dtype=np.int64), "c_idx"), [1, 4])
        m = _x_model([helper.make_node("Add", ["x", "c"], ["y"], name="add")], sparse_initializer=[sp])
        return m
    if where == "constant-sparse-value":
        sp = helper.make_sparse_tensor(_external(numpy_helper.from_array(np.zeros(4, np.float32), "c"), location),
                                       numpy_helper.from_array(np.arange(4, dtype=np.int64), "c_idx"), [1, 4])
        return _x_model([helper.make_node("Constant", [], ["c"], name="const", sparse_value=sp),
                         helper.make_node("Add", ["x", "c"], ["y"], name="add")])
    if where == "training-info":
        m = _x_model([helper.make_node("Add", ["x", "c"], ["y"], name="add")],
                     inits=[numpy_helper.from_array(np.ones((1, 4), np.float32), "c")])
        ti = m.training_info.add()
        ti.initialization.CopyFrom(helper.make_graph([], "init", [], [], [_ext_tensor("c_init", location)]))
        return m
    raise ValueError(where)


def _x_calib(ctx):
    p = ctx.tmp / "calib.npz"
    np.savez(p, x=np.random.default_rng(0).standard_normal((4, 1, 4)).astype(np.float32))
    return p


def _secret(ctx):
    p = ctx.tmp / "secret.bin"
    p.write_bytes(SECRET.tobytes())
    return p


# ------------------------------------------------------------------ 1. external data outside the model's folder

for _where in ("constant", "function", "if-body", "sparse-initializer", "constant-sparse-value", "training-info"):
    for _cmd in ("quantize", "run"):
        def _make(ctx, where=_where, cmd=_cmd):
            secret = _secret(ctx)
            model = ctx.m / "model.onnx"
            onnx.save(_leaky_model(where, "../secret.bin"), model)
            calib = _x_calib(ctx)
            args = (["quantize", model, "--calib", calib, "-o", ctx.out / "q.onnx"] if cmd == "quantize" else
                    ["run", model, "-o", ctx.out / "r.onnx", "--pipeline", "fold-constants,constant-to-initializer"])
            # a sparse initializer the importer refuses outright is fine too: then nothing names the secret
            return dict(args=args, inputs=[ctx.m, secret, calib], expect=(2,),
                        word=None if where == "sparse-initializer" else "secret.bin")
        case(f"1-{_where}-external-outside-folder-{_cmd}")(_make)


@case("1-constant-external-relative-to-cwd")
def _c(ctx):
    (ctx.cwd / "attack").mkdir()
    secret = ctx.write("secret.bin", SECRET.tobytes(), ctx.cwd / "attack")
    model = ctx.m / "model.onnx"
    onnx.save(_leaky_model("constant", "attack/secret.bin"), model)
    calib = _x_calib(ctx)
    return dict(args=["quantize", model, "--calib", calib, "-o", ctx.out / "q.onnx"], inputs=[ctx.m, secret, calib],
                expect=(2,), word="secret.bin")


for _name, _loc in (("nul", "a\x00b"), ("dev-zero", "/dev/zero"), ("fifo", "fifo.bin"), ("folder", "sub"),
                    ("absolute-etc-passwd", "/etc/passwd"), ("dot", ".")):
    def _make(ctx, name=_name, loc=_loc):
        if name == "fifo":
            ctx.fifo("fifo.bin", ctx.m)
        if name == "folder":
            (ctx.m / "sub").mkdir()
        model = ctx.m / "model.onnx"
        onnx.save(_leaky_model("constant", loc), model)
        return dict(args=["run", model, "-o", ctx.out / "r.onnx", "--pipeline", "fold-constants,constant-to-initializer"],
                    inputs=[ctx.m], expect=(2,), timeout=HANG)
    case(f"1-constant-location-{_name}")(_make)


# ------------------------------------------------------------------ 2. save_model over the input's external data

@case("2-api-save-model-data-is-input-external-data")
def _c(ctx):
    w = np.arange(4096, dtype=np.float32).reshape(4, 1024)   # over save_model's 1 KB external-data threshold
    t = numpy_helper.from_array(w, "w")
    _external(t, "out.onnx.data", w.nbytes)
    (ctx.m / "out.onnx.data").write_bytes(w.tobytes())
    model = ctx.m / "model.onnx"
    onnx.save(_x_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], inits=[t]), model)
    script = f"""
        import sys, qcompiler
        from qcompiler.errors import QCompilerError
        try:
            m = qcompiler.load_model({str(model)!r})
            qcompiler.save_model(m, {str(ctx.m / 'out.onnx')!r}, external_data=True)
        except QCompilerError as e:
            print("qcompiler: error:", str(e).splitlines()[0], file=sys.stderr); sys.exit(2)
        """
    return dict(python=["-c", textwrap.dedent(script)], inputs=[model, ctx.m / "out.onnx.data"], expect=(0, 2),
                after=lambda r: _loads_and_runs(model))


@case("2-api-save-model-over-the-model-it-was-loaded-from")
def _c(ctx):
    return _api(ctx, "qcompiler.save_model(qcompiler.load_model(MODEL), MODEL)")


@case("2-api-quantize-result-save-over-its-input")
def _c(ctx):
    return _api(ctx, "quantize(MODEL, CALIB).save(MODEL)")


def _loads_and_runs(path):
    import onnxruntime as ort
    ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


# ------------------------------------------------------------------ 3. outputs landing on inputs by another name

def _run(model, out, *extra):
    return ["run", model, "-o", out, "--pipeline", "canonicalize", *extra]


@case("3-output-dotdot-spelling")
def _c(ctx):
    model, _ = ctx.cnn()
    (ctx.m / "sub").mkdir()
    return dict(args=_run(model, f"{ctx.m}/sub/../model.onnx"), inputs=[model], expect=(2,))


@case("3-output-hardlink-to-input")
def _c(ctx):
    model, _ = ctx.cnn()
    os.link(model, ctx.out / "h.onnx")
    return dict(args=_run(model, ctx.out / "h.onnx"), inputs=[model], expect=(2,))


@case("3-output-symlink-to-input")
def _c(ctx):
    model, _ = ctx.cnn()
    os.symlink(model, ctx.out / "l.onnx")
    return dict(args=_run(model, ctx.out / "l.onnx"), inputs=[model], expect=(2,))


@case("3-input-symlink-to-output")
def _c(ctx):
    model, _ = ctx.cnn()
    os.symlink(model, ctx.out / "l.onnx")
    return dict(args=_run(ctx.out / "l.onnx", model), inputs=[model], expect=(2,))


@case("3-output-is-verify-inputs")
def _c(ctx):
    model, _ = ctx.cnn()
    v = ctx.tmp / "v.npz"
    np.savez(v, image=np.zeros((1, 3, 8, 8), np.float32))
    return dict(args=_run(model, v, "--verify-each", "--verify-inputs", v), inputs=[model, v], expect=(2,))


@case("3-output-is-calib-folder-member")
def _c(ctx):
    model, calib = ctx.cnn()
    cal = ctx.tmp / "cal"
    cal.mkdir()
    (cal / "a.npz").write_bytes(calib.read_bytes())
    return dict(args=["quantize", model, "--calib", cal, "-o", cal / "a.npz"], inputs=[model, cal], expect=(2,))


@case("3-output-is-input-external-data")
def _c(ctx):
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    t = _external(numpy_helper.from_array(w, "w"), "weights.bin", 64)
    (ctx.m / "weights.bin").write_bytes(w.tobytes())
    model = ctx.m / "model.onnx"
    onnx.save(_x_model([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], inits=[t]), model)
    return dict(args=_run(model, ctx.m / "weights.bin"), inputs=[ctx.m], expect=(2,))


@case("3-dump-dir-holds-input")
def _c(ctx):
    model, _ = ctx.cnn("00_input.onnx")
    return dict(args=_run(model, ctx.out / "r.onnx", "--dump-dir", ctx.m), inputs=[model], expect=(2,))


@case("3-encodings-output-is-load-encodings")
def _c(ctx):
    model, calib = ctx.cnn()
    enc = ctx.write("e.json", json.dumps({"version": "2.0.0", "encodings": [
        {"name": "image", "output_dtype": "uint8", "y_scale": 0.004}]}))
    return dict(args=["quantize", model, "--calib", calib, "-o", ctx.out / "q.onnx", "--load-encodings", enc,
                      "--encodings", enc], inputs=[model, calib, enc], expect=(2,))


@case("3-report-is-config")
def _c(ctx):
    model, calib = ctx.cnn()
    cfg = ctx.write("c.yaml", "scheme: min_max\n")
    return dict(args=["quantize", model, "--calib", calib, "-o", ctx.out / "q.onnx", "--config", cfg,
                      "--report", cfg], inputs=[model, calib, cfg], expect=(2,))


@case("3-encodings-output-is-model")
def _c(ctx):
    model, calib = ctx.cnn()
    return dict(args=["quantize", model, "--calib", calib, "-o", ctx.out / "q.onnx", "--encodings", model],
                inputs=[model, calib], expect=(2,))


@case("3-output-char-device-written-through")
def _c(ctx):
    model, _ = ctx.cnn()
    null = ctx.tmp / "null"
    try:   # a /dev/null of our own: the suite runs as root here, and must never risk the system's /dev/null
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        with open(null, "wb") as f:
            f.write(b"x")
    except (PermissionError, OSError):
        if os.geteuid() == 0:
            pytest.skip("cannot make a character device here")
        null = "/dev/null"   # not root: the system's /dev/null cannot be replaced by this run

    def after(r):
        assert stat.S_ISCHR(os.lstat(null).st_mode), f"{null} is no longer a character device"
    return dict(args=_run(model, null), inputs=[model], expect=(0,), after=after)


@case("3-output-fifo")
def _c(ctx):
    model, _ = ctx.cnn()
    return dict(args=_run(model, ctx.fifo("o.onnx", ctx.out)), inputs=[model], expect=(2,), timeout=HANG)


for _name, _out in (("folder", "{out}"), ("trailing-slash", "{out}/new/"), ("empty", ""),
                    ("proc", "/proc/qc-hostile.onnx"), ("sys", "/sys/qc-hostile.onnx")):
    def _make(ctx, out=_out):
        model, _ = ctx.cnn()
        return dict(args=_run(model, out.format(out=ctx.out)), inputs=[model], expect=(2,))
    case(f"3-output-{_name}")(_make)


for _name, _dump in (("is-file", "{model}"), ("proc", "/proc/qc-hostile-dump"), ("empty", "")):
    def _make(ctx, dump=_dump):
        model, _ = ctx.cnn()
        return dict(args=_run(model, ctx.out / "r.onnx", "--dump-dir", dump.format(model=model)), inputs=[model],
                    expect=(2,))
    case(f"3-dump-dir-{_name}")(_make)


# ------------------------------------------------------------------ 4. output permissions follow the umask

for _cmd in ("run", "quantize"):
    def _make(ctx, cmd=_cmd):
        model, calib = ctx.cnn()
        out = ctx.out / "o.onnx"
        args = _run(model, out) if cmd == "run" else ["quantize", model, "--calib", calib, "-o", out]

        def after(r):
            assert stat.S_IMODE(os.stat(out).st_mode) == 0o644, f"mode {oct(stat.S_IMODE(os.stat(out).st_mode))}"
        return dict(args=args, inputs=[model, calib], expect=(0,), after=after, umask=0o022)
    case(f"4-{_cmd}-output-mode-0644-under-umask-022")(_make)


# ------------------------------------------------------------------ 5. onnxruntime refusing a model; header sizes

def _init(m, name):
    return next(t for t in m.graph.initializer if t.name == name)


def _node(m, name):
    return next(n for n in m.graph.node if n.name == name)


def _set_attr(n, attr):
    for a in list(n.attribute):
        if a.name == attr.name:
            n.attribute.remove(a)
    n.attribute.append(attr)


def _strides_string(m):
    n = _node(m, "conv2")
    for a in list(n.attribute):
        if a.name == "strides":
            n.attribute.remove(a)
    a = n.attribute.add()
    a.name, a.type, a.s = "strides", onnx.AttributeProto.STRING, b"2,2"


MODEL_MUTATIONS = {
    "data-length-mismatch": lambda m: _init(m, "w1").dims.__setitem__(0, 5),
    "undefined-dtype": lambda m: setattr(_init(m, "fc_b"), "data_type", 0),
    "opset-99": lambda m: setattr(m.opset_import[0], "version", 99),
    "opset-2**62": lambda m: setattr(m.opset_import[0], "version", 2 ** 62),
    "unknown-op": lambda m: setattr(_node(m, "relu1"), "op_type", "NoSuchOp"),
    "unknown-domain": lambda m: setattr(_node(m, "relu1"), "domain", "com.evil"),
    "strides-string": _strides_string,
    "negative-kernel": lambda m: _set_attr(_node(m, "conv2"), helper.make_attribute("kernel_shape", [-3, -3])),
    "group-0": lambda m: _set_attr(_node(m, "conv2"), helper.make_attribute("group", 0)),
    "input-no-type": lambda m: m.graph.input[0].ClearField("type"),
    "empty-op-type": lambda m: setattr(_node(m, "relu1"), "op_type", ""),
}
for _name, _mut in MODEL_MUTATIONS.items():
    def _make(ctx, mut=_mut):
        model, calib = ctx.cnn(mutate=mut)
        return dict(args=["quantize", model, "--calib", calib, "-o", ctx.out / "q.onnx"], inputs=[model, calib],
                    expect=(2,))
    case(f"5-{_name}-quantize")(_make)


def _recursive_function(ctx):
    fn = helper.make_function("local", "F", ["a"], ["out"], [helper.make_node("F", ["a"], ["out"], domain="local")],
                              [helper.make_opsetid("", 13), helper.make_opsetid("local", 1)])
    model = ctx.m / "model.onnx"
    onnx.save(_x_model([helper.make_node("F", ["x"], ["y"], name="f", domain="local")], functions=[fn],
                       opsets=(("", 13), ("local", 1))), model)
    calib = _x_calib(ctx)
    return dict(args=["quantize", model, "--calib", calib, "-o", ctx.out / "q.onnx"], inputs=[model, calib],
                expect=(2,))


case("5-recursive-local-function-quantize")(_recursive_function)


for _cmd in ("inspect", "run"):
    def _make(ctx, cmd=_cmd):
        t = TensorProto(name="big", data_type=TensorProto.FLOAT, dims=[100000, 100000], raw_data=b"\0" * 16)
        model = ctx.m / "model.onnx"
        onnx.save(_x_model([helper.make_node("Add", ["x", "big"], ["y"], name="add")], inits=[t]), model)
        args = ["inspect", model] if cmd == "inspect" else _run(model, ctx.out / "r.onnx")
        return dict(args=args, inputs=[model], expect=(2,), word="big")
    case(f"5-1e10-element-initializer-16-bytes-{_cmd}")(_make)


@case("5-config-activation-bits-32")
def _c(ctx):
    model, calib = ctx.cnn()
    cfg = ctx.write("c.yaml", "activations: {bits: 32}\n")
    return dict(args=["quantize", model, "--calib", calib, "-o", ctx.out / "q.onnx", "--config", cfg],
                inputs=[model, calib, cfg], expect=(2,), word="bits")


def _load_enc(ctx, doc, word=None, expect=(2,)):
    model, calib = ctx.cnn()
    enc = ctx.write("e.json", json.dumps(doc))
    return dict(args=["quantize", model, "--calib", calib, "-o", ctx.out / "q.onnx", "--load-encodings", enc],
                inputs=[model, calib, enc], expect=expect, word=word)


def _v1_act(bw, dtype="INT"):
    return {"version": "1.0.0", "activation_encodings": [
        {"name": "r1", "enc_type": "PER_TENSOR", "dtype": dtype, "bw": bw, "is_sym": False, "scale": [0.01],
         "offset": [0]}], "param_encodings": []}


for _bw in (33, 64):
    case(f"5-load-encodings-bw-{_bw}")(lambda ctx, bw=_bw: _load_enc(ctx, _v1_act(bw), word="r1"))
case("5-load-encodings-float8")(lambda ctx: _load_enc(ctx, {"version": "2.0.0", "encodings": [
    {"name": "r1", "output_dtype": "float8e4m3fn", "y_scale": 0.01}]}, word="r1"))


@case("5-ort-log-lines-out-of-range-token-ids")
def _c(ctx):
    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node("Gather", ["emb", "ids"], ["y"], name="gather")], "g",
                          [vi("ids", TensorProto.INT64, [1, 3])], [vi("y", TensorProto.FLOAT, [1, 3, 4])],
                          [numpy_helper.from_array(np.ones((10, 4), np.float32), "emb")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    model = ctx.m / "model.onnx"
    onnx.save(m, model)
    calib = ctx.tmp / "calib.npz"
    np.savez(calib, ids=np.full((4, 1, 3), 50, np.int64))
    return dict(args=["quantize", model, "--calib", calib, "-o", ctx.out / "q.onnx"], inputs=[model, calib],
                expect=(2,))


# ------------------------------------------------------------------ 6. encodings files checked against the model

def _w1(**kw):
    e = {"name": "w1", "output_dtype": "int8", "y_scale": [0.01] * 4, "axis": 0}
    e.update(kw)
    return {"version": "2.0.0", "encodings": [e]}


for _name, _doc in (("scale-count-mismatch", _w1(y_scale=[0.01] * 3)), ("axis-99", _w1(axis=99)),
                    ("axis--7", _w1(axis=-7)), ("block-size-2**40", _w1(block_size=2 ** 40, axis=1)),
                    ("scale-nan", _w1(y_scale=[0.01, float("nan"), 0.01, 0.01])),
                    ("scale-inf", _w1(y_scale=[0.01, float("inf"), 0.01, 0.01])),
                    ("scale-zero", _w1(y_scale=[0.01, 0.0, 0.01, 0.01]))):
    case(f"6-encodings-{_name}")(lambda ctx, doc=_doc: _load_enc(ctx, doc, word="w1"))


# ------------------------------------------------------------------ 7. config and profile files

def _quant_cfg(ctx, name, text, opt="--config", word=None):
    model, calib = ctx.cnn()
    cfg = ctx.write(name, text)
    return dict(args=["quantize", model, "--calib", calib, "-o", ctx.out / "q.onnx", opt, cfg],
                inputs=[model, calib, cfg], expect=(2,), word=word)


case("7-yaml-deep-nesting-config")(lambda ctx: _quant_cfg(ctx, "c.yaml", "rules: " + "[" * 50000 + "]" * 50000 + "\n"))
case("7-yaml-deep-nesting-profile")(lambda ctx: _quant_cfg(ctx, "p.yaml", "weights: " + "{a: " * 20000 + "1" +
                                                           "}" * 20000 + "\n", opt="--target"))
case("7-profile-activation-5")(lambda ctx: _quant_cfg(ctx, "p.yaml", "activation: 5\n", opt="--target",
                                                      word="activation"))
case("7-profile-weights-list")(lambda ctx: _quant_cfg(ctx, "p.yaml", "weights: [1, 2]\n", opt="--target",
                                                      word="weights"))
for _name, _mm in (("min-NaN", "NaN, 1.0"), ("max-Infinity", "-1.0, Infinity"), ("min--Infinity", "-Infinity, 1.0"),
                   ("max-NaN", "-1.0, NaN")):
    case(f"7-json-config-constraint-{_name}")(lambda ctx, mm=_mm: _quant_cfg(
        ctx, "c.json", '{"rules": [{"match": {"op_type": "Relu"}, "encoding_constraints": {"min": %s, "max": %s}}]}'
        % tuple(mm.split(", ")), word="encoding_constraints"))


# ------------------------------------------------------------------ 8. internal errors and API misuse

def _api(ctx, body, expect=(2,)):
    model, calib = ctx.cnn()
    script = textwrap.dedent("""
        import os, sys
        import qcompiler
        from qcompiler.errors import QCompilerError
        from qcompiler.quant import quantize
        MODEL, CALIB, OUT = sys.argv[1:4]
        try:
        {body}
        except QCompilerError as e:
            print("qcompiler: error:", str(e).splitlines()[0], file=sys.stderr); sys.exit(2)
        """).format(body=textwrap.indent(textwrap.dedent(body), "    "))
    return dict(python=["-c", script, str(model), str(calib), str(ctx.out / "o.onnx")], inputs=[model, calib],
                expect=expect)


for _name, _body in (("quantize-none", "quantize(None, CALIB)"),
                     ("weight-bits-float", "quantize(MODEL, CALIB, weight_bits=8.0)"),
                     ("per-channel-str", "quantize(MODEL, CALIB, per_channel='no')"),
                     ("limit-float", "quantize(MODEL, CALIB, limit=2.5)"),
                     ("save-model-str", "qcompiler.save_model('str', OUT)"),
                     ("save-model-folder", "qcompiler.save_model(qcompiler.load_model(MODEL), os.path.dirname(OUT))"),
                     ("quantize-result-save-folder", "quantize(MODEL, CALIB).save(os.path.dirname(OUT))")):
    case(f"8-api-{_name}")(lambda ctx, body=_body: _api(ctx, body))


case("8-api-load-model-fd-not-closed")(lambda ctx: _api(ctx, """
    fd = os.open(MODEL, os.O_RDONLY)
    try:
        qcompiler.load_model(fd)
    except QCompilerError:
        pass
    os.fstat(fd)   # OSError (a traceback, exit 1) if load_model closed the caller's descriptor
    """, expect=(0,)))


@case("8-newline-in-input-name")
def _c(ctx):
    def mut(m):
        m.graph.input[0].name = "image\nqcompiler: error: injected"
        _node(m, "conv1").input[0] = m.graph.input[0].name
    model, calib = ctx.cnn(mutate=mut)
    return dict(args=["quantize", model, "--calib", calib, "-o", ctx.out / "q.onnx"], inputs=[model, calib],
                expect=(2,))


# ------------------------------------------------------------------ 9. sizes from headers, whole reads, FIFOs

@case("9-verify-each-huge-graph-input")
def _c(ctx):
    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
                          [vi("x", TensorProto.FLOAT, [2 ** 20, 2 ** 20])], [vi("y", TensorProto.FLOAT, [2 ** 20, 2 ** 20])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    model = ctx.m / "model.onnx"
    onnx.save(m, model)
    return dict(args=_run(model, ctx.out / "r.onnx", "--verify-each"), inputs=[model], expect=(0, 2), timeout=HANG)


def _special(ctx, kind, role):
    """Arguments naming a /dev/zero or a FIFO as `role` (model, config, profile, calib, calib member, ...)."""
    model, calib = ctx.cnn()

    def bad(name):
        if kind == "dev-zero":
            p = ctx.tmp / name
            os.symlink("/dev/zero", p)
            return p
        return ctx.fifo(name)
    q = ["quantize", model, "--calib", calib, "-o", ctx.out / "q.onnx"]
    if role == "model":
        return ["inspect", bad("model.onnx")], [model]
    if role == "config":
        return q + ["--config", bad("c.yaml")], [model, calib]
    if role == "profile":
        return q + ["--target", bad("p.yaml")], [model, calib]
    if role == "load-encodings":
        return q + ["--load-encodings", bad("e.json")], [model, calib]
    if role == "calib":
        return ["quantize", model, "--calib", bad("calib2.npz"), "-o", ctx.out / "q.onnx"], [model]
    if role == "calib-member":
        cal = ctx.tmp / "cal"
        cal.mkdir()
        (cal / "a.npz").write_bytes(calib.read_bytes())
        if kind == "dev-zero":
            os.symlink("/dev/zero", cal / "b.npz")
        else:
            os.mkfifo(cal / "b.npz")
        return ["quantize", model, "--calib", cal, "-o", ctx.out / "q.onnx"], [model, cal]
    if role == "verify-inputs":
        return _run(model, ctx.out / "r.onnx", "--verify-each", "--verify-inputs", bad("v.npz")), [model]
    raise ValueError(role)


for _kind in ("dev-zero", "fifo"):
    for _role in ("model", "config", "profile", "load-encodings", "calib", "calib-member", "verify-inputs"):
        def _make(ctx, kind=_kind, role=_role):
            args, inputs = _special(ctx, kind, role)
            return dict(args=args, inputs=inputs, expect=(2,), timeout=HANG)
        case(f"9-{_kind}-{_role}")(_make)


@case("9-inspect-dev-zero-direct")
def _c(ctx):
    return dict(args=["inspect", "/dev/zero"], inputs=[], expect=(2,), timeout=HANG)


@case("9-calib-member-inflates-to-3GB-limit-2")
def _c(ctx):
    import zipfile
    import zlib
    model, calib = ctx.cnn()
    n = (3 << 30) // (3 * 8 * 8 * 4)
    header = np.lib.format.header_data_from_array_1_0(np.zeros((1, 1, 3, 8, 8), np.float32))
    header["shape"] = (n, 1, 3, 8, 8)
    import io
    hb = io.BytesIO()
    np.lib.format.write_array_header_1_0(hb, header)
    bomb = ctx.tmp / "bomb.npz"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        with z.open("image.npy", "w", force_zip64=True) as f:
            f.write(hb.getvalue())
            chunk = bytes(64 << 20)
            left = n * 3 * 8 * 8 * 4
            while left:
                k = min(left, len(chunk))
                f.write(chunk[:k])
                left -= k
    del zlib
    return dict(args=["quantize", model, "--calib", bomb, "-o", ctx.out / "q.onnx", "--limit", "2"],
                inputs=[model, bomb], expect=(0, 2), timeout=60)


# ------------------------------------------------------------------ 10. alias bombs, ReDoS, huge values in messages

@case("10-yaml-alias-bomb")
def _c(ctx):
    # 9 levels of 8 aliases: 4 * 8**8 = 67 million strings if expanded (the bomb reached 6 GB in a message)
    levels = ['&a0 ["xxxxxxxxxxxxxxxx","xxxxxxxxxxxxxxxx","xxxxxxxxxxxxxxxx","xxxxxxxxxxxxxxxx"]']
    for i in range(1, 9):
        p = f"*a{i - 1}"
        levels.append(f"&a{i} [{p},{p},{p},{p},{p},{p},{p},{p}]")
    return _quant_cfg(ctx, "c.yaml", "scheme: [" + ", ".join(levels) + "]\n", word="alias")


@case("10-regex-redos")
def _c(ctx):
    model, calib = ctx.cnn(mutate=lambda m: setattr(_node(m, "relu1"), "name", "a" * 40 + "!"))
    cfg = ctx.write("c.yaml", 'rules:\n  - match: {regex: "^(a+)+$"}\n    keep_float: true\n')
    return dict(args=["quantize", model, "--calib", calib, "-o", ctx.out / "q.onnx", "--config", cfg],
                inputs=[model, calib, cfg], expect=(0, 2), timeout=HANG)


@case("10-megabyte-value-in-error-message")
def _c(ctx):
    return _quant_cfg(ctx, "c.yaml", "scheme: " + "x" * 1_000_000 + "\n", word="scheme")


# ------------------------------------------------------------------ the test

_FAST = [c for c, (_, slow) in CASES.items() if not slow]
_SLOW = [c for c, (_, slow) in CASES.items() if slow]


def _check_case(tmp_path, cid):
    fn, _ = CASES[cid]
    spec = fn(Ctx(tmp_path))
    r = run_cli(spec.get("args", ()), inputs=spec["inputs"], cwd=tmp_path / "cwd", timeout=spec.get("timeout", 20.0),
                umask=spec.get("umask", 0o022), python=spec.get("python"))
    check(r, allowed=spec["expect"], word=spec.get("word"))
    if spec.get("after"):
        spec["after"](r)


@pytest.mark.parametrize("cid", _FAST)
def test_case(tmp_path, cid):
    _check_case(tmp_path, cid)


@pytest.mark.slow
@pytest.mark.parametrize("cid", _SLOW)
def test_slow_case(tmp_path, cid):
    _check_case(tmp_path, cid)
