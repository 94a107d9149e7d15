"""Run the CLI on hostile input in a child process and check the hostile-input promises (docs/promises.md) for every run.

`run_cli(args, inputs=...)` runs `python -m qcompiler ARGS` (or a fork of a pre-imported server, see
forkserver.py) with RLIMIT_AS and RLIMIT_CPU set in the child, a wall timeout, stdin from /dev/null, and the
sha256 of every input file (models, external data, calibration files and folders, configs, encodings) taken
before and after. `check(run)` then asserts:

- the exit code is 0 or 2 (3 where allowed: quantize's accuracy floor); 1 is an internal error, anything
  negative a signal (the rlimit, an abort, a segfault);
- not killed by the wall timeout (a FIFO or a bomb must never hang) and no MemoryError (the rlimit);
- on exit 2 stderr is exactly one line starting "qcompiler: error:"; no "Traceback" ever;
- no input file changed (and none vanished): same sha256, mode, inode and mtime, so even a write of identical
  bytes onto an input counts.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import resource
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MEM_LIMIT = 3 << 30          # RLIMIT_AS of each child
CPU_LIMIT = 60               # RLIMIT_CPU seconds
TIMEOUT = 20.0               # wall seconds
USE_FORK = os.environ.get("QC_HOSTILE_FORK", "1") != "0"
# NOTE: the product bounds each onnxruntime run ($QCOMPILER_RUN_TIMEOUT, 600 s by default); the children get a
# bound under the wall timeout, so a Loop that never ends must come back as its one-line error, not as a kill
RUN_TIMEOUT = str(TIMEOUT / 4)


def _child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["QCOMPILER_RUN_TIMEOUT"] = RUN_TIMEOUT
    return env


@dataclass
class Run:
    args: list
    rc: int
    stdout: str
    stderr: str
    elapsed: float
    timeout: bool = False
    changed: list = field(default_factory=list)   # input files whose hash changed (or that vanished)

    def describe(self) -> str:
        err = self.stderr if len(self.stderr) < 1500 else self.stderr[:600] + "\n...\n" + self.stderr[-800:]
        return (f"qcompiler {' '.join(_show(a) for a in self.args)}\n  rc={self.rc} timeout={self.timeout} "
                f"elapsed={self.elapsed:.1f}s changed={self.changed}\n  stderr: {err.strip()!s}")


def _show(a: str) -> str:
    a = str(a)
    return repr(a) if (not a or any(c in a for c in " \n\x00'\"")) else (a if len(a) < 120 else a[:100] + "...")


# ---------------------------------------------------------------- hashes of inputs

def _hash_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def snapshot(paths) -> dict:
    """path -> (kind, hash) for each input; folders are walked; FIFOs and devices are never opened."""
    out = {}
    for p in paths:
        if p is None:
            continue
        p = os.fspath(p)
        try:
            st = os.lstat(p)
        except (OSError, ValueError):
            continue
        if stat.S_ISLNK(st.st_mode):
            out[p] = ("link", os.readlink(p))
            try:
                st = os.stat(p)
            except OSError:
                continue
            p = os.path.realpath(p)
        if stat.S_ISDIR(st.st_mode):
            out[p] = ("dir", None)
            for root, _dirs, files in os.walk(p):
                for name in files:
                    out.update(snapshot([os.path.join(root, name)]))
        elif stat.S_ISREG(st.st_mode):
            # inode and mtime too: a write that lands on an input with the same bytes is still a write on it
            out[p] = ("file", _hash_file(p), stat.S_IMODE(st.st_mode), st.st_ino, st.st_mtime_ns)
        else:
            out[p] = ("special", stat.S_IFMT(st.st_mode), st.st_rdev)
    return out


def changed(before: dict, after: dict) -> list:
    return sorted(p for p in before if after.get(p) != before[p])


# ---------------------------------------------------------------- running

def _limits(mem: int, cpu: int, umask: int):
    def pre():
        os.umask(umask)
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    return pre


class ForkServer:
    """One per test process: a `forkserver.py` child that answers run requests (see its docstring)."""
    _lock = threading.Lock()

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "forkserver.py")],
                                     cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, bufsize=1, env=_child_env())
        atexit.register(self.close)

    def request(self, req: dict) -> dict:
        with self._lock:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("hostile fork server died")
        return json.loads(line)

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


_server = None


def _fork_server() -> ForkServer:
    global _server
    if _server is None or _server.proc.poll() is not None:
        _server = ForkServer()
    return _server


def run_cli(args, inputs=(), cwd=None, timeout: float = TIMEOUT, mem: int = MEM_LIMIT, cpu: int = CPU_LIMIT,
            umask: int = 0o022, fork: "bool | None" = None, python: "list | None" = None) -> Run:
    """Run `python -m qcompiler *args` (or `python *python` if given) in a limited child; hash `inputs`."""
    args = [os.fspath(a) for a in args]
    cwd = os.fspath(cwd) if cwd is not None else REPO
    before = snapshot(inputs)
    use_fork = (USE_FORK if fork is None else fork) and python is None
    if use_fork:
        r = _fork_server().request({"args": args, "cwd": cwd, "timeout": timeout, "mem": mem, "cpu": cpu,
                                    "umask": umask})
        run = Run(args, r["rc"], r["stdout"], r["stderr"], r["elapsed"], r["timeout"])
    else:
        argv = [sys.executable, *(python if python is not None else ["-m", "qcompiler", *args])]
        env = _child_env()
        t0 = time.monotonic()
        p = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, preexec_fn=_limits(mem, cpu, umask), start_new_session=True,
                             env=env)
        timed_out = False
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            try:
                os.killpg(p.pid, 9)
            except OSError:
                p.kill()
            out, err = p.communicate()
        run = Run(list(python) if python is not None else args, p.returncode, out.decode("utf-8", "replace"),
                  err.decode("utf-8", "replace"), time.monotonic() - t0, timed_out)
    run.changed = changed(before, snapshot(inputs))
    return run


def problems(run: Run, allowed=(0, 2), word: "str | None" = None) -> list:
    """What is wrong with `run` (empty when it kept every promise); `word` must be in an exit-2 line."""
    bad = []
    if run.timeout:
        bad.append(f"killed by the {run.elapsed:.0f}s wall timeout (a hang)")
    elif run.rc < 0:
        bad.append(f"killed by signal {-run.rc}")
    if "MemoryError" in run.stderr or "bad_alloc" in run.stderr:
        bad.append("ran out of the memory limit")
    if "Traceback" in run.stderr or "Traceback" in run.stdout:
        last = [ln for ln in run.stderr.strip().splitlines() if ln.strip()][-1:] or ["?"]
        bad.append(f"traceback: {last[0][:200]}")
    if 0 in allowed:
        allowed = tuple(allowed) + (3,)   # quantize finished, output SQNR below the floor
    if not run.timeout and run.rc >= 0 and run.rc not in allowed:
        bad.append(f"exit code {run.rc}, expected one of {tuple(allowed)}")
    if run.rc == 2:
        lines = run.stderr.splitlines()
        if len(lines) != 1:
            bad.append(f"exit 2 with {len(lines)} lines on stderr, expected exactly one")
        elif not lines[0].startswith("qcompiler: error:"):
            bad.append(f"exit 2 line does not start with 'qcompiler: error:': {lines[0][:120]!r}")
        elif len(lines[0]) > 600:
            bad.append(f"exit 2 line is {len(lines[0])} characters long (untrusted value not truncated)")
        if word is not None and lines and word.lower() not in run.stderr.lower():
            bad.append(f"the error line does not name {word!r}")
    if run.changed:
        bad.append(f"input files changed: {run.changed}")
    return bad


def check(run: Run, allowed=(0, 2), word: "str | None" = None) -> Run:
    bad = problems(run, allowed, word)
    assert not bad, "; ".join(bad) + "\n" + run.describe()
    return run
