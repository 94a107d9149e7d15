"""A model whose Loop never ends must not hang calibration: one that provably never ends (no trip count, a
condition that stays true) is refused at import; one with a huge trip count runs into the wall-time bound of
each onnxruntime run ($QCOMPILER_RUN_TIMEOUT), and a run stopped by the bound is one line."""
from __future__ import annotations

import time

import numpy as np
import onnx
from click.testing import CliRunner
from onnx import TensorProto as T
from onnx import helper as h

from qcompiler.cli import main


def _endless_loop(trip_count: bool):
    body = h.make_graph(
        [h.make_node("Identity", ["cond_in"], ["cond_out"]), h.make_node("Add", ["v_in", "one"], ["v_out"])], "body",
        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond_in", T.BOOL, []),
         h.make_tensor_value_info("v_in", T.FLOAT, [1])],
        [h.make_tensor_value_info("cond_out", T.BOOL, []), h.make_tensor_value_info("v_out", T.FLOAT, [1])])
    inits = [h.make_tensor("one", T.FLOAT, [1], [1.0]), h.make_tensor("w", T.FLOAT, [1, 1], [0.5])]
    if trip_count:
        inits.append(h.make_tensor("m", T.INT64, [], [2 ** 62]))
    g = h.make_graph(
        [h.make_node("Constant", [], ["t"], value=h.make_tensor("tv", T.BOOL, [], [True])),
         h.make_node("Loop", ["m" if trip_count else "", "t", "x"], ["y"], body=body),
         h.make_node("MatMul", ["y", "w"], ["z0"]), h.make_node("Relu", ["z0"], ["z"])],
        "g", [h.make_tensor_value_info("x", T.FLOAT, [1])], [h.make_tensor_value_info("z", T.FLOAT, [1])], inits)
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def test_endless_loop_is_stopped_and_named(tmp_path, monkeypatch):
    monkeypatch.setenv("QCOMPILER_RUN_TIMEOUT", "0.5")
    for trip_count in (False, True):
        onnx.save(_endless_loop(trip_count), str(tmp_path / "m.onnx"))
        np.savez(tmp_path / "c.npz", x=np.ones((2, 1), np.float32))
        t0 = time.monotonic()
        r = CliRunner().invoke(main, ["quantize", str(tmp_path / "m.onnx"), "--calib", str(tmp_path / "c.npz"),
                                      "-o", str(tmp_path / "q.onnx")])
        assert time.monotonic() - t0 < 30
        assert r.exit_code == 2, (r.exit_code, r.output)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, lines
        if trip_count:   # 2^62 iterations: ends in theory, so it runs into the bound
            assert "sample 0" in lines[0] and "QCOMPILER_RUN_TIMEOUT" in lines[0], lines
        else:   # nothing can stop it: refused at import (qcompiler/onnx_io/loop_check.py), before any run
            assert "never ends" in lines[0] and "input 0" in lines[0], lines
        assert not (tmp_path / "q.onnx").exists()


def test_bad_timeout_values_fall_back_to_the_default(monkeypatch):
    from qcompiler.ort_session import RUN_TIMEOUT_S, run_timeout
    for v in ("", "abc", "-1", "0", "inf", "nan"):
        monkeypatch.setenv("QCOMPILER_RUN_TIMEOUT", v)
        assert run_timeout() == RUN_TIMEOUT_S
    monkeypatch.setenv("QCOMPILER_RUN_TIMEOUT", "3.5")
    assert run_timeout() == 3.5
