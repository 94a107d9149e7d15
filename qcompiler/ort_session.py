"""Every onnxruntime session qcompiler makes is created here: quiet, and its refusals become one line.

onnxruntime refuses models for many reasons of its own (an unknown op, domain or opset, an attribute of the
wrong type, tensor data that does not fit its shape, an input without a type) and fails runs on data it cannot
take (a token id out of range for a Gather). Each becomes one QCompilerError line naming the model (or the
sample) and onnxruntime's reason, with the C++ source locations, signatures and error-code prefixes cut away:

- `create_session(model, ...)`: a `Session`; a refusal raises `OnnxRuntimeError` (exit 2 on the CLI).
- `Session.run(names, feed, where=...)`: a failed run raises `DataError` naming `where` (e.g. the sample).
  Both errors carry onnxruntime's cleaned reason alone in `.reason`.
- `model_label(name)`: the name the messages give the model (the CLI's MODEL path), for a `with` block.

onnxruntime's own log lines (`[E:onnxruntime:...]`, `[W:onnxruntime:...]`) would reach the terminal ahead of
our line: the default logger, every session and every run are set to FATAL only.
"""
from __future__ import annotations

import contextlib
import functools
import contextvars
import os
import re
import shutil
import sys
import tempfile
import threading
from typing import Optional

from .errors import DataError, OnnxRuntimeError

LOG_FATAL_ONLY = 4   # onnxruntime severities: 0 verbose, 1 info, 2 warning, 3 error, 4 fatal
REASON_CHARS = 240   # onnxruntime's reason quotes node and value names from the model: keep it short

RUN_TIMEOUT_ENV = "QCOMPILER_RUN_TIMEOUT"
RUN_TIMEOUT_S = 600.0   # one onnxruntime run (one sample); generous: a 0.5 B decoder runs a sample in seconds


def run_timeout() -> float:
    """Seconds one run may take: $QCOMPILER_RUN_TIMEOUT when it is a positive number, else RUN_TIMEOUT_S."""
    try:
        v = float(os.environ.get(RUN_TIMEOUT_ENV, ""))
    except ValueError:
        return RUN_TIMEOUT_S
    return v if 0 < v < float("inf") else RUN_TIMEOUT_S


def _terminate(ro) -> None:
    ro.terminate = True


_LABEL: contextvars.ContextVar = contextvars.ContextVar("qcompiler_model_label", default="")
_quieted = False


def _ort():
    import onnxruntime as ort
    global _quieted
    if not _quieted:
        ort.set_default_logger_severity(LOG_FATAL_ONLY)
        _quieted = True
    return ort


@functools.lru_cache(maxsize=1)
def ort_errors() -> tuple:
    """The exception classes onnxruntime raises for a model or a run it refuses (Fail, InvalidGraph, ...)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state
    return tuple(c for c in vars(state).values()
                 if isinstance(c, type) and issubclass(c, Exception) and c.__module__ == state.__name__)


@contextlib.contextmanager
def model_label(name):
    """Within the block, onnxruntime's refusals name the model `name` (a path is cut to its last 80 chars)."""
    token = _LABEL.set(short_path(name))
    try:
        yield
    finally:
        _LABEL.reset(token)


def short_path(name) -> str:
    if isinstance(name, os.PathLike):
        name = os.fspath(name)
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    if not isinstance(name, str) or not name:
        return ""
    name = "".join(c if c.isprintable() else "?" for c in name)
    return name if len(name) <= 80 else "..." + name[-77:]


def model_prefix(role: str = "") -> str:
    """How a message starts: the `model_label` path and `role` ("m.onnx: ", "m.onnx (quantized): "), or ""
    when no label is set (the message then says "the model" itself)."""
    base = _LABEL.get()
    if not base:
        return ""
    return f"{base} ({role}): " if role else f"{base}: "


_CODE = re.compile(r"\[ONNXRuntimeError\] : \d+ : [A-Z_]+ : ")
_LOAD = re.compile(r"Load model from .*? failed:")
_LOCATION = re.compile(r"(?:\S*/)?[\w.+-]+\.(?:cc|cpp|cxx|h|hpp|cu):\d+ ")
# __PRETTY_FUNCTION__ after a location: 'void ns::f(...)', 'ns::C::C(...)', with no quote or colon-space before
_SIGNATURE = re.compile(r"[\w:<>,*&~ ]*?::~?[\w<>]+\(")
_NODE_LOAD = re.compile(r'In Node, \("(?P<name>[^"]*)", (?P<op>[^,]*), "[^"]*", -?\d+\) : .*? , Error ')
_NODE_RUN = re.compile(r"Non-zero status code returned while running (?P<op>\S+) node\. "
                       r"Name:'(?P<name>.*?)' Status Message: ")


def _node(m) -> str:
    return f"node '{m.group('name')}' ({m.group('op')}): " if m.group("name") else f"{m.group('op')} node: "


def _drop_locations(s: str) -> str:
    """Cut `file.cc:123 Function ` and `file.h:45 void ns::Fn(args) ` (onnxruntime's ORT_THROW prefixes)."""
    for _ in range(8):
        m = _LOCATION.search(s)
        if m is None:
            break
        rest = s[m.end():]
        sig = _SIGNATURE.match(rest)
        if sig is not None:
            depth, end = 0, len(rest)
            for j in range(sig.end() - 1, len(rest)):
                depth += {"(": 1, ")": -1}.get(rest[j], 0)
                if depth == 0:
                    end = j + 1
                    break
            rest = rest[end:].lstrip()
        else:
            rest = re.sub(r"^[\w:~]+ ", "", rest, count=1)   # __FUNCTION__: 'Compute '
        s = s[:m.start()] + rest
    return s


def ort_reason(e: BaseException) -> str:
    """onnxruntime's reason in one short line: first line, no error-code prefix, no C++ location or stack."""
    # NOTE: the lines are joined, not cut to the first: some reasons go on ("invalid dimensions for input: x for
    # the following indices / index: 3 Got: 2 Expected: 4"); a stack trace, when built in, is dropped
    lines = []
    for line in str(e).strip().splitlines():
        if line.strip().lower().startswith("stacktrace"):
            break
        lines.append(line)
    s = " ".join(lines)
    s = _CODE.sub("", s)
    s = _LOAD.sub("", s)
    s = s.replace("Exception during initialization: ", "").replace("This is an invalid model. ", "")
    s = _drop_locations(s)
    s = _NODE_LOAD.sub(_node, s)
    s = _NODE_RUN.sub(_node, s)
    s = " ".join(s.split()) or type(e).__name__
    return s if len(s) <= REASON_CHARS else s[:REASON_CHARS - 3] + "..."


class Session:
    """An onnxruntime InferenceSession whose runs are quiet and whose failures are one DataError line.

    Same `get_inputs`/`get_outputs`/`run(names, feed)` as onnxruntime's, so callers need not know the wrapper.
    """

    def __init__(self, sess, prefix: str, role: str = "", keep=()):
        self._sess, self._prefix, self._role = sess, prefix, role
        self._keep = keep   # the arrays onnxruntime reads its large initializers from (see create_session)

    def get_inputs(self):
        return self._sess.get_inputs()

    def get_outputs(self):
        return self._sess.get_outputs()

    def run(self, output_names, feed, run_options=None, where: Optional[str] = None):
        ort = _ort()
        ro = run_options if run_options is not None else ort.RunOptions()
        ro.log_severity_level = LOG_FATAL_ONLY
        limit = run_timeout()
        # NOTE: a Loop whose condition never turns false (or a trip count of 2^62) runs forever; a timer sets
        # onnxruntime's terminate flag, which every kernel checks, so one run is bounded in wall time
        timer = threading.Timer(limit, _terminate, (ro,))
        timer.daemon = True
        timer.start()
        try:
            return self._sess.run(output_names, feed, ro)
        except ort_errors() as e:
            reason = ort_reason(e)
            if ro.terminate:
                reason = (f"the run took longer than {limit:g} s and was stopped (a Loop that never ends?); "
                          f"set {RUN_TIMEOUT_ENV} to allow longer runs")
        except ValueError as e:   # onnxruntime's Python layer: "Required inputs ([...]) are missing from input feed"
            if "input" not in str(e):
                raise
            reason = ort_reason(e)
        finally:
            timer.cancel()
        if self._prefix:
            at = f" on {where}" if where else ""
        else:
            at = f" on {where}" if where else f" on the {self._role} model" if self._role else ""
        err = DataError(f"{self._prefix}onnxruntime failed{at}: {reason}")
        err.reason = reason
        raise err


SESSION_PREFIX = "qcompiler-session-"
_swept = False


def _sweep_leftovers() -> None:
    """Once per process: remove the session folders a killed qcompiler left in the temporary folder (SIGKILL
    runs no `finally`; each holds a copy of a model). Only our user's folders whose process is gone."""
    global _swept
    if _swept:
        return
    _swept = True
    try:
        with os.scandir(tempfile.gettempdir()) as it:
            for entry in it:
                if not entry.name.startswith(SESSION_PREFIX):
                    continue
                pid = entry.name[len(SESSION_PREFIX):].split("-", 1)[0]
                if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
                    continue
                if entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_uid == os.getuid():
                    shutil.rmtree(entry.path, ignore_errors=True)
    except OSError:
        pass   # an unreadable temporary folder: nothing to sweep, and no reason to fail the run


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


# NOTE: above this many bytes of initializers a session's model goes to onnxruntime with its weights outside the
# protobuf (which cannot exceed 2 GB): well under the limit, so a model of 1-2 GB is not first copied into one
LARGE_MODEL_BYTES = 1 << 30
REFERENCE_MIN_BYTES = 1 << 16   # in that mode, initializers from 64 KB up are handed over without a copy
_MEMORY_LOCATION = "qcompiler-in-memory.bin"   # a name only: onnxruntime gets these tensors' data from us


def _numpy_dtype(onnx_type: int):
    """The little-endian numpy dtype of a plain numeric ONNX element type, or None (bfloat16, float8, int4...)."""
    import numpy as np
    import onnx
    try:
        dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(onnx_type))
    except Exception:   # noqa: BLE001 - an element type onnx has no numpy type for
        return None
    return dt.newbyteorder("<") if dt.kind in "biuf" else None


def _shared_array(name: str, tensor):
    """An array onnxruntime can read `tensor`'s values from without a copy, or None.

    An external tensor of the input that was never decoded is mapped read-only from its (checked) file: the
    pages are the file's, loaded as onnxruntime touches them and never copied into the IR. A decoded tensor
    (a quantized weight, a folded one) is handed over as the IR's own array.
    """
    import numpy as np
    dt = _numpy_dtype(tensor.dtype)
    if dt is None or dt.byteorder == ">" or (dt.byteorder == "=" and sys.byteorder != "little"):
        return None
    if tensor.is_external:
        ref = tensor._external
        if ref.length != tensor.nbytes or ref.offset % dt.itemsize:
            return None   # packed or unaligned: written to the session's own data file instead
        from .errors import ModelLoadError
        from .input_files import open_regular
        what = f"tensor '{name[:80]}': external data file '{(ref.location or ref.path)[:80]}'"
        with open_regular(ref.path, "tensor data", ModelLoadError, limit=None) as f:
            size = os.fstat(f.fileno()).st_size
            if ref.offset + ref.length > size:
                raise ModelLoadError(f"{what} is now {size} bytes, too short for the range "
                                     f"[{ref.offset}, {ref.offset + ref.length}) checked at load")
            return np.memmap(f, dtype=dt, mode="r", offset=ref.offset, shape=tuple(tensor.dims))
    arr = tensor._array
    if arr is None or arr.dtype.kind not in "biuf" or arr.dtype.itemsize != dt.itemsize \
            or arr.dtype.kind != dt.kind or not arr.flags.c_contiguous or not arr.dtype.isnative:
        return None
    return arr


def _large_writer(data_file):
    """The ExternalData of a large session model: big tensors shared with onnxruntime (`_shared_array`), the
    rest of them in the session's own data file."""
    from .onnx_io.exporter import ExternalData
    ort = _ort()

    class SessionTensors(ExternalData):
        def __init__(self):
            super().__init__(data_file, "model.onnx.data")
            self.names, self.values, self.arrays = [], [], []

        def reference(self, name, tensor):
            if tensor.nbytes < REFERENCE_MIN_BYTES:
                return None
            arr = _shared_array(name, tensor)
            if arr is None:
                return None
            self.names.append(name)
            self.values.append(ort.OrtValue.ortvalue_from_numpy(arr))
            self.arrays.append(arr)
            return (_MEMORY_LOCATION, 0, tensor.nbytes)

    return SessionTensors()


def _is_large(model) -> bool:
    from .onnx_io.files import _total_tensor_bytes
    return _total_tensor_bytes(model) > LARGE_MODEL_BYTES


def create_session(model, role: str = "", opt_level=None, threads: Optional[int] = 1, extra_outputs=()) -> Session:
    """A quiet CPU session for an IR model, a ModelProto or serialized model bytes.

    `role` says which copy the messages talk about ("quantized", "after pass 'x'"); `threads`: intra-op threads
    (None: onnxruntime's default); `extra_outputs`: value names added as graph outputs (IR models only).
    A refusal raises OnnxRuntimeError naming the model and onnxruntime's reason.

    NOTE: the model goes to onnxruntime as a file, not as bytes: from bytes it keeps ~90 MB more for minilm (210 vs
    126 MB after load, 262 vs 140 MB peak), and an IR model is written tensor by tensor (exporter.write_model), so
    no serialized copy of the weights is held here. The file sits alone in a private temporary folder, so an
    external-data location the importer missed resolves to nothing rather than to a file beside it; the folder
    is named by our pid, so a later run removes what a killed one left (`_sweep_leftovers`).

    NOTE: a model with over LARGE_MODEL_BYTES of initializers (protobuf cannot hold 2 GB) goes as a small model
    file whose large initializers onnxruntime takes from arrays we hand it (`add_external_initializers`): the
    input's external data mapped read-only from its own file, decoded tensors (quantized weights) as the IR's
    arrays, so neither is copied; other large tensors go to `model.onnx.data` in the private folder. onnxruntime
    resolves external data in the model's folder only and follows links (a symlink to the input's data is
    refused as escaping that folder), hence arrays, not links. Prepacking is off there: it would keep a packed
    copy of every weight next to the one we share (2.25 GiB model: 2x the weights in the calibration session).
    """
    ort = _ort()
    so = ort.SessionOptions()
    so.log_severity_level = LOG_FATAL_ONLY
    if threads:
        so.intra_op_num_threads = threads
    if opt_level is not None:
        so.graph_optimization_level = opt_level
    prefix = model_prefix(role)
    if hasattr(model, "SerializeToString") and not isinstance(model, (bytes, bytearray)) \
            and model.ByteSize() > LARGE_MODEL_BYTES:
        from .onnx_io.importer import model_from_proto
        model = model_from_proto(model)   # too big for one protobuf file: the IR path writes it in parts
    _sweep_leftovers()
    folder = tempfile.mkdtemp(prefix=f"{SESSION_PREFIX}{os.getpid()}-")
    keep = ()
    try:
        path = os.path.join(folder, "model.onnx")
        with open(path, "wb") as f:
            if isinstance(model, (bytes, bytearray)):
                f.write(model)
            elif hasattr(model, "SerializeToString"):
                f.write(model.SerializeToString())
            else:
                from .onnx_io.exporter import write_model
                if _is_large(model):
                    with open(os.path.join(folder, "model.onnx.data"), "wb", buffering=1 << 20) as data:
                        writer = _large_writer(data)
                        write_model(model, f, extra_outputs, external=writer)
                    if writer.names:
                        so.add_external_initializers(writer.names, writer.values)
                    keep = (writer.values, writer.arrays)
                    so.add_session_config_entry("session.disable_prepacking", "1")
                else:
                    write_model(model, f, extra_outputs)
        try:
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        except ort_errors() as e:
            reason = ort_reason(e)
        else:
            return Session(sess, prefix, role, keep)
        what = "the model" if prefix or not role else f"the {role} model"
        err = OnnxRuntimeError(f"{prefix}onnxruntime refuses {what}: {reason}")
        err.reason = reason   # onnxruntime's reason alone, for callers that word their own line
        raise err
    finally:
        shutil.rmtree(folder, ignore_errors=True)
