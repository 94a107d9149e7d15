"""The safety net's independent trials on an executor: in this process, on local worker processes and on a real
local Ray give the same trials, the same choice and the same model; the batches really go through the executor."""
import numpy as np
import pytest

from qcompiler.passes.quantize.safety_net import budget
from qcompiler.passes.quantize.safety_net.trials import RUNS_IN_FLIGHT
from qcompiler.quant import quantize
from qcompiler.quant.core.switches import DEFAULT_MIN_SQNR_DB
from qcompiler.quant.runtime.executor import (SMALL_MODEL_BYTES, LocalExecutor, SerialExecutor, cores,
                                              run_executor)
from qcompiler.quant.runtime.switch_pool import SwitchPool, describe, run_switched
from tests.quant.test_safety_net_regions import SCOPE, ort_sqnr, spectrum_model


class Counting:
    """Wraps an executor: counts the items it was handed."""

    def __init__(self, inner):
        self.inner, self.items, self.workers = inner, 0, inner.workers

    def map(self, fn, items):
        items = list(items)
        self.items += len(items)
        return self.inner.map(fn, items)

    def close(self):
        self.inner.close()


@pytest.fixture
def spectrum(monkeypatch):
    # no wall-time bound: a loaded machine must not end one run's search earlier than the other's
    monkeypatch.setattr(budget, "MAX_SECONDS", 1e6)
    m, x = spectrum_model()
    return m, x, [{"x": s} for s in x]


def _run(spectrum, executor):
    m, _, feeds = spectrum
    res = quantize(m, feeds, optimize="accuracy", executor=executor)
    sn = res.report["safety_net"]
    return res, {k: sn[k] for k in ("tried", "changed", "trials", "summary", "sqnr_after_db", "kept")
                 if k in sn}


def _same_as_serial(spectrum, executor, tmp_path):
    m, x, _ = spectrum
    serial, want = _run(spectrum, SerialExecutor())
    counted = Counting(executor)
    try:
        res, got = _run(spectrum, counted)
    finally:
        counted.close()
    assert want["summary"].startswith("kept module") and SCOPE in want["summary"]   # the net ran, regions too
    assert got == want
    assert counted.items >= 8, counted.items        # halves and candidate regions went through the executor
    sn = res.report["safety_net"]
    assert 8 <= sn["parallel_trials"] <= counted.items and sn["executor"].endswith(f"({executor.workers} workers)")
    assert serial.report["safety_net"]["executor"] == "serial" and serial.report["safety_net"]["parallel_trials"] == 0
    assert ort_sqnr(res, m, x, tmp_path / "a") == ort_sqnr(serial, m, x, tmp_path / "b") >= DEFAULT_MIN_SQNR_DB


@pytest.mark.parametrize("workers", [2, 4])
def test_local_processes_give_the_serial_result(spectrum, tmp_path, workers):
    # 2 workers: batches of halves and regions, single trials here; 4 (more than the 2 samples a trial runs
    # here at once): every timed trial on the workers, its samples split over them
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    _same_as_serial(spectrum, LocalExecutor(workers), tmp_path)


@pytest.mark.slow       # a local Ray instance and two runs of the net: 12 to 36 s on the shared 2-core machine
def test_ray_gives_the_serial_result(spectrum, tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'qcompiler[ray]')")
    from qcompiler.quant.runtime.executor import RayExecutor
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    ex = RayExecutor("auto")          # no cluster here: a local instance for this test
    try:
        assert ray.is_initialized() and ex.workers >= 1
        if ex.workers < 2:
            pytest.skip("the local Ray instance has one CPU: no batch would run on it")
        _same_as_serial(spectrum, ex, tmp_path)
    finally:
        ex.close()


def test_a_failing_executor_leaves_the_trials_in_this_process(spectrum):
    class Broken:
        workers = 2
        calls = 0

        def map(self, fn, items):
            Broken.calls += 1
            raise RuntimeError("no workers today")

    _, want = _run(spectrum, SerialExecutor())
    res, got = _run(spectrum, Broken())
    assert got == want and Broken.calls >= 1 and res.report["safety_net"]["parallel_trials"] == 0


def test_the_rule_small_models_and_busy_cores_stay_in_this_process():
    assert run_executor(None, SMALL_MODEL_BYTES - 1).name == "serial"
    for busy in (1, RUNS_IN_FLIGHT):
        big = run_executor(None, SMALL_MODEL_BYTES, in_process=busy)
        assert big.name == ("processes" if cores() > busy else "serial"), (busy, cores())
        big.close()


def test_a_worker_runs_the_switchable_model_like_this_process(tmp_path):
    """run_switched (what a worker runs) on a tiny switchable model: the switch picks float or quantized."""
    from onnx import TensorProto as T
    from onnx import helper as h
    g = h.make_graph([h.make_node("Round", ["x"], ["r"]), h.make_node("Gather", ["on", "i"], ["o"]),
                      h.make_node("Where", ["o", "r", "x"], ["y"])], "sw",
                     [h.make_tensor_value_info("x", T.FLOAT, [3]), h.make_tensor_value_info("on", T.BOOL, [1])],
                     [h.make_tensor_value_info("y", T.FLOAT, [3])],
                     [h.make_tensor("i", T.INT64, [], [0])])
    proto = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    proto.ir_version = 8
    x = np.array([0.4, 1.6, -2.2], np.float32)
    feeds = [{"x": x}, {"x": -x}]
    pool = SwitchPool(SerialExecutor(), proto)
    try:
        outs = pool.run(feeds, [{"on": np.array([True])}, {"on": np.array([False])}])
        assert [o[0].tolist() for o in outs[0]] == [[0, 2, -2], [0, -2, 2]]
        assert [o[0].tolist() for o in outs[1]] == [x.tolist(), (-x).tolist()]
        assert pool.runs == 2
        path = pool._samples[1]
        assert run_switched((pool.model_path, path, {"on": [True]}, [1]))[0][0].tolist() == [0, -2, 2]
    finally:
        pool.close()
    assert SwitchPool.of(SerialExecutor(), proto) is None and describe(SerialExecutor()) == "serial"
