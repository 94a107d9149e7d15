"""Float outputs kept for the report's SQNR, held in an unnamed temporary file instead of memory.

Calibration keeps up to SQNR_KEEP_BYTES of float graph outputs (a decoder's 32000-wide logits: 16 MB a sample,
256 MB in all) from the first pass until measure-sqnr and the safety net read them back. For a large model that
is memory stacked on every later stage (the quantized model's session, the safety net's copies), so there each
kept output goes to one temporary file, unlinked from the start (nothing is left behind, even by a killed run),
and is read back whenever it is indexed: `SpilledOutputs` is a read-only mapping like the dict it replaces.
"""
from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Mapping

import numpy as np


class SpillFile:
    """Arrays appended to one unlinked temporary file, read back by (offset, dtype, shape)."""

    def __init__(self):
        self._f = tempfile.TemporaryFile()
        self._end = 0
        self._lock = threading.Lock()

    def put(self, a: np.ndarray) -> tuple:
        a = np.ascontiguousarray(a)
        data = memoryview(a).cast("B") if a.size else b""
        with self._lock:
            at = self._end
            self._end += len(data)
        done = 0
        while done < len(data):
            done += os.pwrite(self._f.fileno(), data[done:], at + done)
        return at, a.dtype, a.shape

    def get(self, ref: tuple) -> np.ndarray:
        at, dtype, shape = ref
        out = np.empty(shape, dtype)
        buf = memoryview(out).cast("B") if out.size else memoryview(b"")
        done = 0
        while done < len(buf):
            n = os.preadv(self._f.fileno(), [buf[done:]], at + done)
            if n <= 0:
                raise OSError("the temporary file of kept outputs ended early")
            done += n
        return out

    def outputs(self, arrays: dict) -> "SpilledOutputs":
        return SpilledOutputs(self, {n: self.put(np.asarray(a)) for n, a in arrays.items()})


class SpilledOutputs(Mapping):
    """{output name: array} whose arrays are read from a SpillFile each time they are indexed."""

    def __init__(self, spill: SpillFile, refs: dict):
        self._spill, self._refs = spill, refs

    def __getitem__(self, name):
        return self._spill.get(self._refs[name])

    def __iter__(self):
        return iter(self._refs)

    def __len__(self):
        return len(self._refs)
