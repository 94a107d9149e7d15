"""The safety net's independent trials on the run's executor (qcompiler/quant/runtime/executor.py).

Most trials depend on the one before (a bisection, members turned back on one by one); a few phases have
candidates that do not: the two halves of a group, the candidate regions of one round. `_Trials.harm_many` runs
those through a `TrialPool` on the run's executor: Ray with `--ray`, the caller's `executor=`, else local
worker processes where they pay (executor.run_executor's rule: more cores than the two samples an in-process
trial runs at once, and a model of SMALL_MODEL_BYTES or more; otherwise every trial runs here). Each worker builds its own session of
the switchable model once (a file written here, read back by path) and runs one switch setting per item on the
trial samples (an .npz written here, read with allow_pickle=False); it returns the raw outputs and this process
reduces them exactly as an in-process trial does, so the numbers, hence every choice, are the serial run's.

NOTE: the paths are this machine's: a Ray cluster of several machines needs them on a shared filesystem
(TMPDIR); a worker that cannot run a batch makes it run in this process instead (same result, slower).
"""
from __future__ import annotations

import os
import tempfile
from typing import List, Optional, Sequence

import numpy as np

from qcompiler.ort_session import create_session
from qcompiler.passes.quantize.safety_net.trials import _SWITCH_ON, _SWITCH_WIDE

_CACHE: dict = {}     # in a worker: model path -> (session, output names, samples path, feeds); one entry


def run_trial(item) -> List[list]:
    """item = (switchable model path, samples .npz path, on flags, wide flags or None, sample indices): per
    sample asked for, the outputs in the session's output order. Module level: the executors import it by
    name."""
    model_path, samples_path, on, wide, which = item
    hit = _CACHE.get(model_path)
    if hit is None or hit[2] != samples_path:
        _CACHE.clear()
        with open(model_path, "rb") as f:
            sess = create_session(f.read(), role="safety net")
        with np.load(samples_path, allow_pickle=False) as z:
            names = [str(x) for x in z["__names__"]]
            feeds, i = [], 0
            while f"s{i}_0" in z.files:
                feeds.append({n: z[f"s{i}_{j}"] for j, n in enumerate(names)})
                i += 1
        hit = _CACHE[model_path] = (sess, [o.name for o in sess.get_outputs()], samples_path, feeds)
    sess, outs, _, feeds = hit
    feedx = {_SWITCH_ON: np.asarray(on, bool)}
    if wide is not None:
        feedx[_SWITCH_WIDE] = np.asarray(wide, bool)
    return [sess.run(outs, {**feeds[i], **feedx}, where="a safety-net trial") for i in which]


def describe(executor) -> str:
    """"serial", "processes (2 workers)", "ray (8 workers)": what the report says ran the trials."""
    workers = int(getattr(executor, "workers", 1) or 1)
    name = getattr(executor, "name", type(executor).__name__)
    return "serial" if workers < 2 else f"{name} ({workers} workers)"


def trial_pool(executor, proto) -> Optional["TrialPool"]:
    """A pool for the switchable model `proto` when `executor` runs work elsewhere (None: serial, one worker)."""
    if executor is None or int(getattr(executor, "workers", 2) or 1) < 2:
        return None
    return TrialPool(executor, proto)


class TrialPool:
    """One switchable model (written once) and its executor; `run(kept, settings)` -> per setting, per sample,
    the outputs, or None when the batch could not run there (the caller runs it in process)."""

    def __init__(self, executor, proto):
        self.executor = executor
        self.workers = max(1, int(getattr(executor, "workers", 2) or 1))
        self._dir = tempfile.TemporaryDirectory(prefix="qcompiler-sn-")
        self.model_path = os.path.join(self._dir.name, "switchable.onnx")
        with open(self.model_path, "wb") as f:
            f.write(proto.SerializeToString())
        self._samples = None        # (id of the kept list, path)
        self.failed = False
        self.trials = 0             # settings run through the executor

    def _samples_path(self, kept) -> Optional[str]:
        if self._samples is not None and self._samples[0] is kept:
            return self._samples[1]
        names = list(kept[0][0]) if kept else []
        if not names:
            return None
        arrays = {"__names__": np.array(names)}
        for i, (feed, _) in enumerate(kept):
            if list(feed) != names:
                return None
            for j, n in enumerate(names):
                a = np.asarray(feed[n])
                if a.dtype == object:
                    return None            # not storable without pickling: the trials stay in process
                arrays[f"s{i}_{j}"] = a
        path = os.path.join(self._dir.name, f"samples{id(kept)}.npz")
        np.savez(path, **arrays)
        self._samples = (kept, path)
        return path

    def run(self, kept, settings: Sequence[tuple]) -> Optional[List[List[list]]]:
        """settings: [(on flags, wide flags or None)]. The settings x samples runs are cut into one item per
        worker at most (a setting's samples split when there are more workers than settings), and put back in
        sample order."""
        if self.failed or not kept:
            return None
        path = self._samples_path(kept)
        if path is None:
            self.failed = True
            return None
        chunk = max(1, min(len(kept), -(-len(kept) * len(settings) // self.workers)))
        cuts = [list(range(i, min(i + chunk, len(kept)))) for i in range(0, len(kept), chunk)]
        try:
            outs = iter(self.executor.map(run_trial, [(self.model_path, path, on, wide, which)
                                                      for on, wide in settings for which in cuts]))
            runs = [[r for _ in cuts for r in next(outs)] for _ in settings]
            self.trials += len(settings)
            return runs
        except Exception:   # noqa: BLE001 - a worker that cannot run the trials: this process runs them
            self.failed = True
            return None

    def close(self) -> None:
        self._dir.cleanup()
