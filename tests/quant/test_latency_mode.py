"""`--optimize latency` is never slower or larger than `balanced` on the same model: the readers its search
leaves float get the float kernel's weight form (narrow-float-weights: int8 MatMulNBits on ort_cpu), as under
balanced, and the result stays within the search's SQNR budget (passes/quantize/latency_search.py)."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from qcompiler.quant.api import quantize
from qcompiler.quant.runtime.kernels import kernel_report
from tests.helpers import make_model, tinfo


@pytest.fixture(autouse=True)
def _no_size_rule(monkeypatch):
    """Tiny models: without the size rule (placement/cost.py) their integer kernels stay, so the search has
    widened values to decide."""
    from qcompiler.quant.placement import float_regions
    monkeypatch.setattr(float_regions, "small_regions", lambda *a: set())


def _matmuls(d=128):
    """x (rare outliers: widened to 16 bits) -> Relu -> MatMul, then a larger MatMul -> Relu -> MatMul (so the
    first holds under a quarter of the multiply-accumulates and placement leaves its narrowing to the search),
    weights large enough to store int8 for MatMulNBits."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((d, d)) * 0.1).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((d, 4 * d)) * 0.1).astype(np.float32), "w2"),
             numpy_helper.from_array((rng.standard_normal((4 * d, d)) * 0.05).astype(np.float32), "w3")]
    nodes = [helper.make_node("Relu", ["x"], ["r0"], name="relu0"),
             helper.make_node("MatMul", ["r0", "w1"], ["m1"], name="mm1"),
             helper.make_node("MatMul", ["m1", "w2"], ["m2"], name="mm2"),
             helper.make_node("Relu", ["m2"], ["r2"], name="relu2"),
             helper.make_node("MatMul", ["r2", "w3"], ["y"], name="mm3")]
    m = make_model(nodes, [tinfo("x", [1, 32, d])], [tinfo("y", [1, 32, d])], inits, opset=17)
    cal = []
    for i in range(12):
        x = rng.standard_normal((1, 32, d)).astype(np.float32)
        x[0, i, 3] = 40.0
        cal.append({"x": x})
    return m, cal


def _convs():
    """The same with Convs: x (outliers) -> Relu -> Conv -> Relu -> Conv."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) * 0.1).astype(np.float32), "w2")]
    nodes = [helper.make_node("Relu", ["x"], ["r0"], name="relu0"),
             helper.make_node("Conv", ["r0", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1])]
    m = make_model(nodes, [tinfo("x", [1, 8, 16, 16])], [tinfo("y", [1, 16, 16, 16])], inits, opset=17)
    cal = []
    for i in range(12):
        x = rng.standard_normal((1, 8, 16, 16)).astype(np.float32)
        x[0, i % 8, i, 3] = 40.0
        cal.append({"x": x})
    return m, cal


def _plain():
    """Nothing widened: the search has no candidate and latency equals balanced."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array((rng.standard_normal((128, 128)) * 0.1).astype(np.float32), "w1")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"], name="mm1"),
             helper.make_node("Relu", ["m1"], ["y"], name="relu1")]
    m = make_model(nodes, [tinfo("x", [1, 32, 128])], [tinfo("y", [1, 32, 128])], inits, opset=17)
    return m, [{"x": rng.standard_normal((1, 32, 128)).astype(np.float32)} for _ in range(12)]


def _run(m, cal, tmp_path, optimize, budget):
    res = quantize(m, cal, optimize=optimize, latency_budget_db=budget)
    path = tmp_path / f"{optimize}.onnx"
    res.save(str(path))
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out = sess.run(None, cal[0])[0]
    assert np.isfinite(out).all()
    fast = sum(n.integer for n in kernel_report(res.model).nodes)
    return res, path.stat().st_size, fast


@pytest.mark.parametrize("build", [_matmuls, _convs, _plain])
@pytest.mark.parametrize("budget", [0.0, 1.0])
def test_latency_is_no_slower_and_no_larger_than_balanced(build, budget, tmp_path):
    m, cal = build()
    _, bal_bytes, bal_fast = _run(m, cal, tmp_path, "balanced", budget)
    res, lat_bytes, lat_fast = _run(m, cal, tmp_path, "latency", budget)
    assert lat_fast >= bal_fast, (lat_fast, bal_fast)      # integer or MatMulNBits kernels in onnxruntime's graph
    assert lat_bytes <= bal_bytes * 1.02 + 512, (lat_bytes, bal_bytes)   # graph names and a Q/DQ's few bytes
    ls = res.report["latency_search"]
    if ls["ran"]:
        assert min(res.report["output_sqnr_db"].values()) >= ls["floor_db"] - 0.01, ls
        assert ls["floor_db"] == pytest.approx(ls["sqnr_before_db"] - budget, abs=0.02)
    else:
        assert build is _plain, ls


def test_the_matmuls_the_search_leaves_float_store_int8_weights(tmp_path):
    """The root of the slow minilm_l6 run: a reader put back float kept exact float weights (a float MatMul,
    four times the bytes); now it is MatMulNBits, as under balanced."""
    m, cal = _matmuls()
    res, _, _ = _run(m, cal, tmp_path, "latency", 0.0)
    kernels = {n.node: n.kernel for n in kernel_report(res.model).nodes}
    assert res.report["latency_search"]["weights_stored_int8"] >= 1
    assert "MatMulNBits" in kernels.values() and "MatMul" not in kernels.values(), kernels
