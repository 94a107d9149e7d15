"""A signal in the middle of writing a large output (a 64 MB model built here): the earlier output stays intact
and no partial file ever has the final name. SIGINT and SIGTERM remove the temp file at once and end the
process with the usual status; SIGKILL cannot be caught, so its temp file is removed by the next run writing
into that folder. Two processes writing the same output at once leave one whole, loadable model (with external
data: a model and a .data file that belong together).

The writer is slowed down once 8 MB are out (the pieces are throttled), so the signal lands mid-write.
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

import qcompiler
from qcompiler.onnx_io import files, write_atomic

N_WEIGHTS, SIDE = 16, 1024          # 16 initializers of 1024x1024 float32: 64 MB

CHILD = r'''
import os, sys, time
marker, mode, src, out = sys.argv[1:5]

def mark_then_slow():
    if not os.path.exists(marker):
        open(marker, "w").close()
    time.sleep(0.08)

if mode == "cli":
    from qcompiler.onnx_io import files
    orig = files.model_to_byte_pieces

    def throttled(model):
        n = 0
        for piece in orig(model):
            yield piece
            n += len(piece)
            if n >= (8 << 20):
                mark_then_slow()
    files.model_to_byte_pieces = throttled
    from qcompiler.cli import main
    main(["run", src, "-o", out, "--pipeline", "canonicalize"], prog_name="qcompiler")
else:   # the API with external data: the tensors go into the .data file one by one (ExternalData.write)
    from qcompiler.onnx_io import exporter
    orig, count = exporter.ExternalData.write, [0]

    def throttled(self, raw):
        orig(self, raw)
        count[0] += 1
        if count[0] >= 2:
            mark_then_slow()
    exporter.ExternalData.write = throttled
    import qcompiler
    qcompiler.save_model(qcompiler.load_model(src), out, external_data=True)
'''


def _big_model(value: float, tag: str) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [SIDE, SIDE])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [SIDE, SIDE])
    inits, nodes, prev = [], [], "x"
    for i in range(N_WEIGHTS):
        inits.append(numpy_helper.from_array(np.full((SIDE, SIDE), value + i, np.float32), f"w{i}"))
        out = "y" if i == N_WEIGHTS - 1 else f"h{i}"
        nodes.append(helper.make_node("Add", [prev, f"w{i}"], [out], name=f"add{i}"))
        prev = out
    m = helper.make_model(helper.make_graph(nodes, "big", [x], [y], inits),
                          opset_imports=[helper.make_opsetid("", 17)], doc_string=tag)
    m.ir_version = 8
    return m


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    for tag, value in (("A", 1.0), ("B", 100.0)):
        onnx.save(_big_model(value, tag), str(d / f"{tag}.onnx"))
    yield d
    for n in os.listdir(d):   # 128 MB: do not leave them to pytest's temp folder rotation
        os.unlink(d / n)


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _ours(folder) -> list:
    return [n for n in os.listdir(folder) if ".qcompiler" in n]


def _start(mode, src, out, marker):
    # NOTE: SIGINT back to its default first, so Python installs its KeyboardInterrupt handler even when this
    # test runs where SIGINT is ignored (a background job)
    return subprocess.Popen([sys.executable, "-c", CHILD, str(marker), mode, str(src), str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _wait_for(marker, proc, timeout=30.0):
    t = time.monotonic() + timeout
    while not os.path.exists(marker):
        if proc.poll() is not None:
            raise AssertionError(f"writer ended before mid-write: {proc.returncode} {proc.stderr.read()}")
        if time.monotonic() > t:
            proc.kill()
            raise AssertionError("writer never got mid-write")
        time.sleep(0.005)


def _earlier_output(out):
    """An earlier, complete output at the final name (a small valid model)."""
    m = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "earlier",
                                            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]))
    onnx.save(m, str(out))
    return _sha(out)


@pytest.mark.parametrize("sig,mode", [(signal.SIGKILL, "cli"), (signal.SIGINT, "cli"), (signal.SIGTERM, "cli"),
                                      (signal.SIGTERM, "external")])
def test_signal_mid_write_keeps_the_earlier_output(big, tmp_path, sig, mode):
    out = tmp_path / "out.onnx"
    earlier = _earlier_output(out)
    p = _start(mode, big / "A.onnx", out, tmp_path / "marker")
    _wait_for(tmp_path / "marker", p)
    assert _ours(tmp_path), "a temp file is being written beside the output"
    p.send_signal(sig)
    rc = p.wait(timeout=30)
    stderr = p.stderr.read()
    assert "Traceback" not in stderr, stderr
    assert _sha(out) == earlier, "the earlier output is intact"
    assert not os.path.exists(str(out) + ".data")
    if sig == signal.SIGKILL:
        assert rc == -signal.SIGKILL
        assert _ours(tmp_path), "SIGKILL cannot be caught: its temp file stays until the next run"
        r = subprocess.run([sys.executable, "-m", "qcompiler", "run", str(out), "-o", str(tmp_path / "next.onnx"),
                            "--pipeline", "canonicalize"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert not _ours(tmp_path), "the next run writing into the folder removed the dead run's leftover"
    else:
        assert not _ours(tmp_path), "the caught signal removed the temp file"
        assert rc == (130 if sig == signal.SIGINT and mode == "cli" else -sig), (rc, stderr)
        if sig == signal.SIGINT:
            assert stderr.strip().splitlines() == ["qcompiler: error: interrupted"], stderr


def _check_whole(out, with_data: bool):
    m = onnx.load(str(out))   # with its external data, if any
    assert m.doc_string in ("A", "B")
    base = 1.0 if m.doc_string == "A" else 100.0
    for i, t in enumerate(m.graph.initializer):
        a = numpy_helper.to_array(t)
        assert a.shape == (SIDE, SIDE) and a[0, 0] == base + i and a[-1, -1] == base + i, \
            "model and data belong to the same writer"
    assert any(t.data_location == TensorProto.EXTERNAL for t in onnx.load(str(out), load_external_data=False)
               .graph.initializer) == with_data


@pytest.mark.parametrize("mode", ["cli", "external"])
def test_two_writers_at_once_leave_one_whole_output(big, tmp_path, mode):
    out = tmp_path / "out.onnx"
    procs = [_start(mode, big / f"{tag}.onnx", out, tmp_path / f"marker{tag}") for tag in "AB"]
    for tag, p in zip("AB", procs):
        _wait_for(tmp_path / f"marker{tag}", p)
    for p in procs:
        assert p.wait(timeout=60) == 0, p.stderr.read()
    _check_whole(out, with_data=mode == "external")
    assert not _ours(tmp_path)


# --- in this process: the handlers that were there before still get the signal ------------------------------
def _slow_pieces(monkeypatch, sig):
    orig = files.model_to_byte_pieces

    def pieces(model):
        for i, piece in enumerate(orig(model)):
            yield piece
            if i == 2:
                os.kill(os.getpid(), sig)
    monkeypatch.setattr(files, "model_to_byte_pieces", pieces)


def _small_model():
    return qcompiler.model_from_proto(_earlier_model_proto())


def _earlier_model_proto():
    w = numpy_helper.from_array(np.ones((64, 64), np.float32), "w")
    return helper.make_model(helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g",
                                               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 64])],
                                               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])],
                                               [w]))


@pytest.fixture
def main_thread_signals():
    try:
        old = {s: signal.signal(s, signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:
        pytest.skip("signal handlers can only be set in the main thread")
    yield
    for s, h in old.items():
        signal.signal(s, h)


def test_sigterm_reaches_the_previous_handler_after_cleanup(tmp_path, monkeypatch, main_thread_signals):
    out = tmp_path / "out.onnx"
    earlier = _earlier_output(out)
    seen = []
    signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
    _slow_pieces(monkeypatch, signal.SIGTERM)
    with pytest.raises(SystemExit) as e:
        qcompiler.save_model(_small_model(), str(out))
    assert e.value.code == 128 + signal.SIGTERM and seen == [signal.SIGTERM]
    assert _sha(out) == earlier and not _ours(tmp_path)
    assert signal.getsignal(signal.SIGTERM) is not None and seen == [signal.SIGTERM]


def test_sigint_becomes_keyboardinterrupt_after_cleanup(tmp_path, monkeypatch, main_thread_signals):
    out = tmp_path / "out.onnx"
    earlier = _earlier_output(out)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _slow_pieces(monkeypatch, signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        qcompiler.save_model(_small_model(), str(out))
    assert _sha(out) == earlier and not _ours(tmp_path)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "the previous handler is back"
    monkeypatch.undo()
    qcompiler.save_model(_small_model(), str(out))   # and the next write works
    assert qcompiler.load_model(str(out)).graph.value("w").const_value().shape == (64, 64)


def test_ignored_signal_stays_ignored(tmp_path, monkeypatch, main_thread_signals):
    out = tmp_path / "out.onnx"
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _slow_pieces(monkeypatch, signal.SIGTERM)
    qcompiler.save_model(_small_model(), str(out))   # nohup'd: the write goes on
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    assert qcompiler.load_model(str(out)).graph.value("w").const_value().shape == (64, 64)
    write_atomic(str(tmp_path / "r.json"), "{}")
    assert not _ours(tmp_path)


def test_signal_during_the_renames_is_held_until_they_are_done(tmp_path, monkeypatch, main_thread_signals):
    """With external data the model and its .data are renamed as a pair: a SIGTERM between them must not split it."""
    from qcompiler.onnx_io import safe_write
    seen, replaced = [], []
    signal.signal(signal.SIGTERM, lambda s, f: seen.append((s, len(replaced))))
    real = os.replace

    def replace(a, b):
        if not replaced:
            os.kill(os.getpid(), signal.SIGTERM)   # arrives just before the first rename
        real(a, b)
        replaced.append(b)
    monkeypatch.setattr(safe_write.os, "replace", replace)
    out = tmp_path / "out.onnx"
    qcompiler.save_model(_small_model(), str(out), external_data=True)
    monkeypatch.undo()
    assert replaced == [str(out) + ".data", str(out)] and seen == [(signal.SIGTERM, 2)], (replaced, seen)
    assert qcompiler.load_model(str(out)).graph.value("w").const_value().shape == (64, 64)
    assert not _ours(tmp_path)


@pytest.mark.parametrize("which", ["file", "pair"])
def test_a_signal_right_after_the_temp_file_is_created_leaves_nothing(tmp_path, monkeypatch, which):
    """The moment the temp file appears is when a watcher signals: an interrupt arriving just after the create
    returned (simulated: the real create, then KeyboardInterrupt) must still remove the temp file or folder."""
    from qcompiler.onnx_io import safe_write
    target = safe_write.output_target(str(tmp_path / "o.onnx"), "output model")
    name = "open" if which == "file" else "mkdir"
    real = getattr(os, name)

    def create_then_interrupt(*a, **k):
        r = real(*a, **k)
        if str(a[0]).startswith(str(tmp_path)):
            raise KeyboardInterrupt
        return r
    monkeypatch.setattr(safe_write.os, name, create_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        if which == "file":
            safe_write.write_file(target, lambda f: f.write(b"x"))
        else:
            safe_write.write_pair(target, lambda p: None)
    monkeypatch.undo()
    assert [n for n in os.listdir(tmp_path) if "qcompiler" in n and not n.endswith(".lock")] == []
