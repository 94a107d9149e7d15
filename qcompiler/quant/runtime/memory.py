"""Giving memory back between quantization stages: collect a replaced IR model, return freed heap to the OS.

Why: an IR model is one big reference cycle (values <-> nodes <-> graph), and the importer's gc_paused leaves
it in the oldest generation, so a model replaced by its opset-raised copy (minilm: 86 MB) lingered until some
later full collection. And glibc keeps freed heap (onnxruntime sessions, the calibration worker thread's
arena) instead of returning it: after calibration minilm held 85 MB of freed but unreturned memory, which the
next stage's peak was stacked on.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc

_libc = None


def _malloc_trim():
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc.malloc_trim  # glibc only
        except (OSError, AttributeError):
            _libc = False
    if _libc:
        _libc.malloc_trim(0)


def weight_bytes(model) -> int:
    """Bytes of the main graph's initializers (from their headers: nothing is decoded)."""
    return sum(v.tensor.nbytes for v in model.graph.initializers.values())


# NOTE: a model above this many bytes of weights gets no optional extra session (the summary's integer-kernel
# share reads onnxruntime's optimized copy: one more session costs the model's bytes again). A memory rule, not
# protobuf's limit (onnx_io/files.py ONE_PROTO_MAX_BYTES): the same number today, free to move on its own
EXTRA_SESSION_MAX_BYTES = 1 << 30
PREPACK_MAX_BYTES = 256 << 20   # larger models' calibration and capture sessions keep no prepacked weight copies


def prepack_weights(model) -> bool:
    """Whether a session that reads values out of `model` (calibration, layer-input capture) lets onnxruntime keep
    a repacked copy of each weight: only up to PREPACK_MAX_BYTES. Above, that second copy was a 0.5 B decoder's
    peak, for runs that gain little from it; smaller models keep onnxruntime's default, and their values bit
    for bit."""
    return not large_model(model)


def large_model(model) -> bool:
    """Over PREPACK_MAX_BYTES of weights: its sessions keep no prepacked copies, and calibration's kept float
    outputs wait in a temporary file (calibration/spill.py) rather than in memory."""
    return weight_bytes(model) > PREPACK_MAX_BYTES


def release(collect: bool = False) -> None:
    """Return freed heap to the OS (glibc malloc_trim; nothing elsewhere); `collect`: run a full gc first."""
    if collect:
        gc.collect()
    _malloc_trim()


def drop_cached(value) -> None:
    """Forget the decoded copy of a weight that still lives in its external-data file, so reading every weight
    in turn (encodings, QDQ insertion) holds one at a time, not all: the next `const_value()` reads it again.

    Only a tensor with an external reference is touched: its bytes are still in the file it came from; an
    in-memory tensor has no other copy and keeps its array.
    """
    t = getattr(value, "tensor", None)
    if t is not None and getattr(t, "_external", None) is not None:
        t._array = None
