"""One interface for independent evaluations: `executor.map(fn, items) -> list` (results in item order).

The mixed-precision search (passes/quantize/mixed_precision/search/) runs its per-layer evaluations through it:

- `LocalExecutor` (the default): local worker processes (`python -c` interpreters fed over pipes: not
  multiprocessing, see its NOTE), workers = cores. Items are read lazily and submitted a window at a time (2
  per worker), so a large model's serialized candidates are never all in memory at once (minilm: 90 MB each).
- `SerialExecutor`: in this process (one core, or a single item: no process start-up to pay).

`run_executor` is the rule a pass uses when the caller gave no executor (mixed precision, the safety net's
independent trials: passes/quantize/safety_net/parallel.py).
- `RayExecutor` (`--ray auto|ADDRESS`, `quantize(..., ray="auto")`): the same map on a Ray cluster
  (`ray.init(address=...)`; "auto" joins the cluster this machine belongs to, or starts a local one). Ray is
  an optional extra: `pip install 'qcompiler[ray]'`.

`fn` must be a module-level function and the items our own data (serialized models as bytes, a path to the
samples written as .npz, read back with allow_pickle=False): the user's data is never pickled; the processes'
own IPC pickles only these items and the results (arrays).
"""
from __future__ import annotations

import importlib
import os
import queue
import struct
import subprocess
import sys
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Callable, Iterable, List, Optional

from qcompiler.arguments import got
from qcompiler.errors import ArgumentError

WINDOW_PER_WORKER = 2


def cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


class Executor:
    """map(fn, items) -> [fn(item) for item in items], possibly elsewhere; `close()` frees the workers."""

    name = "serial"
    workers = 1

    def map(self, fn: Callable, items: Iterable) -> List:
        return [fn(x) for x in items]

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class SerialExecutor(Executor):
    pass


class WorkerError(RuntimeError):
    """A local worker process died (or its call raised): the executor's map fails with its reason."""


def _worker_main() -> None:  # pragma: no cover - runs in the worker process
    """A worker: read (module, function name, item) frames on stdin, write ("ok", result) / ("err", text)."""
    import pickle
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)                       # a library printing to stdout must not break the frames
    inp = sys.stdin.buffer
    while True:
        head = inp.read(8)
        if len(head) < 8:
            return
        module, name, item = pickle.loads(inp.read(struct.unpack("<Q", head)[0]))
        try:
            fn = importlib.import_module(module)
            for part in name.split("."):
                fn = getattr(fn, part)
            reply = ("ok", fn(item))
        except BaseException as e:  # noqa: BLE001 - reported to the parent as one line
            reply = ("err", f"{type(e).__name__}: {str(e)[:300]}")
        data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        out.write(struct.pack("<Q", len(data)) + data)
        out.flush()


class LocalExecutor(Executor):
    """Local worker processes: `python -c` interpreters started on the first map of two or more items (kept
    until close()), each fed one item at a time over a pipe by a thread of this process.

    NOTE: not multiprocessing: its spawn/forkserver start methods import the caller's main module in every
    worker, which runs a script without an `if __name__ == "__main__"` guard again (its quantize() call
    included), and fork copies onnxruntime's threads mid-flight. These workers import only the function's
    module."""

    name = "processes"

    def __init__(self, workers: Optional[int] = None):
        self.workers = max(1, int(workers or cores()))
        self._idle = None
        self._all: list = []
        self._lock = None

    def _start(self):
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([pkg_root] + [p for p in os.environ.get("PYTHONPATH", "").split(
                       os.pathsep) if p]))
        p = subprocess.Popen([sys.executable, "-c", "from qcompiler.quant.runtime.executor import _worker_main; "
                              "_worker_main()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, env=env, cwd=pkg_root)
        self._all.append(p)
        return p

    def _call(self, module: str, name: str, item):
        import pickle
        p = self._idle.get()
        try:
            if p is None:
                p = self._start()
            data = pickle.dumps((module, name, item), protocol=pickle.HIGHEST_PROTOCOL)
            try:
                p.stdin.write(struct.pack("<Q", len(data)) + data)
                p.stdin.flush()
                head = p.stdout.read(8)
                if len(head) < 8:
                    raise EOFError
                status, value = pickle.loads(p.stdout.read(struct.unpack("<Q", head)[0]))
            except (OSError, EOFError, pickle.UnpicklingError):
                p.kill()
                code = p.wait()
                p = None
                raise WorkerError(f"a worker process died (exit code {code}) running {name}") from None
            if status != "ok":
                raise WorkerError(f"{name} failed in a worker process: {value}")
            return value
        finally:
            self._idle.put(p)

    def map(self, fn: Callable, items: Iterable) -> List:
        """`items` is read lazily: at most WINDOW_PER_WORKER per worker exist at once."""
        if self.workers == 1:
            return [fn(x) for x in items]
        module, name = fn.__module__, fn.__qualname__
        if self._idle is None:
            self._idle = queue.Queue()
            for _ in range(self.workers):
                self._idle.put(None)          # a worker slot, started on first use
        window = self.workers * WINDOW_PER_WORKER
        out: dict = {}
        pending = {}
        it = iter(enumerate(items))
        with ThreadPoolExecutor(max_workers=self.workers) as threads:
            def fill():
                for i, x in it:
                    pending[threads.submit(self._call, module, name, x)] = i
                    if len(pending) >= window:
                        return
            fill()
            while pending:
                done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                for f in done:
                    out[pending.pop(f)] = f.result()
                fill()
        return [out[i] for i in range(len(out))]

    def close(self) -> None:
        for p in self._all:
            try:
                p.stdin.close()
            except OSError:
                pass
        for p in self._all:
            try:
                p.wait(timeout=10)
            except Exception:  # noqa: BLE001 - a worker stuck in a run: stop it
                p.kill()
                p.wait()
        self._all, self._idle = [], None


class RayExecutor(Executor):
    """The same map on a Ray cluster: `address` "auto" (the cluster this machine is in, else a local one) or
    "HOST:PORT" / "ray://HOST:PORT"."""

    name = "ray"

    def __init__(self, address: str = "auto"):
        try:
            import ray
        except ImportError:
            raise ArgumentError("--ray needs Ray: pip install 'qcompiler[ray]'") from None
        self._ray = ray
        self._started = False
        if not ray.is_initialized():
            kw = {"ignore_reinit_error": True, "log_to_driver": False, "include_dashboard": False}
            try:
                ray.init(address=address, **kw)
            except ConnectionError:
                if address != "auto":
                    raise ArgumentError(f"--ray {address[:80]}: no Ray cluster answers there") from None
                ray.init(**kw)   # auto and no cluster: a local one, for this run
            self._started = True
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))

    def map(self, fn: Callable, items: Iterable) -> List:
        """`items` is read lazily: at most WINDOW_PER_WORKER per cluster CPU are in flight."""
        ray = self._ray
        remote = ray.remote(num_cpus=1)(fn)
        window = self.workers * WINDOW_PER_WORKER
        refs, index, out = [], {}, {}
        for i, x in enumerate(items):
            ref = remote.remote(x)
            refs.append(ref)
            index[ref] = i
            if len(refs) >= window:
                done, refs = ray.wait(refs, num_returns=1)
                for r in done:
                    out[index.pop(r)] = ray.get(r)
        for r in refs:
            out[index.pop(r)] = ray.get(r)
        return [out[i] for i in range(len(out))]

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False


def check_ray(value) -> Optional[str]:
    """`ray=` of the API / `--ray` of the CLI: None, "auto" or an address (host:port, ray://host:port)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > 256 or any(c.isspace() for c in value):
        raise ArgumentError(f"ray must be 'auto' or a cluster address (host:port), got {got(value)}")
    return value


def get_executor(ray: Optional[str] = None, workers: Optional[int] = None) -> Executor:
    """The executor for a run: Ray when `ray` is given, else local processes (serial on one core)."""
    if ray is not None:
        return RayExecutor(ray)
    w = workers or cores()
    return LocalExecutor(w) if w > 1 else SerialExecutor()


# below this many weight bytes a run's evaluations stay in this process: a worker's start-up (importing
# onnxruntime and building its session, ~1-2 s) costs more than such a model's runs (digits_cnn: 48
# mixed-precision evaluations in 4 s)
SMALL_MODEL_BYTES = 4 << 20


def run_executor(ray: Optional[str], model_weight_bytes: int, in_process: int = 1) -> Executor:
    """The executor of a pass whose caller gave none (the rule, one place): Ray with `ray`; else local processes
    when this machine has more cores than one evaluation in this process keeps busy (`in_process`: the
    mixed-precision search runs one sample at a time, a safety-net trial two) and the model holds
    SMALL_MODEL_BYTES of weights or more; else this process.

    NOTE: on 2 cores a safety-net trial already keeps both busy: worker processes only add their start-up
    (minilm_l6 on qnn_htp, 2 workers: 0.93 s a trial against 0.57 s in this process; docs/parallel.md)."""
    if ray is not None:
        return RayExecutor(ray)
    small = model_weight_bytes < SMALL_MODEL_BYTES or cores() <= in_process
    return get_executor(workers=1 if small else None)


__all__ = ["Executor", "SerialExecutor", "LocalExecutor", "RayExecutor", "get_executor", "run_executor",
           "check_ray", "cores", "SMALL_MODEL_BYTES"]
