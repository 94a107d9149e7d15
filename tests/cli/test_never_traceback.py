"""Never a traceback.

- A model onnxruntime refuses (or a run it fails) is one stderr line naming the model (or the sample) and
  onnxruntime's reason, exit 2, no output file, and none of onnxruntime's own log lines ahead of ours.
- A bug is one line naming the exception and a private file holding the traceback, exit 1; out of memory and
  Ctrl-C are one line too; click's usage errors keep click's form.
- The Python API raises documented QCompilerError kinds (ArgumentError) for wrong argument types and ranges.
"""
import json
import os
import stat
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto as TP
from onnx import helper

from qcompiler.cli import main
from qcompiler.errors import (ArgumentError, ConfigError, InvalidModelError, OnnxRuntimeError, QCompilerError,
                              VerificationError)
from qcompiler.ort_session import ort_reason

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _vi(name, shape, dtype=TP.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _model(nodes, inputs, outputs, inits=(), opsets=(("", 17),)):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = 8
    return m


X = _vi("x", [1, 3, 4, 4])
Y = _vi("y", ["n", "c", "h", "w"])


def _weight(n=6):
    w = helper.make_tensor("w", TP.FLOAT, [2, 3, 1, 1], np.ones(6, np.float32))
    del w.float_data[:]
    w.float_data.extend([1.0] * n)   # n != 6: the typed field does not fit the dims
    return w


def _conv(**attrs):
    return _model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv", **attrs)], [X], [Y], [_weight()])


def _relu(opset):
    return _model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [X], [Y], opsets=(("", opset),))


def _two(op_type, domain="", opsets=(("", 17),)):
    return _model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                   helper.make_node(op_type, ["r"], ["y"], name="second", domain=domain)], [X], [Y], opsets=opsets)


def _strides_as_string():
    m = _conv()
    m.graph.node[0].attribute.append(helper.make_attribute("strides", "11"))
    return m


def _no_type():
    m = _relu(17)
    m.graph.input[0].ClearField("type")
    return m


def _empty_op():
    m = _two("Relu")
    m.graph.node[1].op_type = ""
    return m


def _short_data():
    return _model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], [X], [Y], [_weight(5)])


def _recursive_function():
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("local", 1)]
    f = helper.make_function("local", "Rec", ["a"], ["b"], [helper.make_node("Rec", ["a"], ["b"], domain="local")],
                             opsets)
    g = helper.make_graph([helper.make_node("Rec", ["x"], ["y"], domain="local", name="rec")], "g", [X], [Y])
    m = helper.make_model(g, opset_imports=opsets, functions=[f])
    m.ir_version = 8
    return m


def _undefined_dtype():
    t = helper.make_tensor("w", TP.FLOAT, [1], [1.0])
    t.data_type = TP.UNDEFINED
    return _model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [X], [Y], [t])


# name -> (model, what the one line must mention besides the file name)
HOSTILE = {
    "short_data": (_short_data, "5"),
    "opset_99": (lambda: _relu(99), "99"),
    "opset_2_62": (lambda: _relu(2 ** 62), ""),
    "unknown_op": (lambda: _two("FrobnicateX"), "FrobnicateX"),
    "unknown_domain": (lambda: _two("Foo", "evil.dom", (("", 17), ("evil.dom", 1))), "evil.dom"),
    "strides_string": (_strides_as_string, "strides"),
    "negative_kernel": (lambda: _conv(kernel_shape=[-1, -1]), "kernel_shape"),
    "group_0": (lambda: _conv(group=0), "group"),
    "input_without_type": (_no_type, "type"),
    "empty_op_type": (_empty_op, "op_type"),
    "recursive_function": (_recursive_function, "ecursive"),
    "undefined_dtype": (_undefined_dtype, "type"),
}

# one process runs every case through the CLI with fd 2 sent to a file per case: onnxruntime's C++ logger writes
# to fd 2 directly, so this sees exactly what a terminal would
DRIVER = textwrap.dedent("""
    import json, os, sys
    from qcompiler.cli import main
    out = {}
    for key, args, err in json.loads(sys.argv[1]):
        sys.stderr.flush()
        saved = os.dup(2)
        fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
        try:
            main(args, prog_name="qcompiler")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        out[key] = code
    print(json.dumps(out))
""")


def _assert_one_line(err: str, code: int, want_code: int, *needles):
    assert code == want_code, (code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert "Traceback" not in err and "onnxruntime:" not in err and "onnxruntime_src" not in line, err
    assert ".cc:" not in line and "[ONNXRuntimeError]" not in line, line
    for n in needles:
        assert n in line, (n, line)
    return line


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    for name, (build, _) in HOSTILE.items():
        onnx.save(build(), str(d / f"{name}.onnx"))
    np.savez(d / "x.npz", x=np.random.default_rng(0).random((2, 1, 3, 4, 4), dtype=np.float32))
    return d


def test_onnxruntime_refusals_are_one_line_exit_2(hostile, tmp_path):
    jobs = []
    for name in HOSTILE:
        model = str(hostile / f"{name}.onnx")
        jobs.append((f"quantize:{name}", ["quantize", model, "--calib", str(hostile / "x.npz"),
                                          "-o", str(tmp_path / f"q_{name}.onnx")], str(tmp_path / f"q_{name}.err")))
        jobs.append((f"run:{name}", ["run", model, "--pipeline", "canonicalize,fold-constants", "--verify-each",
                                     "-o", str(tmp_path / f"r_{name}.onnx")], str(tmp_path / f"r_{name}.err")))
        jobs.append((f"debug:{name}", ["debug", model, model, "--calib", str(hostile / "x.npz")],
                     str(tmp_path / f"d_{name}.err")))
    r = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(jobs)], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    codes = json.loads(r.stdout.strip().splitlines()[-1])
    for key, _, err in jobs:
        cmd, name = key.split(":")
        with open(err) as f:
            text = f.read()
        line = _assert_one_line(text, codes[key], 2, f"{name}.onnx")
        assert HOSTILE[name][1] in line, (key, line)
        assert line.startswith("qcompiler: error: "), line
        assert not os.path.exists(tmp_path / f"{cmd[0]}_{name}.onnx"), key


def _qc(*args, env=None):
    return subprocess.run([sys.executable, "-m", "qcompiler", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=60)


def test_gather_out_of_range_token_ids_exactly_one_stderr_line(tmp_path):
    emb = helper.make_tensor("emb", TP.FLOAT, [10, 4], np.ones(40, np.float32))
    m = _model([helper.make_node("Gather", ["emb", "ids"], ["y"], name="lookup")], [_vi("ids", [1, 3], TP.INT64)],
               [_vi("y", [1, 3, 4])], [emb])
    onnx.save(m, str(tmp_path / "tok.onnx"))
    np.savez(tmp_path / "ids.npz", ids=np.array([[[0, 1, 2]], [[1, 2, 99]]], np.int64))
    r = _qc("quantize", str(tmp_path / "tok.onnx"), "--calib", str(tmp_path / "ids.npz"), "-o", str(tmp_path / "q.onnx"))
    line = _assert_one_line(r.stderr, r.returncode, 2, "tok.onnx", "calibration sample 1", "lookup", "idx=99")
    assert "[E:" not in r.stderr and "[W:" not in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / "q.onnx")
    assert len(line) < 400


def test_verify_inputs_that_onnxruntime_cannot_run_name_the_file(tmp_path):
    emb = helper.make_tensor("emb", TP.FLOAT, [10, 4], np.ones(40, np.float32))
    m = _model([helper.make_node("Gather", ["emb", "ids"], ["y"], name="lookup")], [_vi("ids", [1, 3], TP.INT64)],
               [_vi("y", [1, 3, 4])], [emb])
    onnx.save(m, str(tmp_path / "tok.onnx"))
    np.savez(tmp_path / "ids.npz", ids=np.array([[1, 2, 99]], np.int64))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "tok.onnx"), "--pipeline", "canonicalize", "--verify-each",
                                  "--verify-inputs", str(tmp_path / "ids.npz"), "-o", str(tmp_path / "o.onnx")])
    _assert_one_line(r.stderr, r.exit_code, 2, "tok.onnx: onnxruntime failed on the verification inputs", "ids.npz",
                     "idx=99")
    assert not os.path.exists(tmp_path / "o.onnx")


def test_session_refusal_logs_nothing_of_its_own(tmp_path):
    # NOTE: a model the importer's own checks pass (short tensor data is refused before onnxruntime sees it)
    onnx.save(_model([helper.make_node("NoSuchOp", ["x"], ["y"], name="odd")], [X], [Y], []),
              str(tmp_path / "unknown.onnx"))
    np.savez(tmp_path / "x.npz", x=np.ones((1, 1, 3, 4, 4), np.float32))
    r = _qc("quantize", str(tmp_path / "unknown.onnx"), "--calib", str(tmp_path / "x.npz"), "-o", str(tmp_path / "q.onnx"))
    _assert_one_line(r.stderr, r.returncode, 2, "unknown.onnx", "onnxruntime refuses the model", "NoSuchOp")


def test_config_activation_bits_32_is_one_line(tmp_path):
    w = helper.make_tensor("w", TP.FLOAT, [2, 3, 1, 1], np.ones(6, np.float32))
    onnx.save(_model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], [X], [Y], [w]),
              str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "x.npz", x=np.ones((2, 1, 3, 4, 4), np.float32))
    (tmp_path / "c.yaml").write_text("activations: {bits: 32}\n")
    r = CliRunner().invoke(main, ["quantize", str(tmp_path / "m.onnx"), "--calib", str(tmp_path / "x.npz"),
                                  "-o", str(tmp_path / "q.onnx"), "--config", str(tmp_path / "c.yaml")])
    _assert_one_line(r.stderr, r.exit_code, 2)
    assert not os.path.exists(tmp_path / "q.onnx")


def test_ort_reason_cuts_codes_locations_and_signatures():
    class Fail(Exception):
        pass
    cases = {
        "[ONNXRuntimeError] : 1 : FAIL : Exception during initialization: /onnxruntime_src/onnxruntime/core/"
        "optimizer/initializer.cc:51 onnxruntime::Initializer::Initializer(const onnx::TensorProto&, const "
        "std::filesystem::__cxx11::path&) [ONNXRuntimeError] : 1 : FAIL : tensorprotoutils.cc:1805 "
        "ValidateEmbeddedTensorProtoDataSizeAndShape Initializer 'w': data field count (5) does not match":
            "Initializer 'w': data field count (5) does not match",
        "[ONNXRuntimeError] : 1 : FAIL : Non-zero status code returned while running Conv node. Name:'c' Status "
        "Message: nchwc_ops.cc:166 Compute NCHWc Conv group must be greater than 0.":
            "node 'c' (Conv): NCHWc Conv group must be greater than 0.",
        "[ONNXRuntimeError] : 10 : INVALID_GRAPH : Load model from /tmp/x/model.onnx failed:This is an invalid "
        "model. In Node, (\"n\", Foo, \"\", -1) : (\"x\": tensor(float),) -> (\"y\": tensor(float),) , Error No Op "
        "registered for Foo with domain_version of 17":
            "node 'n' (Foo): No Op registered for Foo with domain_version of 17",
        "[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : Got invalid dimensions for input: x for the following "
        "indices\n index: 3 Got: 2 Expected: 4\n Please fix either the inputs/outputs or the model.":
            "Got invalid dimensions for input: x for the following indices index: 3 Got: 2 Expected: 4 Please fix "
            "either the inputs/outputs or the model.",
    }
    for raw, want in cases.items():
        assert ort_reason(Fail(raw)) == want
    assert len(ort_reason(Fail("x" * 10000))) <= 240
    assert ort_reason(Fail("")) == "Fail"


def test_verifier_blames_the_input_or_the_pass_rightly():
    from qcompiler.onnx_io import model_from_proto
    from qcompiler.ort_session import model_label
    from qcompiler.passmanager import Pass, PassManager, PassResult
    from qcompiler.passmanager.instrumentation import Verifier

    class Unrunnable(Pass):
        name = "test-unrunnable"

        def run(self, model):
            n = model.graph.nodes_by_op("Relu")[0]
            n.domain = "evil.dom"
            model.opset_imports["evil.dom"] = 1
            return PassResult(True)

    with model_label("in.onnx"), pytest.raises(OnnxRuntimeError, match=r"^in.onnx: onnxruntime refuses the model: "
                                                                         r".*evil.dom:Foo"):
        PassManager("canonicalize", [Verifier()]).run(model_from_proto(HOSTILE["unknown_domain"][0]()))
    with pytest.raises(InvalidModelError, match=r"^onnx.checker rejects the model: .*op_type"):
        PassManager("canonicalize", [Verifier()]).run(model_from_proto(_empty_op()))
    with pytest.raises(VerificationError, match=r"after pass 'test-unrunnable': onnxruntime can no longer run the "
                                                r"model: .*evil.dom:Relu"):
        PassManager([Unrunnable()], [Verifier(checker=False)]).run(model_from_proto(_relu(17)))


# ---------------------------------------------------------------------------------------------- internal errors

CRASH = textwrap.dedent("""
    import sys
    from qcompiler import cli
    import qcompiler.inspect_model as im
    def boom(*a, **k):
        raise RuntimeError("boom in the inspector\\nsecond line of the message")
    im.inspect_model = boom
    cli.main(sys.argv[1:], prog_name="qcompiler")
""")


def test_internal_error_is_one_line_and_a_private_traceback_file(tmp_path):
    m = tmp_path / "m.onnx"
    onnx.save(_relu(17), str(m))
    env = dict(os.environ, QCOMPILER_CRASH_DIR=str(tmp_path / "crash"))
    os.mkdir(tmp_path / "crash")
    r = subprocess.run([sys.executable, "-c", CRASH, "inspect", str(m)], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=60)
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("qcompiler: internal error: RuntimeError: boom in the inspector; full traceback in ")
    path = lines[0].rsplit("full traceback in ", 1)[1]
    assert os.path.dirname(path) == str(tmp_path / "crash") and os.path.basename(path).startswith("qcompiler-crash-")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    text = open(path).read()
    assert "Traceback (most recent call last)" in text and "def boom" not in text and "in boom" in text
    assert "second line of the message" in text and "inspect" in text


def _invoke_raising(monkeypatch, tmp_path, exc):
    import qcompiler.inspect_model as im

    def boom(*a, **k):
        raise exc
    monkeypatch.setattr(im, "inspect_model", boom)
    monkeypatch.setenv("QCOMPILER_CRASH_DIR", str(tmp_path))
    m = tmp_path / "m.onnx"
    onnx.save(_relu(17), str(m))
    return CliRunner().invoke(main, ["inspect", str(m)])


def test_memory_error_keyboard_interrupt_and_a_bug(monkeypatch, tmp_path):
    r = _invoke_raising(monkeypatch, tmp_path, MemoryError("Unable to allocate 8.00 TiB for an array"))
    _assert_one_line(r.stderr, r.exit_code, 1, "ran out of memory", "8.00 TiB")
    r = _invoke_raising(monkeypatch, tmp_path, KeyboardInterrupt())
    _assert_one_line(r.stderr, r.exit_code, 130, "interrupted")
    r = _invoke_raising(monkeypatch, tmp_path, KeyError(0))
    line = _assert_one_line(r.stderr, r.exit_code, 1, "internal error: KeyError: 0; full traceback in ")
    assert os.path.isfile(line.rsplit(" ", 1)[1])
    # bad input stays exit 2, with no crash file
    before = set(os.listdir(tmp_path))
    r = _invoke_raising(monkeypatch, tmp_path, ConfigError("c.yaml: bad \x1b[31mkey\x1b[0m"))
    line = _assert_one_line(r.stderr, r.exit_code, 2, "c.yaml: bad \\x1b[31mkey")
    assert "\x1b" not in r.stderr and set(os.listdir(tmp_path)) == before


def test_a_crashing_pass_is_exit_1_with_its_traceback_kept(monkeypatch, tmp_path):
    from qcompiler.passmanager import registry
    cls = registry.available_passes()["canonicalize"]

    def boom(self, model):
        raise RuntimeError("canonicalize broke")
    monkeypatch.setattr(cls, "run", boom)
    monkeypatch.setenv("QCOMPILER_CRASH_DIR", str(tmp_path))
    onnx.save(_relu(17), str(tmp_path / "m.onnx"))
    r = CliRunner().invoke(main, ["run", str(tmp_path / "m.onnx"), "--pipeline", "canonicalize",
                                  "-o", str(tmp_path / "o.onnx")])
    line = _assert_one_line(r.stderr, r.exit_code, 1, "pass 'canonicalize' failed", "canonicalize broke",
                            "full traceback in ")
    assert "in boom" in open(line.rsplit(" ", 1)[1]).read()


def test_click_usage_errors_keep_clicks_form():
    r = CliRunner().invoke(main, ["run", "m.onnx", "--bogus"])
    assert r.exit_code == 2 and "Usage:" in r.stderr and "No such option" in r.stderr
    r = CliRunner().invoke(main, ["quantize", "m.onnx", "--calib", "c.npz", "-o", "q.onnx", "--weight-bits", "x"])
    assert r.exit_code == 2 and "Usage:" in r.stderr and "'x' is not a valid integer" in r.stderr
    r = CliRunner().invoke(main, ["--help"])
    assert r.exit_code == 0 and "quantize" in r.stdout


def test_weight_bits_7_on_the_cli_is_one_line(tmp_path):
    r = CliRunner().invoke(main, ["quantize", "m.onnx", "--calib", "c.npz", "-o", str(tmp_path / "q.onnx"),
                                  "--weight-bits", "7"])
    _assert_one_line(r.stderr, r.exit_code, 2, "weight_bits: bit width must be one of 4, 8, 16, got 7", "4, 8, 16")


# ---------------------------------------------------------------------------------------------- Python API misuse

def _feeds():
    return [{"x": np.ones((1, 3, 4, 4), np.float32)}]


@pytest.mark.parametrize("kwargs, needle", [
    ({"model_or_path": None}, "model must be a path, an onnx.ModelProto or a qcompiler Model, got None"),
    ({"model_or_path": 3}, "got 3"),
    ({"model_or_path": ""}, "model path is empty"),
    ({"model_or_path": "a\x00b.onnx"}, "NUL byte"),
    ({"calib": None}, "calib must be"),
    ({"calib": {"x": np.ones(3)}}, "wrap it in a list"),
    ({"weight_bits": 8.0}, "weight_bits: bit width must be one of 4, 8, 16, got 8.0"),
    ({"weight_bits": "8"}, "weight_bits: bit width must be one of 4, 8, 16, got '8'"),
    ({"weight_bits": True}, "weight_bits: bit width must be one of 4, 8, 16, got True"),
    ({"weight_bits": 7}, "weight_bits: bit width must be one of 4, 8, 16, got 7"),
    ({"weight_bits": 33}, "weight_bits: bit width must be one of 4, 8, 16, got 33"),
    ({"act_bits": 8.0}, "act_bits: bit width must be one of 4, 8, 16, got 8.0"),
    ({"act_bits": "8"}, "act_bits: bit width must be one of 4, 8, 16, got '8'"),
    ({"act_bits": True}, "act_bits: bit width must be one of 4, 8, 16, got True"),
    ({"act_bits": 7}, "act_bits: bit width must be one of 4, 8, 16, got 7"),
    ({"act_bits": 33}, "act_bits: bit width must be one of 4, 8, 16, got 33"),
    ({"per_channel": "no"}, "per_channel must be True or False, got 'no'"),
    ({"limit": 2.5}, "limit must be a positive integer, got 2.5"),
    ({"limit": -1}, "got -1"),
    ({"limit": True}, "got True"),
    ({"weight_bits": 10 ** 100}, "weight_bits: bit width must be one of 4, 8, 16, got an integer of"),
    ({"target": 5}, "target must be"),
    ({"scheme": 3}, "scheme must be"),
    ({"config": 5}, "config must be a path"),
    ({"load_encodings": 1.5}, "load_encodings must be a path"),
    ({"bias_correction": "yes"}, "bias_correction must be True or False"),
    ({"progress": 1}, "progress must be True or False"),
    ({"weight_block": 2.5}, "must be a positive number of elements"),
])
def test_quantize_argument_errors(kwargs, needle):
    from qcompiler.quant.api import quantize
    args = {"model_or_path": _relu(17), "calib": _feeds()}
    args.update(kwargs)
    with pytest.raises(ArgumentError) as ei:
        quantize(**args)
    msg = str(ei.value)
    assert needle in msg and "\n" not in msg and len(msg) < 200, msg
    assert isinstance(ei.value, QCompilerError) and isinstance(ei.value, ConfigError)


def test_quantize_accepts_every_documented_form(tmp_path):
    from qcompiler.onnx_io import model_from_proto
    from qcompiler.quant.api import quantize
    onnx.save(_relu(17), str(tmp_path / "m.onnx"))
    for m in (_relu(17), model_from_proto(_relu(17)), str(tmp_path / "m.onnx"), tmp_path / "m.onnx"):
        res = quantize(m, iter(_feeds()), weight_bits=8, act_bits=16, limit=1, per_channel=False, progress=False)
        assert res.stats["samples"] == 1


def test_save_model_of_a_non_model_is_an_argument_error(tmp_path):
    from qcompiler.onnx_io import save_model
    for bad, hint in (("str", "load_model"), (_relu(17), "model_from_proto"), (None, "None")):
        with pytest.raises(ArgumentError, match=f"save_model: model must be a qcompiler Model, got .*{hint}"):
            save_model(bad, str(tmp_path / "o.onnx"))
    assert os.listdir(tmp_path) == []


def test_load_model_of_an_integer_leaves_the_callers_descriptor_open(tmp_path):
    from qcompiler.onnx_io import load_model
    onnx.save(_relu(17), str(tmp_path / "m.onnx"))
    fd = os.open(str(tmp_path / "m.onnx"), os.O_RDONLY)
    try:
        for bad in (fd, None, 2.5):
            with pytest.raises(QCompilerError, match="model path must be"):
                load_model(bad)
        os.fstat(fd)   # still open
    finally:
        os.close(fd)


def test_a_later_run_removes_session_folders_a_killed_run_left(tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = tmp_path / f"qcompiler-session-{int(dead.stdout)}-abc"
    left.mkdir()
    (left / "model.onnx").write_bytes(b"x" * 1000)
    mine = tmp_path / f"qcompiler-session-{os.getpid()}-abc"   # a live process's folder stays
    mine.mkdir()
    onnx.save(_relu(17), str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "x.npz", x=np.ones((1, 1, 3, 4, 4), np.float32))
    r = _qc("quantize", str(tmp_path / "m.onnx"), "--calib", str(tmp_path / "x.npz"), "-o", str(tmp_path / "q.onnx"),
            env=env)
    assert r.returncode == 0, r.stderr
    assert not left.exists() and mine.exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith("qcompiler-session-") and p != mine.name]


def test_quantize_takes_bytes_and_path_objects_as_paths(tmp_path):
    from qcompiler.quant.api import quantize
    onnx.save(_relu(17), str(tmp_path / "m.onnx"))
    np.savez(tmp_path / "x.npz", x=np.ones((2, 1, 3, 4, 4), np.float32))
    for m, c in ((os.fsencode(tmp_path / "m.onnx"), os.fsencode(tmp_path / "x.npz")),
                 (tmp_path / "m.onnx", tmp_path / "x.npz")):
        assert quantize(m, c).stats["samples"] == 2
