"""an If branch calibration never takes stays float and is reported (default), or, with
`--untaken-branches mirror` / `untaken_branches="mirror"`, is calibrated from the other branch where the values
are the same tensors (passes/quantize/untaken_branches.py, body_probe.mirror_untaken)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto as T
from onnx import helper

from qcompiler import model_to_proto
from qcompiler.cli import main
from qcompiler.errors import ArgumentError
from qcompiler.quant.api import quantize
from tests.helpers import make_model, tinfo
from tests.quant.body_models import _img_feeds, init, rand
from tests.quant.test_body_quantizers import bodies, check_sqnr


def if_shared_prefix():
    """If c: Conv -> Relu -> Conv -> Relu, else: the same Conv -> Relu -> Conv, then Sigmoid (all weights outer
    initializers both branches read). Calibrated with c always True: the else branch is never taken, and its
    first three values are the then branch's tensors."""
    def branch(tag, last):
        nodes = [helper.make_node("Conv", ["x", "w1", "b1"], [f"{tag}1"], pads=[1, 1, 1, 1], name=f"{tag}_conv1"),
                 helper.make_node("Relu", [f"{tag}1"], [f"{tag}2"], name=f"{tag}_relu"),
                 helper.make_node("Conv", [f"{tag}2", "w2", "b2"], [f"{tag}3"], name=f"{tag}_conv2"),
                 helper.make_node(last, [f"{tag}3"], [f"{tag}_out"], name=f"{tag}_last")]
        return helper.make_graph(nodes, tag, [], [tinfo(f"{tag}_out", [1, 4, 8, 8])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=branch("t", "Relu"), else_branch=branch("e", "Sigmoid"),
                              name="branch")]
    proto = make_model(nodes, [tinfo("x", [1, 3, 8, 8]), tinfo("c", [], T.BOOL)], [tinfo("y", [1, 4, 8, 8])],
                       [init("w1", rand((4, 3, 3, 3), 1, 0.3)), init("b1", rand((4,), 2, 0.1)),
                        init("w2", rand((4, 4, 1, 1), 3, 0.5)), init("b2", rand((4,), 4, 0.1))])
    return proto, _img_feeds(32, 0, True), [_img_feeds(8, 9, True), _img_feeds(8, 9, False)]


def _grid(enc) -> tuple:
    return (float(enc.scale), int(enc.zero_point), enc.bits, enc.signed)


def _q_per_branch(q):
    return {p: sum(1 for n in b.node if n.op_type == "QuantizeLinear") for p, b in bodies(q.graph)}


def test_default_leaves_the_untaken_branch_float_and_says_so():
    proto, calib, evals = if_shared_prefix()
    res = quantize(proto, calib)
    q = model_to_proto(res.model)
    found = _q_per_branch(q)
    assert found["branch/else_branch"] == 0 and found["branch/then_branch"] > 0, found
    (note,) = [n for n in res.report["notes"] if "never taken" in n]
    assert note.startswith("If 'branch' else_branch") and "activations stay float" in note
    assert "--untaken-branches mirror" in note
    check_sqnr(proto, q, evals)


def test_mirror_quantizes_the_untaken_branch_on_the_other_branch_grids():
    proto, calib, evals = if_shared_prefix()
    res = quantize(proto, calib, untaken_branches="mirror")
    q = model_to_proto(res.model)
    onnx.checker.check_model(q)
    found = _q_per_branch(q)
    assert found["branch/else_branch"] >= 2, found
    (note,) = [n for n in res.report["notes"] if "never taken" in n]
    assert "3 of 4 values calibrated from then_branch's statistics" in note and "1 stay float" in note, note
    plan = res.plan
    # a twin shares its observer: e2 is on exactly t2's grid; e3 (Conv -> Sigmoid, not a fused pair as t3's
    # Conv -> Relu is) gets a quantizer of its own from t3's statistics
    assert _grid(plan.values["e2"].encoding) == _grid(plan.values["t2"].encoding)
    assert not plan.values["e3"].keep_float and plan.values["e3"].encoding is not None
    assert "e_out" not in plan.dtypes   # Sigmoid has no twin: never observed, float
    # onnxruntime runs both branches; the idle branch's inputs reach the floor too
    check_sqnr(proto, q, evals)


def test_mirror_never_takes_both_branches_idle_or_changes_a_model_that_took_both():
    proto, _calib, evals = if_shared_prefix()
    both = _img_feeds(32, 0)   # c alternates: both branches taken
    plain = quantize(proto, both)
    mirrored = quantize(proto, both, untaken_branches="mirror")
    assert not [n for n in mirrored.report["notes"] if "never taken" in n]
    enc = {k: _grid(s.encoding) for k, s in plain.plan.values.items() if s.kind == "activation" and s.encoding}
    assert enc == {k: _grid(s.encoding) for k, s in mirrored.plan.values.items()
                   if s.kind == "activation" and s.encoding}


def test_untaken_branches_argument_checked():
    proto, calib, _ = if_shared_prefix()
    with pytest.raises(ArgumentError, match="untaken_branches must be one of float, mirror"):
        quantize(proto, calib, untaken_branches="copy")


def test_cli_flag(tmp_path):
    proto, calib, _ = if_shared_prefix()
    m, c = tmp_path / "m.onnx", tmp_path / "c.npz"
    onnx.save(proto, m)
    np.savez(c, x=np.stack([f["x"] for f in calib]), c=np.array([bool(f["c"]) for f in calib]))
    for mode, want in (("float", 0), ("mirror", 2)):
        out, rep = tmp_path / f"{mode}.onnx", tmp_path / f"{mode}.json"
        r = CliRunner().invoke(main, ["quantize", str(m), "--calib", str(c), "-o", str(out), "--report", str(rep),
                                      "--untaken-branches", mode, "-q"])
        assert r.exit_code == 0, r.output
        assert (_q_per_branch(onnx.load(out))["branch/else_branch"] >= want) and \
            (want or _q_per_branch(onnx.load(out))["branch/else_branch"] == 0)
        notes = json.loads(rep.read_text())["notes"]
        assert any("else_branch" in n and ("stay float" in n if mode == "float" else "calibrated from" in n)
                   for n in notes)
    r = CliRunner().invoke(main, ["quantize", str(m), "--calib", str(c), "-o", str(tmp_path / "x.onnx"),
                                  "--untaken-branches", "copy"])
    assert r.exit_code == 2 and "copy" in r.output


def test_mirror_with_bias_correction():
    """Both optional passes together: the idle branch's Convs are corrected from the captured x's means (observed in
    the main graph), the mirrored values keep their twins' grids, and onnxruntime runs both branches."""
    proto, calib, evals = if_shared_prefix()
    res = quantize(proto, calib, untaken_branches="mirror", bias_correction=True)
    assert any("bias correction on" in n and "inside If/Loop/Scan bodies" in n for n in res.report["notes"])
    assert _q_per_branch(model_to_proto(res.model))["branch/else_branch"] >= 2
    check_sqnr(proto, model_to_proto(res.model), evals)
