"""`qcompiler debug`'s one-quantizer and one-module runs on an executor: local worker processes and a real local
Ray give the numbers of the runs in this process, and the runs really go through the executor."""
from __future__ import annotations

import math

import pytest

import qcompiler
from qcompiler.errors import ArgumentError
from qcompiler.quant.runtime.executor import LocalExecutor, SerialExecutor
from tests.debugger.test_debug import outlier  # noqa: F401 - the fixture
from tests.quant.test_safety_net_parallel import Counting


def _numbers(res) -> dict:
    d = res.to_dict()
    return {"values": [(v["name"], v["kind"], v["alone_sqnr_db"]) for v in d["values"]],
            "modules": d["modules"], "outputs": d["outputs"]}


def _same_as_serial(d, executor):
    args = (str(d / "m.onnx"), str(d / "q.onnx"), str(d / "calib.npz"))
    want = _numbers(qcompiler.debug(*args, executor=SerialExecutor()))
    counted = Counting(executor)
    got = _numbers(qcompiler.debug(*args, executor=counted))
    alone = [v[2] for v in want["values"]]
    assert len(alone) >= 6 and all(isinstance(a, float) and not math.isnan(a) for a in alone), alone
    assert got == want
    assert counted.items >= len(alone) - 1, (counted.items, len(alone))   # the alone runs went there


def test_local_processes_give_the_serial_numbers(outlier):  # noqa: F811
    d, _ = outlier
    ex = LocalExecutor(2)
    try:
        _same_as_serial(d, ex)
    finally:
        ex.close()


def test_ray_gives_the_serial_numbers(outlier):  # noqa: F811
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'qcompiler[ray]')")
    from qcompiler.quant.runtime.executor import RayExecutor
    d, _ = outlier
    ex = RayExecutor("auto")          # no cluster here: a local instance for this test
    try:
        assert ray.is_initialized()
        if ex.workers < 2:
            pytest.skip("the local Ray instance has one CPU: no batch would run on it")
        _same_as_serial(d, ex)
    finally:
        ex.close()


def test_a_bad_executor_is_one_line(outlier):  # noqa: F811
    d, _ = outlier
    with pytest.raises(ArgumentError, match="^executor: expected an object with map"):
        qcompiler.debug(str(d / "m.onnx"), str(d / "q.onnx"), str(d / "calib.npz"), executor=3)
