"""Latency of a float model against its quantized copy in onnxruntime: interleaved runs, medians, the ratio.

`measure_latency(float_model, quant_model, feed=None, runs=30, warmup=5, threads=1, clock="wall")` returns a `Latency`:
both medians in milliseconds and `ratio` = quantized / float (below 1: the quantized model is faster).
`time_interleaved({"float": m0, "qc": m1, "ort": m2}, feed, ...)` times any number of models the same way
(benchmarks/bench_latency.py).

Every session comes from `ort_session.create_session` with onnxruntime's default session options (graph
optimization ORT_ENABLE_ALL, CPU EP) except the intra-op thread count, which is fixed (`threads`; None keeps
onnxruntime's default of one thread per physical core). Models are timed round-robin, one run each per round,
with the order reversed every other round, so load from other processes and CPU frequency drift fall on all
of them alike; after `warmup` untimed rounds the median of `runs` timed runs is kept per model.

`clock`: "wall" (default: elapsed time, what a user waits) or "cpu": the CPU time of the timing thread
(`time.thread_time`; onnxruntime runs a one-thread session in the caller's thread), which leaves out the time
the process waits preempted. NOTE: on a loaded machine (load average 12 on 2 cores here) a run longer than the
scheduler's slice is preempted more often than not, and the wall median of a 1.7 ms model jumped to 10-20 ms
while the 1.2 ms float model stayed put: compare under load with clock="cpu" (threads=1 only).

`feed` is one sample (input name -> array); None builds one from the float model's input types (dims that are
not fixed become 1; integer inputs are zeros, float inputs standard normal with a fixed seed).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np

from qcompiler.arguments import require_choice
from qcompiler.errors import ArgumentError
from qcompiler.ort_session import create_session

DEFAULT_RUNS = 30
DEFAULT_WARMUP = 5


@dataclass(frozen=True)
class Latency:
    """Median milliseconds per run of the float and the quantized model, measured interleaved."""

    float_ms: float
    quant_ms: float
    runs: int
    threads: Optional[int]
    clock: str = "wall"

    @property
    def ratio(self) -> float:
        """quant_ms / float_ms: below 1.0 the quantized model is faster."""
        return self.quant_ms / self.float_ms if self.float_ms > 0 else float("inf")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ratio"] = round(self.ratio, 4)
        return d


_NP = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
       "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8, "tensor(uint8)": np.uint8,
       "tensor(bool)": np.bool_, "tensor(int16)": np.int16}


def default_feed(session, seed: int = 0) -> dict:
    """One sample for `session`'s inputs: free dims 1, floats standard normal, integers and bools zero."""
    rng = np.random.default_rng(seed)
    feed = {}
    for i in session.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in (i.shape or [])]
        dt = _NP.get(i.type)
        if dt is None:
            raise ArgumentError(f"input '{i.name[:80]}' of type {i.type} has no default sample: pass a feed")
        if np.issubdtype(dt, np.floating):
            feed[i.name] = rng.standard_normal(shape).astype(dt)
        else:
            feed[i.name] = np.zeros(shape, dt)
    return feed


CLOCKS = ("wall", "cpu")


def _check(runs, warmup, threads, clock="wall") -> None:
    require_choice(clock, "clock", CLOCKS)
    if clock == "cpu" and threads != 1:
        raise ArgumentError("clock='cpu' needs threads=1 (the CPU time of the one thread that runs the model)")
    for name, v, lo in (("runs", runs, 1), ("warmup", warmup, 0)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ArgumentError(f"{name} must be an int >= {lo}, got {v!r}"[:120])
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ArgumentError(f"threads must be None or an int >= 1, got {threads!r}"[:120])


def time_interleaved(models: dict, feed=None, runs: int = DEFAULT_RUNS,
                     warmup: int = DEFAULT_WARMUP, threads: Optional[int] = 1, clock: str = "wall") -> dict:
    """{label: median ms} for each model (IR, ModelProto or bytes), timed round-robin in one process.

    The first model's inputs define the default feed; each model is given the inputs it declares. `feed` may be
    a list of feeds: a round then runs each model on every one of them and its time is their sum (a model whose
    cost depends on the input is timed on more than one).
    """
    _check(runs, warmup, threads, clock)
    now = time.perf_counter if clock == "wall" else time.thread_time
    sessions = {k: create_session(m, role=str(k), threads=threads) for k, m in models.items()}
    if feed is None:
        feed = default_feed(next(iter(sessions.values())))
    given = list(feed) if isinstance(feed, (list, tuple)) else [feed]
    if not given:
        raise ArgumentError("time_interleaved needs at least one feed")
    feeds = {}
    for k, s in sessions.items():
        names = [i.name for i in s.get_inputs()]
        missing = [n for n in names if any(n not in f for f in given)]
        if missing:
            raise ArgumentError(f"the feed has no input '{missing[0][:80]}' of the {k} model")
        feeds[k] = [{n: f[n] for n in names} for f in given]
    for k, s in sessions.items():   # a run that fails does so here, as one line through Session.run
        for f in feeds[k]:
            s.run(None, f, where=f"the {k} model's first run")
    order = list(sessions)
    times = {k: [] for k in order}
    for r in range(warmup + runs):
        for k in (order if r % 2 == 0 else order[::-1]):
            raw, fs = sessions[k].raw, feeds[k]
            t0 = now()
            for f in fs:
                raw.run(None, f)
            dt = now() - t0
            if r >= warmup:
                times[k].append(dt * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def measure_latency(float_model, quant_model, feed: Optional[dict] = None, runs: int = DEFAULT_RUNS,
                    warmup: int = DEFAULT_WARMUP, threads: Optional[int] = 1, clock: str = "wall") -> Latency:
    """Float against quantized, interleaved (see the module docstring): a `Latency` with both medians."""
    med = time_interleaved({"float": float_model, "quantized": quant_model}, feed, runs, warmup, threads, clock)
    return Latency(float_ms=med["float"], quant_ms=med["quantized"], runs=runs, threads=threads, clock=clock)


__all__ = ["Latency", "measure_latency", "time_interleaved", "default_feed", "DEFAULT_RUNS", "DEFAULT_WARMUP"]
