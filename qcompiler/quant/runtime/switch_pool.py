"""One model with switch inputs, run for many switch settings at once on an executor (executor.py).

The safety net's trials (passes/quantize/safety_net/parallel.py) and `qcompiler debug`'s "alone" runs
(qcompiler/debugger/engine.py) both measure one switchable copy of a QDQ model under many settings of its bool
switch inputs (built by switchable.py). A `SwitchPool` writes that model once to a file and the samples once to an .npz (read back with
allow_pickle=False); each item sent to a worker is (model path, samples path, {switch input: bool array},
sample indices). The worker builds its session once (kept while the model path stays the same) and returns the
raw outputs: the caller reduces them exactly as it does its own runs, so the numbers are the serial run's.

NOTE: the paths are this machine's: a Ray cluster of several machines needs them on a shared filesystem
(TMPDIR). A batch a worker cannot run returns None (the caller runs it in its own process: same result).
"""
from __future__ import annotations

import os
import tempfile
from typing import Dict, List, Optional, Sequence

import numpy as np

from qcompiler.onnx_io.exporter import ExternalData, write_model
from qcompiler.onnx_io.files import ONE_PROTO_MAX_BYTES, _total_tensor_bytes, load_model
from qcompiler.ort_session import create_session

_CACHE: dict = {}     # in a worker: model path -> (session, output names, samples path, feeds); one entry


def run_switched(item) -> List[list]:
    """item = (model path, samples .npz path, {switch input: bool array}, sample indices): per sample asked
    for, the outputs in the session's output order. Module level: the executors import it by name."""
    model_path, samples_path, switches, which = item
    hit = _CACHE.get(model_path)
    if hit is None or hit[2] != samples_path:
        _CACHE.clear()
        if os.path.exists(model_path + ".data"):     # written with external data (SwitchPool.__init__)
            sess = create_session(load_model(model_path), role="switchable copy")
        else:
            with open(model_path, "rb") as f:
                sess = create_session(f.read(), role="switchable copy")
        with np.load(samples_path, allow_pickle=False) as z:
            names = [str(x) for x in z["__names__"]]
            feeds, i = [], 0
            while f"s{i}_0" in z.files:
                feeds.append({n: z[f"s{i}_{j}"] for j, n in enumerate(names)})
                i += 1
        hit = _CACHE[model_path] = (sess, [o.name for o in sess.get_outputs()], samples_path, feeds)
    sess, outs, _, feeds = hit
    extra = {k: np.asarray(v, bool) for k, v in switches.items()}
    return [sess.run(outs, {**feeds[i], **extra}, where="a switched run") for i in which]


def describe(executor) -> str:
    """"serial", "processes (2 workers)", "ray (8 workers)": what a report says ran the runs."""
    workers = int(getattr(executor, "workers", 1) or 1)
    name = getattr(executor, "name", type(executor).__name__)
    return "serial" if workers < 2 else f"{name} ({workers} workers)"


class SwitchPool:
    """One switchable model (written once) and its executor; `run(feeds, settings)` -> per setting, per feed,
    the outputs, or None when the batch could not run there (the caller runs it in process)."""

    def __init__(self, executor, model):
        """`model`: the switchable model, IR (switchable.switchable_model: written tensor by tensor, with
        external data above ONE_PROTO_MAX_BYTES) or a ModelProto."""
        self.executor = executor
        self.workers = max(1, int(getattr(executor, "workers", 2) or 1))
        self._dir = tempfile.TemporaryDirectory(prefix="qcompiler-switch-")
        self.model_path = os.path.join(self._dir.name, "switchable.onnx")
        with open(self.model_path, "wb") as f:
            if hasattr(model, "SerializeToString"):
                f.write(model.SerializeToString())
            elif _total_tensor_bytes(model) > ONE_PROTO_MAX_BYTES:
                with open(self.model_path + ".data", "wb", buffering=1 << 20) as data:
                    write_model(model, f, external=ExternalData(data, os.path.basename(self.model_path) + ".data"))
            else:
                write_model(model, f)
        self._samples = None        # (the feeds list, its path)
        self.failed = False
        self.runs = 0               # settings run through the executor

    @classmethod
    def of(cls, executor, model) -> Optional["SwitchPool"]:
        """A pool when `executor` runs work elsewhere (None: no executor, or one worker)."""
        if executor is None or int(getattr(executor, "workers", 2) or 1) < 2:
            return None
        return cls(executor, model)

    def _samples_path(self, feeds) -> Optional[str]:
        if self._samples is not None and self._samples[0] is feeds:
            return self._samples[1]
        names = list(feeds[0]) if feeds else []
        if not names:
            return None
        arrays = {"__names__": np.array(names)}
        for i, feed in enumerate(feeds):
            if list(feed) != names:
                return None
            for j, n in enumerate(names):
                a = np.asarray(feed[n])
                if a.dtype == object:
                    return None            # not storable without pickling: the runs stay in process
                arrays[f"s{i}_{j}"] = a
        path = os.path.join(self._dir.name, f"samples{len(os.listdir(self._dir.name))}.npz")
        np.savez(path, **arrays)
        self._samples = (feeds, path)
        return path

    def run(self, feeds: list, settings: Sequence[Dict[str, np.ndarray]]) -> Optional[List[List[list]]]:
        """settings: [{switch input: bool array}]. The settings x feeds runs are cut into one item per worker
        at most (a setting's feeds split when there are more workers than settings), and put back in order.
        Pass the same `feeds` list object again to reuse its file."""
        if self.failed or not feeds:
            return None
        path = self._samples_path(feeds)
        if path is None:
            self.failed = True
            return None
        chunk = max(1, min(len(feeds), -(-len(feeds) * len(settings) // self.workers)))
        cuts = [list(range(i, min(i + chunk, len(feeds)))) for i in range(0, len(feeds), chunk)]
        try:
            outs = iter(self.executor.map(run_switched, [(self.model_path, path, s, which)
                                                         for s in settings for which in cuts]))
            runs = [[r for _ in cuts for r in next(outs)] for _ in settings]
        except Exception:   # noqa: BLE001 - a worker that cannot run them: this process runs them
            self.failed = True
            return None
        self.runs += len(settings)
        return runs

    def close(self) -> None:
        self._dir.cleanup()


__all__ = ["SwitchPool", "run_switched", "describe"]
