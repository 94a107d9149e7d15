"""Start-up: each command imports only what it uses (the quantizer and onnxruntime load for `quantize` and for
what runs a model), and the lazily loaded `quantize` is listed by `qcompiler --help` as click would list it."""
import json
import subprocess
import sys

import click
import onnx
from click.testing import CliRunner
from onnx import TensorProto, helper

HEAVY = ("onnx", "numpy", "onnxruntime", "qcompiler.quant.api", "qcompiler.ir")

PROBE = """
import json, sys
from qcompiler.cli import main
try:
    main(sys.argv[1:], prog_name="qcompiler")
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "loaded": [m for m in %r if m in sys.modules]}), file=sys.stderr)
""" % (HEAVY,)


def _probe(*args) -> dict:
    """Run the CLI in a fresh interpreter; its exit code and which heavy modules it imported."""
    r = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=300)
    return json.loads(r.stderr.strip().splitlines()[-1])


def _model(path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                           helper.make_node("Neg", ["r"], ["y"], name="neg")], "g", [x], [y])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_help_imports_no_onnx_numpy_or_quantizer():
    r = _probe("--help")
    assert r == {"code": 0, "loaded": []}


def test_run_inspect_match_do_not_import_the_quantizer_or_onnxruntime(tmp_path):
    m = _model(tmp_path / "m.onnx")
    r = _probe("run", str(m), "-o", str(tmp_path / "o.onnx"), "--pipeline", "canonicalize")
    assert r["code"] in (0, None) and "onnxruntime" not in r["loaded"] and "qcompiler.quant.api" not in r["loaded"]
    assert [n.op_type for n in onnx.load(str(tmp_path / "o.onnx")).graph.node] == ["Relu", "Neg"]
    for args in (("inspect", str(m)), ("match", str(m), "layernorm")):
        r = _probe(*args)
        assert r["code"] in (0, None), args
        assert "onnxruntime" not in r["loaded"] and "qcompiler.quant.api" not in r["loaded"], (args, r)


def test_lazy_command_listed_as_when_loaded():
    """The summary `qcompiler --help` shows for `quantize` before it is loaded is the one its own help gives."""
    from qcompiler import cli
    lazy = CliRunner().invoke(cli.main, ["--help"], terminal_width=100).output
    for name, (load, summary) in cli.LAZY_COMMANDS.items():
        cmd = load()
        assert " ".join(cmd.help.split("\n\n")[0].split()) == summary, name
    group = click.Group(commands={**cli.main.commands, **{n: load() for n, (load, _) in cli.LAZY_COMMANDS.items()}})
    listing = click.HelpFormatter(width=100)
    group.format_commands(click.Context(group), listing)
    assert listing.getvalue() in lazy
    assert CliRunner().invoke(cli.main, ["quantize", "--help"]).exit_code == 0


def test_public_names_load_on_first_use():
    import qcompiler
    import qcompiler.quant
    from qcompiler import load_model
    from qcompiler.quant import PROFILES, quantize
    assert callable(load_model) and callable(quantize) and PROFILES
    for mod in (qcompiler, qcompiler.quant):
        assert all(getattr(mod, n) is not None for n in mod.__all__)
        try:
            mod.no_such_name
        except AttributeError as e:
            assert "no_such_name" in str(e)
        else:
            raise AssertionError(f"{mod.__name__}.no_such_name resolved")
