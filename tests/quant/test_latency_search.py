"""`--optimize latency` takes out Q/DQ pairs between float kernels under a stated accuracy budget
(passes/quantize/latency_search.py, `--latency-budget-db`), and never goes below it."""
import json
import subprocess
import sys

import numpy as np
import pytest
from onnx import helper, numpy_helper

from qcompiler.quant.api import quantize
from qcompiler.errors import ArgumentError
from tests.helpers import make_model, tinfo


@pytest.fixture(autouse=True)
def _no_size_rule(monkeypatch):
    """These models are tiny: without the size rule (placement/cost.py; tests/quant/test_size_rule.py) their
    integer kernels stay under --optimize latency, as the rules under test need."""
    from qcompiler.quant.placement import float_regions
    monkeypatch.setattr(float_regions, "small_regions", lambda *a: set())


def _model():
    """Conv+Relu (integer), then float ops whose Q/DQ pairs only cost time: Softplus, Tanh, Sin, Sub of two
    identically quantized branches (their rounding errors cancel while both stay on the grid), Conv+Relu."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((8, 8, 1, 1)) * 0.3).astype(np.float32), "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Softplus", ["r1"], ["a"], name="spa"),
             helper.make_node("Softplus", ["r1"], ["b"], name="spb"),
             helper.make_node("Exp", ["a"], ["ea"], name="expa"),
             helper.make_node("Exp", ["b"], ["eb"], name="expb"),
             helper.make_node("Sub", ["ea", "eb"], ["d"], name="sub"),
             helper.make_node("Tanh", ["r1"], ["t"], name="tanh"),
             helper.make_node("Sin", ["t"], ["s"], name="sin"),
             helper.make_node("Sum", ["s", "d"], ["u"], name="sum"),
             helper.make_node("Cos", ["u"], ["v"], name="cos"),
             helper.make_node("Conv", ["v", "w2"], ["c2"], name="conv2"),
             helper.make_node("Relu", ["c2"], ["y"], name="relu2")]
    return make_model(nodes, [tinfo("x", [1, 3, 8, 8])], [tinfo("y", [1, 8, 8, 8])], inits, opset=13)


def _samples(n=12):
    rng = np.random.default_rng(0)
    return [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(n)]


@pytest.mark.parametrize("budget", [0.0, 0.5, 3.0])
def test_the_search_never_goes_below_the_budget(budget):
    """The Q/DQ pairs between float kernels go at placement (balanced and latency alike, float_regions.py); the
    search decides what remains: the widened values it could narrow to 8 bits."""
    res = quantize(_model(), _samples(), optimize="latency", latency_budget_db=budget)
    assert res.report["latency_search"]["candidates"] == 0      # nothing left between float kernels
    m, cal = _outlier_model()
    res = quantize(m, cal, optimize="latency", latency_budget_db=budget)
    ls = res.report["latency_search"]
    assert ls["ran"] and ls["candidates"] >= 1, ls
    assert ls["floor_db"] == pytest.approx(ls["sqnr_before_db"] - budget, abs=0.02)
    worst = min(res.report["output_sqnr_db"].values())
    assert worst == pytest.approx(ls["sqnr_after_db"], abs=0.01)
    assert worst >= ls["floor_db"] - 0.01, ls       # measured on the real model, every kept sample
    left = res.report["left_float"]     # each value taken out, not the weights its readers store int8 then
    assert sum("latency search" in str(v) for k, v in left.items() if ":input" not in k) == ls["removed"]


def test_balanced_and_accuracy_do_not_search():
    for opt in ("balanced", "accuracy"):
        res = quantize(_model(), _samples(), optimize=opt)
        assert not res.report["latency_search"]["ran"]
        assert "skipped" in res.report["latency_search"]["note"]


def test_trt_has_no_fusion_table_so_nothing_is_searched():
    res = quantize(_model(), _samples(), target="trt", optimize="latency")
    assert not res.report["latency_search"]["ran"]


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "3", True])
def test_a_bad_budget_is_an_argument_error(bad):
    with pytest.raises(ArgumentError, match="latency_budget_db"):
        quantize(_model(), _samples(2), optimize="latency", latency_budget_db=bad)


def test_cli_flag(tmp_path):
    m = tmp_path / "m.onnx"
    proto, cal = _outlier_model(tail=False)
    m.write_bytes(proto.SerializeToString())
    data = tmp_path / "c.npz"
    np.savez(data, x=np.stack([s["x"][0] for s in cal]))
    out, rep = tmp_path / "q.onnx", tmp_path / "r.json"
    r = subprocess.run([sys.executable, "-m", "qcompiler", "quantize", str(m), "--calib", str(data), "-o", str(out),
                        "--optimize", "latency", "--latency-budget-db", "0.5", "--report", str(rep), "-q"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ls = json.loads(rep.read_text())["latency_search"]
    # the subprocess has no fixture lifting the size rule: this model's 0.1 M MACs stay float, nothing to search
    assert not ls["ran"] and ls["candidates"] == 0, ls
    r = subprocess.run([sys.executable, "-m", "qcompiler", "quantize", str(m), "--calib", str(data), "-o", str(out),
                        "--optimize", "latency", "--latency-budget-db", "-2"], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "latency_budget_db" in r.stderr


def _outlier_model(tail=True):
    """x (rare outliers: placement widens it to 16 bits) -> Relu -> MatMul -> Relu -> MatMul, with `tail` a larger
    MatMul -> Relu -> MatMul after it: mm1 then holds under a quarter of the multiply-accumulates, so placement
    leaves the narrowing to the search (a heavier reader keeps 8 bits under balanced and latency alike,
    placement/widening.py)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((32, 32)) * 0.2).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((32, 16)) * 0.2).astype(np.float32), "w2")]
    nodes = [helper.make_node("Relu", ["x"], ["r0"], name="relu0"),
             helper.make_node("MatMul", ["r0", "w1"], ["m1"], name="mm1"),
             helper.make_node("Relu", ["m1"], ["r1"], name="relu1"),
             helper.make_node("MatMul", ["r1", "w2"], ["m2" if tail else "y"], name="mm2")]
    if tail:
        inits += [numpy_helper.from_array((rng.standard_normal((16, 512)) * 0.2).astype(np.float32), "w3"),
                  numpy_helper.from_array((rng.standard_normal((512, 16)) * 0.05).astype(np.float32), "w4")]
        nodes += [helper.make_node("MatMul", ["m2", "w3"], ["m3"], name="mm3"),
                  helper.make_node("Relu", ["m3"], ["r3"], name="relu3"),
                  helper.make_node("MatMul", ["r3", "w4"], ["y"], name="mm4")]
    m = make_model(nodes, [tinfo("x", [1, 64, 32])], [tinfo("y", [1, 64, 16])], inits, opset=17)
    cal = []
    for i in range(12):
        x = rng.standard_normal((1, 64, 32)).astype(np.float32)
        x[0, i, 3] = 40.0
        cal.append({"x": x})
    return m, cal


def test_a_widened_value_is_narrowed_to_8_bits_only_within_the_budget():
    from qcompiler.quant.runtime.kernels import kernel_report
    m, cal = _outlier_model()
    kernel = {}
    for budget in (0.0, 50.0):
        res = quantize(m, cal, optimize="latency", latency_budget_db=budget)
        ls = res.report["latency_search"]
        assert min(res.report["output_sqnr_db"].values()) >= ls["floor_db"] - 0.01, ls
        kernel[budget] = {n.node: n.kernel for n in kernel_report(res.model).nodes if n.node.startswith("mm1")}
        assert ls["narrowed_to_8_bits"] == int(kernel[budget] == {"mm1": "QLinearMatMul"}), (ls, kernel)
    # budget 0: 8 bits on x would cost SQNR, so mm1 reads it float, its weight stored int8 for MatMulNBits (the
    # float kernel's weight form, as balanced); a large budget (floor: the safety net's 15 dB) buys the integer
    # MatMul
    assert kernel == {0.0: {"mm1_nbits": "MatMulNBits"}, 50.0: {"mm1": "QLinearMatMul"}}


def test_matmul_plus_bias_add_keeps_the_q_that_stops_onnxruntimes_float_gemm_fusion():
    """MatMul -> Add(constant bias) -> Sin, Cos: the Add's output Q has no integer neighbour of its own, but without it
    onnxruntime's MatMulAddFusion makes a float Gemm of the pair (a float bias has no QDQ Gemm kernel), and the
    weight's DQ runs on every inference (bert_like under latency: 0.51x -> 0.98x float before the rule)."""
    from qcompiler.quant.runtime.kernels import kernel_report
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array((rng.standard_normal((32, 64)) * 0.2).astype(np.float32), "w"),
             numpy_helper.from_array((rng.standard_normal(64) * 0.1).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
             helper.make_node("Add", ["m", "b"], ["h"], name="bias"),
             helper.make_node("Sin", ["h"], ["s"], name="sin"),
             helper.make_node("Cos", ["h"], ["c"], name="cos"),
             helper.make_node("Sum", ["s", "c"], ["y"], name="sum")]
    m = make_model(nodes, [tinfo("x", [1, 16, 32])], [tinfo("y", [1, 16, 64])], inits, opset=17)
    cal = [{"x": rng.standard_normal((1, 16, 32)).astype(np.float32)} for _ in range(8)]
    res = quantize(m, cal, optimize="latency", latency_budget_db=50.0)
    kr = kernel_report(res.model)
    assert {n.node: n.integer for n in kr.nodes}["mm"], [(n.node, n.kernel, n.reason) for n in kr.nodes]
    assert "h" not in res.report["left_float"]
    assert not kr.runtime_qdq.get("weight DQ")
