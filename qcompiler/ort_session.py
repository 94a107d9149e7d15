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

onnxruntime aborts the process on some hostile models (signal 6 or 11) instead of raising: a risky model (a body
or a local function; $QCOMPILER_ORT_PROBE) is first loaded and first run in a child process
(qcompiler/ort_probe.py), and a child killed by a signal becomes one line: OnnxRuntimeError "onnxruntime crashed
(signal 6, SIGABRT) loading FILE: ..." or DataError "onnxruntime crashed (...) running FILE on sample 0: ...".
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import re
import shutil
import stat
import tempfile
import threading
from typing import Optional

from qcompiler import ort_probe
from qcompiler.errors import DataError, OnnxRuntimeError
from qcompiler.onnx_io.exporter import ExternalData, write_model
from qcompiler.onnx_io.files import ONE_PROTO_MAX_BYTES, _total_tensor_bytes
from qcompiler.onnx_io.importer import model_from_proto
from qcompiler.onnx_io.safe_write import pid_alive

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

    def __init__(self, sess, prefix: str, role: str = "", probe=None):
        self._sess, self._prefix, self._role = sess, prefix, role
        self._probe = probe   # ort_probe.Probe: the first run goes to the child first

    def get_inputs(self):
        return self._sess.get_inputs()

    @property
    def raw(self):
        """The onnxruntime InferenceSession itself, for timing loops (qcompiler/quant/runtime/latency.py): `run` starts a timeout
        timer per call, which a millisecond model would measure too. Its failures are onnxruntime's own."""
        return self._sess

    def get_outputs(self):
        return self._sess.get_outputs()

    def run(self, output_names, feed, run_options=None, where: Optional[str] = None):
        return self.run_each(output_names, [feed], run_options, where)[0]

    def run_each(self, output_names, feeds, run_options=None, where: Optional[str] = None) -> list:
        """`run` on each feed of `feeds` under one timer (the limit times their number): a timer per run costs
        a thread start, more than a small model's run (the mixed-precision search runs thousands)."""
        ort = _ort()
        ro = run_options if run_options is not None else ort.RunOptions()
        ro.log_severity_level = LOG_FATAL_ONLY
        limit = run_timeout() * max(1, len(feeds))
        if self._probe is not None and feeds:
            probe, self._probe = self._probe, None
            try:
                probe.first_run(output_names, feeds[0], run_timeout())
            except ort_probe.Crash as c:
                err = DataError(f"onnxruntime crashed ({_crash(c)}) running {self._what()}"
                                f"{f' on {where}' if where else ''}{_said(c)}")
                err.reason = f"onnxruntime crashed ({_crash(c)}){_said(c)}"
                raise err from None
        # NOTE: a Loop whose condition never turns false (or a trip count of 2^62) runs forever; a timer sets
        # onnxruntime's terminate flag, which every kernel checks, so one run is bounded in wall time
        timer = threading.Timer(limit, _terminate, (ro,))
        timer.daemon = True
        timer.start()
        try:
            return [self._sess.run(output_names, feed, ro) for feed in feeds]
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

    def _what(self) -> str:
        return _model_words(self._prefix, self._role)


def _model_words(prefix: str, role: str) -> str:
    """The model a crash line names: its path (and role) when labelled, else "the (role) model"."""
    if prefix:
        return prefix[:-2]
    return f"the {role} model" if role else "the model"


def _crash(c) -> str:
    name = c.signal_name()
    return f"signal {c.signal}, {name}" if name else f"signal {c.signal}"


def _said(c) -> str:
    """onnxruntime's last words before the crash, cleaned like its refusals (or nothing)."""
    if not c.what:
        return ""
    return ": " + ort_reason(Exception(c.what))


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
    return pid_alive(pid)


DATA_NAME = "model.onnx.data"


def _session_data(folder: str, data_file):
    """The ExternalData of a large session model (see create_session): an input tensor still in its external
    data file is referred to in place through a hard link to that file inside the private folder; every other
    tensor's bytes go to the folder's own data file."""

    class SessionData(ExternalData):
        def __init__(self):
            super().__init__(data_file, DATA_NAME)
            self.links: dict = {}   # input data file (real path) -> link name, or None when it cannot be linked

        def reference(self, name, tensor):
            if not tensor.is_external:
                return None
            ref = tensor._external
            link = self.links.get(ref.path, "")
            if link == "":
                link = f"input{len(self.links)}.data"
                path = os.path.join(folder, link)
                try:
                    os.link(ref.path, path, follow_symlinks=False)
                    st = os.lstat(path)   # the inode the link pins: what onnxruntime will read
                    if not stat.S_ISREG(st.st_mode):   # replaced by a FIFO or device since load: never read it
                        os.unlink(path)
                        link = None
                except OSError:   # another filesystem, or not ours to link (fs.protected_hardlinks)
                    link = None
                self.links[ref.path] = link
            return None if link is None else (link, ref.offset, ref.length)

    return SessionData()


def _is_large(model) -> bool:
    return _total_tensor_bytes(model) > ONE_PROTO_MAX_BYTES


def create_session(model, role: str = "", opt_level=None, threads: Optional[int] = 1, extra_outputs=(),
                   optimized_path: Optional[str] = None, prepack: bool = True) -> Session:
    """A quiet CPU session for an IR model, a ModelProto or serialized model bytes.

    `role` says which copy the messages talk about ("quantized", "after pass 'x'"); `threads`: intra-op threads
    (None: onnxruntime's default); `extra_outputs`: value names added as graph outputs (IR models only);
    `optimized_path`: onnxruntime writes its optimized graph there (`optimized_model_filepath`), its initializers
    of 1 KiB and more in `<optimized_path>.data` beside it, so the graph reads back without its weights
    (qcompiler/quant/runtime/kernels.py; the caller owns that folder); `prepack=False`: kernels read the weights
    as loaded instead of keeping a repacked copy (`session.disable_prepacking`), for sessions that only read values
    out of a few runs: a second copy of every weight is the peak memory of a large model's capture.
    A refusal raises OnnxRuntimeError naming the model and onnxruntime's reason.

    NOTE: the model goes to onnxruntime as a file, not as bytes: from bytes it keeps ~90 MB more for minilm (210 vs
    126 MB after load, 262 vs 140 MB peak), and an IR model is written tensor by tensor (exporter.write_model), so
    no serialized copy of the weights is held here. The file sits alone in a private temporary folder, so an
    external-data location the importer missed resolves to nothing rather than to a file beside it; the folder
    is named by our pid, so a later run removes what a killed one left (`_sweep_leftovers`).

    NOTE: a model with over ONE_PROTO_MAX_BYTES of initializers (protobuf cannot hold 2 GB) goes as a small model
    file plus external data in the same private folder, written tensor by tensor (`_session_data`). A tensor still
    in the input's external-data file is not copied: that file is hard-linked into the folder (when on the same
    filesystem and linkable; else its bytes are copied) and referred to at its offset, and onnxruntime maps it.
    Why not the alternatives: onnxruntime resolves external data in the model's folder only and follows links
    (a symlink to the input's data is refused as escaping that folder), and `add_external_initializers` copies
    every array it is handed (2.25 GiB chain: 4.8 GB peak, against 2.7 GB when onnxruntime maps the file). The
    input's folder is never written to; the link goes with the folder (or with `_sweep_leftovers`).
    """
    ort = _ort()
    so = ort.SessionOptions()
    so.log_severity_level = LOG_FATAL_ONLY
    if threads:
        so.intra_op_num_threads = threads
    if opt_level is not None:
        so.graph_optimization_level = opt_level
    if not prepack:
        so.add_session_config_entry("session.disable_prepacking", "1")
    if optimized_path is not None:
        so.optimized_model_filepath = os.fspath(optimized_path)
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                    os.path.basename(os.fspath(optimized_path)) + ".data")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    prefix = model_prefix(role)
    if hasattr(model, "SerializeToString") and not isinstance(model, (bytes, bytearray)) \
            and model.ByteSize() > ONE_PROTO_MAX_BYTES:
        model = model_from_proto(model)   # too big for one protobuf file: the IR path writes it in parts
    _sweep_leftovers()
    folder = tempfile.mkdtemp(prefix=f"{SESSION_PREFIX}{os.getpid()}-")
    try:
        path = os.path.join(folder, "model.onnx")
        large = False
        with open(path, "wb") as f:
            if isinstance(model, (bytes, bytearray)):
                f.write(model)
            elif hasattr(model, "SerializeToString"):
                f.write(model.SerializeToString())
            else:
                large = _is_large(model)
                if large:
                    with open(os.path.join(folder, DATA_NAME), "wb", buffering=1 << 20) as data:
                        write_model(model, f, extra_outputs, external=_session_data(folder, data))
                else:
                    write_model(model, f, extra_outputs)
        probe, risky = None, ort_probe.is_risky(model)
        if risky:
            # NOTE: onnxruntime's CPU arena aborts (bfc_arena.cc assertion, signal 6) when an allocation fails
            # after many small ones, as in a long Loop whose per-iteration outputs pile up; without the arena
            # the same failure is a std::bad_alloc that comes back as an error. Only for models with bodies or
            # local functions (ort_probe.is_risky): other graphs keep the arena's speed.
            so.enable_cpu_mem_arena = False
        if ort_probe.wants_probe(risky):
            try:
                probe = ort_probe.load(path, threads, opt_level, prepack, arena=not risky, keep=not large)
            except ort_probe.Crash as c:
                err = OnnxRuntimeError(f"onnxruntime crashed ({_crash(c)}) loading {_model_words(prefix, role)}"
                                       f"{_said(c)}")
                err.reason = f"onnxruntime crashed ({_crash(c)}){_said(c)}"
                raise err from None
        try:
            sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        except ort_errors() as e:
            reason = ort_reason(e)
        else:
            return Session(sess, prefix, role, probe)
        what = "the model" if prefix or not role else f"the {role} model"
        err = OnnxRuntimeError(f"{prefix}onnxruntime refuses {what}: {reason}")
        err.reason = reason   # onnxruntime's reason alone, for callers that word their own line
        raise err
    finally:
        shutil.rmtree(folder, ignore_errors=True)
