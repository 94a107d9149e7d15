"""Signals during the write of a large output (item 3 and Tests): SIGKILL, SIGINT and SIGTERM while
`run -o OUT` is writing leave the earlier OUT intact and no partial output; after the catchable signals no
temporary file is left beside OUT, and after SIGKILL a later run removes what the killed one left. Two processes
writing the same OUT at once leave one whole file.

The child is a plain `python -m qcompiler` process (it must be signalled mid-write); the test watches OUT's folder
and sends the signal as soon as a new file appears there.
"""
from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.hostile.harness import REPO, _limits, snapshot

N_ROWS = 1500          # a 1500 x 10000 float32 weight: 60 MB, about half a second to load and write


def _sha(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    w = np.arange(N_ROWS * 10000, dtype=np.float32).reshape(N_ROWS, 10000)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, N_ROWS])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10000])],
                          [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    path = d / "big.onnx"
    onnx.save(m, path)
    return path


def _start(model, out, pipeline="canonicalize"):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-m", "qcompiler", "run", str(model), "-o", str(out), "--pipeline",
                             pipeline], cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True, env=env,
                            preexec_fn=_limits(3 << 30, 60, 0o022))


def _extra_files(folder, keep):
    return sorted(n for n in os.listdir(folder) if n not in keep)


def _signal_mid_write(model, out, sig) -> "tuple[subprocess.Popen, bool, str]":
    """Start a run writing `out`, send `sig` when a new file shows up beside it; (process, caught mid-write, stderr)."""
    folder, keep = os.path.dirname(out), set(os.listdir(os.path.dirname(out)))
    p = _start(model, out)
    deadline = time.monotonic() + 30
    caught = False
    while p.poll() is None and time.monotonic() < deadline:
        if _extra_files(folder, keep):
            p.send_signal(sig)
            caught = True
            break
        time.sleep(0.0005)
    try:
        _, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        pytest.fail(f"the run did not end within 30 s of {signal.Signals(sig).name}")
    return p, caught, err.decode("utf-8", "replace")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_signal_during_write_keeps_earlier_output(tmp_path, big_model, sig):
    out = tmp_path / "out.onnx"
    before_in = snapshot([big_model])
    first = _start(big_model, out)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err.decode()[-500:]
    earlier = _sha(out)
    for _attempt in range(3):
        p, caught, err = _signal_mid_write(big_model, out, sig)
        if caught and p.returncode != 0:
            break
    else:
        pytest.skip("could not signal the run while it was writing (the write was too quick to catch)")
    assert "Traceback" not in err, err[-800:]
    assert _sha(out) == earlier, f"{sig.name} mid-write changed the earlier output"
    left = _extra_files(tmp_path, {"out.onnx"})
    if sig != signal.SIGKILL:
        assert not left, f"{sig.name} mid-write left {left} beside the output"
    else:   # a later run recognises and removes the leftovers of the killed one
        again = _start(big_model, out)
        _, err = again.communicate(timeout=60)
        assert again.returncode == 0, err.decode()[-500:]
        left = _extra_files(tmp_path, {"out.onnx"})
        assert not left, f"after SIGKILL mid-write and a later run, {left} still lie beside the output"
        onnx.load(str(out), load_external_data=False)
    assert snapshot([big_model]) == before_in


def test_two_writers_same_output(tmp_path, big_model):
    out = tmp_path / "out.onnx"
    procs = [_start(big_model, out), _start(big_model, out)]
    results = [p.communicate(timeout=60) for p in procs]
    codes = [p.returncode for p in procs]
    assert all(c in (0, 2) for c in codes) and 0 in codes, [(c, e.decode()[-300:]) for c, (_, e) in zip(codes, results)]
    assert not any(b"Traceback" in e for _, e in results)
    m = onnx.load(str(out))
    assert m.graph.initializer[0].dims == [N_ROWS, 10000]
    assert _extra_files(tmp_path, {"out.onnx"}) == []
