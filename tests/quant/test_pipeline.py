"""quantization as a pipeline of registered passes on one QuantContext.

The instrumentation flags of `run` reach every quantization pass; recipes put optional passes where they belong;
`--pipeline` is checked against the passes' contracts before any work; a third-party pass joins through the
entry point; the output opset is decided once; the plan is built once.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest

from qcompiler.errors import ArgumentError, PipelineError, QCompilerError, UnknownPassError
from qcompiler.passmanager import Instrumentation, PassManager, available_passes
from qcompiler.passmanager.facts import check_contracts
from qcompiler.passmanager.registry import parse_pipeline
from qcompiler.quant.api import quantize
from qcompiler.quant.core.pipeline import DEFAULT_PIPELINE, START_FACTS, build_pipeline, pipeline_for
from tests.helpers import ROOT, assert_one_line_error, run, sqnr_db

QUANT_PASSES = ("convert-opset", "calibrate", "place", "assign-encodings", "insert-qdq", "float16-islands",
                "measure-sqnr", "safety-net")


def _cli(*args, cwd=None, env=None):
    return subprocess.run([sys.executable, "-m", "qcompiler", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


def _paths(tiny):
    return tiny / "tiny_cnn.onnx", tiny / "tiny_cnn_calib.npz"


def test_default_pipeline_is_registered_passes_in_order():
    known = available_passes()
    assert all(n in known for n in DEFAULT_PIPELINE)
    assert [n for n in DEFAULT_PIPELINE if n in QUANT_PASSES] == list(QUANT_PASSES)
    check_contracts(parse_pipeline(DEFAULT_PIPELINE), START_FACTS)   # the default order keeps every contract


def test_recipe_places_each_pass_after_its_anchor():
    names = build_pipeline("bias-correction,load-encodings")
    assert names.index("bias-correction") == names.index("assign-encodings") + 1
    assert names.index("load-encodings") == names.index("place") + 1
    assert pipeline_for(None, None, bias_correction=True) == build_pipeline("bias-correction")


def test_time_passes_prints_a_row_per_quantization_pass(tiny, tmp_path):
    m, c = _paths(tiny)
    r = _cli("quantize", m, "--calib", c, "-o", tmp_path / "q.onnx", "--time-passes", "-q")
    assert r.returncode == 0, r.stderr
    rows = [ln.split()[-1] for ln in r.stderr.splitlines() if "%" in ln and ln.strip()[0].isdigit()]
    assert rows == list(DEFAULT_PIPELINE), r.stderr


def test_print_after_insert_qdq_shows_the_qdq_ir(tiny, tmp_path):
    m, c = _paths(tiny)
    r = _cli("quantize", m, "--calib", c, "-o", tmp_path / "q.onnx", "--print-after", "insert-qdq", "-q")
    assert r.returncode == 0, r.stderr
    assert "IR after insert-qdq (changed)" in r.stdout
    assert "QuantizeLinear(" in r.stdout and "DequantizeLinear(" in r.stdout
    assert "IR after calibrate" not in r.stdout


def test_verify_each_checks_every_pass_and_reports_the_sqnr_of_insert_qdq(tiny, tmp_path):
    m, c = _paths(tiny)
    r = _cli("quantize", m, "--calib", c, "-o", tmp_path / "q.onnx", "--verify-each", "-q")
    assert r.returncode == 0, r.stderr
    log = [ln for ln in r.stderr.splitlines() if ln.startswith("verify: ")]
    assert [ln.split(":")[1].strip() for ln in log] == list(DEFAULT_PIPELINE)
    line = next(ln for ln in log if ln.startswith("verify: insert-qdq"))
    db = float(line.rsplit(" ", 2)[-2])
    assert "onnxruntime runs it" in line and db > 25, line


def test_dump_dir_writes_the_model_after_every_pass(tiny, tmp_path):
    m, c = _paths(tiny)
    r = _cli("quantize", m, "--calib", c, "-o", tmp_path / "q.onnx", "--dump-dir", tmp_path / "d", "-q")
    assert r.returncode == 0, r.stderr
    files = sorted(os.listdir(tmp_path / "d"))
    assert files[0] == "00_input.onnx" and len(files) == len(DEFAULT_PIPELINE) + 1
    after = onnx.load(str(tmp_path / "d" / next(f for f in files if f.endswith("insert-qdq.onnx"))))
    assert any(n.op_type == "QuantizeLinear" for n in after.graph.node)


@pytest.mark.parametrize("flags, needle", [
    (("--recipe", "no-such-pass"), "unknown pass 'no-such-pass'"),
    (("--pipeline", "canonicalize,insert-qdq"), "pass 'insert-qdq' requires plan"),
    (("--pipeline", "canonicalize,calibrate,place,assign-encodings,insert-qdq"), "requires output-opset"),
    (("--recipe", "fold-constants"), "has no place in the default pipeline"),
    (("--print-after", "nope"), "not a pass of this pipeline"),
    (("--opset", "13", "--weight-bits", "4"), "--opset 13 cannot carry"),
    (("--pipeline", ",".join(DEFAULT_PIPELINE), "--bias-correction"), "no 'bias-correction' pass"),
])
def test_pipeline_mistakes_are_one_line_exit_2(tiny, tmp_path, flags, needle):
    m, c = _paths(tiny)
    r = _cli("quantize", m, "--calib", c, "-o", tmp_path / "q.onnx", *flags)
    assert_one_line_error(r, needle)
    assert not (tmp_path / "q.onnx").exists()


def test_run_refuses_a_quantization_pass_in_one_line(tiny, tmp_path):
    m, _ = _paths(tiny)
    r = _cli("run", m, "-o", tmp_path / "r.onnx", "--pipeline", "canonicalize,calibrate")
    assert_one_line_error(r, "'calibrate' is a quantization pass")


def test_recipe_equals_the_switch_and_both_change_the_model(tiny):
    m, c = _paths(tiny)
    plain = quantize(str(m), str(c))
    switch = quantize(str(m), str(c), bias_correction=True)
    recipe = quantize(str(m), str(c), recipe=["bias-correction"])
    assert [p.name for p, _ in recipe.passes] == [p.name for p, _ in switch.passes]
    assert "bias-correction" in recipe.report["pipeline"] and "bias-correction" not in plain.report["pipeline"]
    feeds = {"image": np.load(str(c))["image"][0]}
    a, b = run(recipe.model, feeds)[0], run(switch.model, feeds)[0]
    np.testing.assert_array_equal(a, b)
    assert any("bias correction on" in n for n in recipe.report["notes"])


def test_expert_pipeline_without_the_report_passes_still_quantizes(tiny):
    m, c = _paths(tiny)
    names = [n for n in DEFAULT_PIPELINE if n not in ("measure-sqnr", "safety-net")]
    res = quantize(str(m), str(c), pipeline=names)
    assert res.report["pipeline"] == names and res.report["output_sqnr_db"] == {}
    assert any(n.op_type == "QuantizeLinear" for n in res.model.graph.nodes)
    ref = quantize(str(m), str(c))
    feeds = {"image": np.load(str(c))["image"][0]}
    np.testing.assert_array_equal(run(res.model, feeds)[0], run(ref.model, feeds)[0])


def test_opset_is_decided_once_and_pinnable(tiny):
    m, c = _paths(tiny)
    seen = []

    class Opsets(Instrumentation):
        def after_pass(self, p, model, result):
            seen.append((p.name, model.opset))
    res = quantize(str(m), str(c), opset=21, instrumentations=[Opsets()])
    assert res.model.opset == 21
    after = [o for name, o in seen[seen.index(("convert-opset", 21)):]]
    assert set(after) == {21}   # nothing converts again later in the pipeline
    with pytest.raises(ArgumentError, match="cannot carry"):
        quantize(str(m), str(c), opset=13, weight_bits=4)


def test_plan_is_built_once(tiny, monkeypatch):
    import qcompiler.quant.placement as placement
    from qcompiler.passes.quantize import place as place_pass
    calls = []
    real = placement.build_plan

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)
    monkeypatch.setattr(place_pass, "build_plan", counting)
    m, c = _paths(tiny)
    quantize(str(m), str(c), bias_correction=True, weight_bits=4)
    assert len(calls) == 1


def test_hooks_unwind_on_a_user_error():
    from qcompiler.onnx_io import model_from_proto
    from qcompiler.passmanager import Pass, PassResult
    from tests.helpers import make_model, tinfo
    from onnx import helper

    class Refuse(Pass):
        name = "test-refuse"

        def run(self, model):
            raise QCompilerError("bad input")
    failed = []

    class Watch(Instrumentation):
        def after_pass_failed(self, p, model, error):
            failed.append((p.name, type(error).__name__))
    model = model_from_proto(make_model([helper.make_node("Relu", ["x"], ["y"], name="r")], [tinfo("x", [2])],
                                        [tinfo("y", [2])]))
    with pytest.raises(QCompilerError):
        PassManager(["canonicalize", Refuse()], [Watch()]).run(model)
    assert failed == [("test-refuse", "QCompilerError")]


def test_unknown_fact_in_a_contract_is_an_error():
    from qcompiler.passmanager import Pass

    class Sloppy(Pass):
        name = "test-sloppy"
        requires = ("plna",)
    with pytest.raises(PipelineError, match="unknown fact 'plna'"):
        check_contracts([Sloppy()])
    assert issubclass(PipelineError, UnknownPassError)


PLUGIN = '''
from qcompiler.passmanager import PassResult
from qcompiler.quant.core.context import QuantPass

class HalveFirstWeightScale(QuantPass):
    """A third-party quantization pass: after assign-encodings, it narrows one weight's grid."""
    name = "test-plugin-narrow"
    description = "a plug-in pass that edits the plan"
    requires = ("quant-context", "plan", "encodings")
    after = "assign-encodings"

    def run(self, ctx):
        ctx.notes.append("plug-in ran on %d weight uses" % sum(s.kind == "weight" for s in ctx.plan.uses.values()))
        return PassResult(False, {"seen": len(ctx.plan.uses)})
'''


def test_third_party_pass_runs_inside_recipe(tiny, tmp_path):
    (tmp_path / "qc_plugin_quant.py").write_text(textwrap.dedent(PLUGIN))
    dist = tmp_path / "qc_plugin_quant-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: qc-plugin-quant\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[qcompiler.passes]\ntest-plugin-narrow = qc_plugin_quant:HalveFirstWeightScale\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    m, c = _paths(tiny)
    out = tmp_path / "q.onnx"
    r = _cli("quantize", m, "--calib", c, "-o", out, "--recipe", "test-plugin-narrow", "--time-passes",
             "--report", tmp_path / "r.json", env=env)
    assert r.returncode == 0, r.stderr
    import json
    rep = json.loads((tmp_path / "r.json").read_text())
    i = rep["pipeline"].index("test-plugin-narrow")
    assert rep["pipeline"][i - 1] == "assign-encodings"
    assert any(n.startswith("plug-in ran on") for n in rep["notes"])
    assert "test-plugin-narrow" in r.stderr   # a timing row
    lst = _cli("list-passes", env=env)
    assert "test-plugin-narrow" in lst.stdout and "[after assign-encodings]" in lst.stdout
    q = onnx.load(str(out))
    feeds = {"image": np.load(str(c))["image"][0]}
    ref = run(onnx.load(str(m)), feeds)[0]
    assert sqnr_db(ref, run(q, feeds)[0]) > 25


def test_a_broken_plugin_is_named_never_silent(tiny, tmp_path):
    (tmp_path / "qc_plugin_broken.py").write_text("raise ImportError('needs torch')\n")
    dist = tmp_path / "qc_plugin_broken-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: qc-plugin-broken\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[qcompiler.passes]\ntest-broken = qc_plugin_broken:Pass\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), ROOT]))
    lst = _cli("list-passes", env=env)
    assert lst.returncode == 0 and "calibrate" in lst.stdout
    assert "plug-in 'test-broken' failed to load: ImportError: needs torch" in lst.stderr
    m, c = _paths(tiny)
    r = _cli("quantize", m, "--calib", c, "-o", tmp_path / "q.onnx", "--recipe", "test-broken", env=env)
    assert_one_line_error(r, "'test-broken' is a plug-in that failed to load (ImportError: needs torch)")


def test_measure_latency_reports_both_medians_and_the_kernels(tiny, tmp_path):
    m, c = _paths(tiny)
    r = _cli("quantize", m, "--calib", c, "-o", tmp_path / "q.onnx", "--measure-latency", "--report", tmp_path / "r.json")
    assert r.returncode == 0, r.stderr
    import json
    rep = json.loads((tmp_path / "r.json").read_text())
    lat, kern = rep["latency"], rep["kernels"]
    assert lat["float_ms"] > 0 and lat["quant_ms"] > 0 and lat["ratio"] == pytest.approx(
        lat["quant_ms"] / lat["float_ms"], rel=1e-3)
    assert kern["integer_nodes"] >= 2   # the Conv+Relu pairs and the Gemm of the tiny CNN
    assert all(v["integer"] or v.get("reason") or v["kernel"] == "removed" for v in kern["nodes"].values())
    assert rep["pipeline"][-1] == "measure-latency" and "latency: quantized" in r.stdout
