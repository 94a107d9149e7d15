"""Pass manager: registry (incl. entry points), instrumentation hooks, verify-each catching a broken pass."""
import io
import os
import textwrap

import numpy as np
import pytest
from onnx import TensorProto, helper

from qcompiler.errors import PassError, UnknownPassError, VerificationError
from qcompiler.ir import verify
from qcompiler.onnx_io import model_from_proto
from qcompiler.passmanager import Pass, PassManager, PassResult, available_passes, registry, run_pipeline
from qcompiler.passmanager.instrumentation import DumpONNX, PrintIR, Statistics, Timing, Verifier
from tests.helpers import make_model, run, tinfo


def _model():
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 3], np.eye(3, dtype=np.float32).ravel() * 2)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"], name="mm"),
             helper.make_node("Identity", ["mm"], ["id"], name="id"),
             helper.make_node("Relu", ["id"], ["y"], name="relu"),
             helper.make_node("Neg", ["x"], ["dead"], name="dead")]
    return model_from_proto(make_model(nodes, [tinfo("x", [2, 3])], [tinfo("y", [2, 3])], [w]))


class BreakNumerics(Pass):
    name = "test-break-numerics"
    description = "multiplies the output by 2 while claiming to preserve semantics"

    def run(self, model):
        g = model.graph
        out = g.outputs[0]
        two = g.add_constant(np.array(2.0, np.float32), "two")
        g.insert_after(out, "Mul", [two])
        return PassResult(True, {"broken": 1})


class BreakIR(Pass):
    name = "test-break-ir"

    def run(self, model):
        g = model.graph
        node = g.nodes_by_op("Relu")[0]
        node.inputs[0] = g.value("x")  # bypasses the mutation API: the checker must notice
        return PassResult(True)


def test_unknown_pass_lists_known_names():
    with pytest.raises(UnknownPassError, match="unknown pass 'nope'.*canonicalize"):
        PassManager("canonicalize,nope")


def test_pipeline_runs_and_instrumentation_reports(tmp_path):
    m = _model()
    timing, stats, buf = Timing(), Statistics(), io.StringIO()
    pm = PassManager("canonicalize,fold-constants,shape-inference",
                     [Verifier(), timing, stats, PrintIR(["canonicalize"], stream=buf), DumpONNX(str(tmp_path))])
    results = pm.run(m)
    verify(m.graph)
    assert [p.name for p, _ in results] == ["canonicalize", "fold-constants", "shape-inference"]
    assert results[0][1].stats["identities_removed"] == 1 and results[0][1].stats["dead_nodes_removed"] == 1
    assert "IR after canonicalize" in buf.getvalue() and "Relu" in buf.getvalue()
    assert "IR after fold-constants" not in buf.getvalue()
    assert len(timing.rows) == 3 and "canonicalize" in timing.report()
    assert "identities_removed: 1" in stats.report()
    assert sorted(os.listdir(tmp_path)) == ["00_input.onnx", "01_canonicalize.onnx", "02_fold-constants.onnx",
                                            "03_shape-inference.onnx"]
    x = np.random.rand(2, 3).astype(np.float32)
    assert np.allclose(run(m, {"x": x})[0], np.maximum(2 * x, 0))


def test_verify_each_names_the_output_that_differs():
    m = _model()
    with pytest.raises(VerificationError, match=r"after pass 'test-break-numerics': output 'y' differs: max abs diff"):
        PassManager([BreakNumerics()], [Verifier()]).run(m)


def test_verify_each_catches_ir_corruption():
    m = _model()
    with pytest.raises(PassError, match="IR invariants violated after pass 'test-break-ir'"):
        PassManager([BreakIR()], [Verifier(numeric=False)]).run(m)


def test_failing_pass_names_itself_and_predecessors():
    class Boom(Pass):
        name = "test-boom"

        def run(self, model):
            raise RuntimeError("kaboom")
    with pytest.raises(PassError, match=r"pass 'test-boom' failed \(passes run before it: canonicalize\).*kaboom"):
        run_pipeline(_model(), ["canonicalize", Boom()])


def test_entry_point_plugin_is_found(tmp_path, monkeypatch):
    pkg = tmp_path / "qc_plugin_demo.py"
    pkg.write_text(textwrap.dedent('''
        from qcompiler.passmanager import Pass, PassResult
        class Demo(Pass):
            name = "demo-plugin"
            description = "a third-party pass"
            def run(self, model):
                return PassResult(False, {"seen_nodes": len(model.graph)})
    '''))
    dist = tmp_path / "qc_plugin_demo-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: qc-plugin-demo\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[qcompiler.passes]\ndemo-plugin = qc_plugin_demo:Demo\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    assert "demo-plugin" in available_passes()
    (p, r), = run_pipeline(_model(), "demo-plugin")
    assert r.stats == {"seen_nodes": 4}
