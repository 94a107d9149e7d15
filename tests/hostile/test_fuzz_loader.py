"""A seeded byte-level fuzz of the model loader, in process: only QCompilerError kinds escape, no hang, memory bounded.

Each variant is a valid built model (tests/hostile/mutants.py: a CNN, an MLP, If/Loop bodies, external data and a
local function) with a few random bytes set, bit-flipped, deleted or inserted, a letter made invalid UTF-8, or
cut short. The variant goes
through what `inspect` and `run` do with a model: `load_model`, `inspect_model` + its text, and `save_model`.
Anything but one of our error kinds is a finding (the first sweep found 125 internal errors from string fields
that are not valid UTF-8: tests/hostile/test_utf8_strings.py).

The loop runs in one forked child with RLIMIT_AS set a fixed margin above what it starts with, so an allocation
sized by a header fails (MemoryError is a finding) instead of swapping the machine, and under a wall timeout
(a variant that hangs is a finding). Default: 100 variants, a few seconds; `-m slow`: QC_FUZZ_VARIANTS
(default 2000) variants from other seeds.
"""
from __future__ import annotations

import json
import os
import random
import re
import resource
import signal
import time
import traceback

import pytest

from tests.hostile.mutants import BUILT, WEIGHTS_BIN, source

MARGIN = 1 << 30        # address space the child may add to what it holds when it starts
PER_VARIANT = 5.0       # seconds: a variant slower than this is a finding (a hang)


_NAMEISH = re.compile(rb"[A-Za-z_][A-Za-z0-9_.:/-]{2,}")


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    names = [m.start() + j for m in _NAMEISH.finditer(data) for j in range(m.end() - m.start())]
    for _ in range(rng.choice((1, 1, 2, 3, 8))):
        if not b:
            break
        i = rng.randrange(len(b))
        op = rng.random()
        if op < 0.45:
            b[i] = rng.randrange(256)
        elif op < 0.6:
            b[i] ^= 1 << rng.randrange(8)
        elif op < 0.7:
            del b[i:i + rng.randrange(1, 16)]
            names = []   # offsets moved
        elif op < 0.75:
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 8)))
            names = []
        elif op < 0.8:
            b[i] = rng.choice((0x00, 0x7F, 0x80, 0xFF))   # varint edges
        elif op < 0.95:
            # a character of a name made invalid UTF-8 (a random byte rarely lands in a string field of a
            # model whose bytes are mostly weights)
            if names:
                b[rng.choice(names)] = rng.choice((0x80, 0xC3, 0xFF))
        else:
            return bytes(b[:i])
    return bytes(b)


def _variants(count: int, seed: int):
    names = list(BUILT)
    for k in range(count):
        name = names[k % len(names)]
        yield name, k, mutate(source(name).model.SerializeToString(), random.Random(f"{seed}/{name}/{k}"))


def _run_all(folder: str, count: int, seed: int) -> dict:
    """The fuzz loop (in the child): {'done': n, 'findings': [...], 'slow': [...]}."""
    from qcompiler.errors import QCompilerError
    from qcompiler.inspect_model import format_inspect, inspect_model
    from qcompiler.onnx_io import load_model, save_model
    findings, slow, done = [], [], 0
    path, out = os.path.join(folder, "model.onnx"), os.path.join(folder, "out.onnx")
    for name, k, data in _variants(count, seed):
        with open(os.path.join(folder, WEIGHTS_BIN), "wb") as f:
            f.write(source(name).weights + bytes(range(256)) * 16)
        with open(path, "wb") as f:
            f.write(data)
        t0 = time.monotonic()
        try:
            model = load_model(path)
            format_inspect(inspect_model(model))
            save_model(model, out)
        except QCompilerError as e:
            if "\n" in str(e) or "Traceback" in str(e):
                findings.append(f"{name}#{k}: {type(e).__name__} message of several lines")
        except BaseException as e:  # noqa: BLE001 - anything else is the finding
            where = traceback.extract_tb(e.__traceback__)[-1]
            findings.append(f"{name}#{k}: {type(e).__name__}: {str(e)[:120]} at {where.filename}:{where.lineno}")
        if time.monotonic() - t0 > PER_VARIANT:
            slow.append(f"{name}#{k}: {time.monotonic() - t0:.1f} s")
        done += 1
    return {"done": done, "findings": findings, "slow": slow}


def fuzz_in_child(folder: str, count: int, seed: int, timeout: float) -> dict:
    for name in BUILT:   # build the sources before the fork (cached): the child only mutates and loads
        source(name)
    import qcompiler.inspect_model  # noqa: F401 - imported once, before the limit
    import qcompiler.onnx_io  # noqa: F401
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: limit, run, report, leave without running the parent's atexit/pytest state
        code = 0
        try:
            os.close(r)
            with open("/proc/self/statm") as f:
                vm = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            resource.setrlimit(resource.RLIMIT_AS, (vm + MARGIN, vm + MARGIN))
            res = _run_all(folder, count, seed)
            os.write(w, json.dumps(res).encode())
        except BaseException:  # noqa: BLE001
            os.write(w, json.dumps({"crash": traceback.format_exc()[-2000:]}).encode())
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    deadline = time.monotonic() + timeout
    chunks = []
    os.set_blocking(r, False)
    while True:
        try:
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                os.close(r)
                raise AssertionError(f"fuzz child did not finish {count} variants in {timeout:.0f} s (a hang)")
            time.sleep(0.01)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    res = json.loads(b"".join(chunks) or b"{}")
    assert "crash" not in res, res.get("crash")
    assert os.waitstatus_to_exitcode(status) == 0 and res.get("done") == count, (status, res)
    return res


def _check(tmp_path, count: int, seed: int, timeout: float) -> None:
    res = fuzz_in_child(str(tmp_path), count, seed, timeout)
    problems = res["findings"] + [f"slow: {s}" for s in res["slow"]]
    assert not problems, f"{len(problems)} of {count} variants:\n" + "\n".join(problems[:40])


def test_fuzz_loader_seeded(tmp_path):
    _check(tmp_path, 100, seed=0, timeout=60)


@pytest.mark.slow
def test_fuzz_loader_sweep(tmp_path):
    n = int(os.environ.get("QC_FUZZ_VARIANTS", "2000"))
    _check(tmp_path, n, seed=1, timeout=max(120.0, n * 0.5))
