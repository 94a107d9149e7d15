"""One interface for independent evaluations: `executor.map(fn, items) -> list` (results in item order).

The mixed-precision search (qcompiler/quant/mixed_precision/) runs its per-layer evaluations through it:

- `LocalExecutor` (the default): local processes (concurrent.futures.ProcessPoolExecutor, `spawn` start
  method: the parent holds onnxruntime threads, which a fork would copy mid-flight), workers = cores. Items
  are submitted a window at a time (2 per worker), so a large model's serialized copies are not all in memory
  at once.
- `SerialExecutor`: in this process (one core, or a single item: no process start-up to pay).
- `RayExecutor` (`--ray auto|ADDRESS`, `quantize(..., ray="auto")`): the same map on a Ray cluster
  (`ray.init(address=...)`; "auto" joins the cluster this machine belongs to, or starts a local one). Ray is
  an optional extra: `pip install 'qcompiler[ray]'`.

`fn` must be a module-level function and the items our own data (serialized models as bytes, a path to the
samples written as .npz, read back with allow_pickle=False): the user's data is never pickled; the processes'
own IPC pickles only these items and the results (arrays).
"""
from __future__ import annotations

import os
from typing import Callable, Iterable, List, Optional

from ..errors import ArgumentError

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


class LocalExecutor(Executor):
    """Local worker processes (started on the first map of two or more items, kept until close())."""

    name = "processes"

    def __init__(self, workers: Optional[int] = None):
        self.workers = max(1, int(workers or cores()))
        self._pool = None

    def _get_pool(self):
        if self._pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor
            self._pool = ProcessPoolExecutor(max_workers=self.workers,
                                             mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    def map(self, fn: Callable, items: Iterable) -> List:
        items = list(items)
        if self.workers == 1 or len(items) < 2:
            return [fn(x) for x in items]
        pool = self._get_pool()
        window = self.workers * WINDOW_PER_WORKER
        out: List = [None] * len(items)
        pending = {}
        it = iter(enumerate(items))
        from concurrent.futures import FIRST_COMPLETED, wait
        for i, x in it:
            pending[pool.submit(fn, x)] = i
            if len(pending) >= window:
                break
        while pending:
            done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for f in done:
                out[pending.pop(f)] = f.result()
            for i, x in it:
                pending[pool.submit(fn, x)] = i
                if len(pending) >= window:
                    break
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


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
        ray = self._ray
        remote = ray.remote(num_cpus=1)(fn)
        return ray.get([remote.remote(x) for x in items])

    def close(self) -> None:
        if self._started:
            self._ray.shutdown()
            self._started = False


def check_ray(value) -> Optional[str]:
    """`ray=` of the API / `--ray` of the CLI: None, "auto" or an address (host:port, ray://host:port)."""
    if value is None:
        return None
    from ..arguments import got
    if not isinstance(value, str) or not value.strip() or len(value) > 256 or any(c.isspace() for c in value):
        raise ArgumentError(f"ray must be 'auto' or a cluster address (host:port), got {got(value)}")
    return value


def get_executor(ray: Optional[str] = None, workers: Optional[int] = None) -> Executor:
    """The executor for a run: Ray when `ray` is given, else local processes (serial on one core)."""
    if ray is not None:
        return RayExecutor(ray)
    w = workers or cores()
    return LocalExecutor(w) if w > 1 else SerialExecutor()


__all__ = ["Executor", "SerialExecutor", "LocalExecutor", "RayExecutor", "get_executor", "check_ray", "cores"]
