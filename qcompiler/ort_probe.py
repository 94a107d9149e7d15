"""Load (and first-run) a risky model in a child process first, so an onnxruntime abort kills the child, not us.

onnxruntime aborts the whole process on some hostile models instead of raising: a C++ assertion or an exception
thrown where none may be (`terminate called after throwing ...`, signal 6), or a segfault (signal 11). The one
found so far is its CPU arena failing an allocation in the middle of a long Loop (bfc_arena.cc
RemoveFreeChunkFromBin, signal 6): a run-time abort, not a load-time one. Python cannot catch either, and the
user would get no line at all. So before this process creates a session on a risky model it asks a child
process to do it; if the child dies by a signal, `create_session` raises OnnxRuntimeError (exit 2) instead; the
session's first run goes to the child too, and a death there raises DataError (exit 2).

- **The child** is spawned (`python -c`, a fresh interpreter: never a fork of a process that has loaded
  onnxruntime) once per process and reused for every probe; it imports onnxruntime and numpy only, loads the
  very file `create_session` writes into its private folder (no second copy), keeps that one session for the
  first run, and drops it at the next request. A child that cannot start or dies without a signal just means
  no probe: the user's run goes on as before. It inherits our resource limits, so a memory limit hits it
  as it would hit us.
- **Which models** ($QCOMPILER_ORT_PROBE): `auto` (default) probes models with a body (If, Loop, Scan) or a
  local function: where onnxruntime's abort was found, and where the importer's checks (tensor sizes against
  shapes, external data, element types, required inputs, loops that never end) say least about what a kernel
  will meet (iteration counts, per-iteration shapes). A graph without bodies skips the probe, as every corpus
  model and its quantized output do. `always` probes every session (contrib ops in an input included); `never`
  none.
- **Every session, not once per input**: the sessions of one run are on different models derived from the
  input (calibration's copy with body values stacked over the iterations is the one that aborted), so each
  risky one is probed; the child is started once and reused.
- **Cost** (measured, 2-core machine): the child's start and onnxruntime import, ~0.4 s the first time
  (digits_cnn quantizes in ~3 s, so probing plain graphs by default would cost ~13%); then a second load per
  probed session (+0.7 s per session on minilm_l6; +4.7 s on the 0.5B decoder, 13.4 s against 8.7 s) and a
  second first run. A model with over 1 GiB of weights is loaded in the child and dropped at once, with no
  first-run probe: keeping it would hold a second copy of the weights.
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Optional

import numpy as np
import onnx

PROBE_ENV = "QCOMPILER_ORT_PROBE"
MODES = ("auto", "always", "never")
BYTES_PARSE_LIMIT = 64 << 20   # serialized models above this are not parsed just to decide whether to probe

# NOTE: the child's own program, kept to onnxruntime and numpy so its start is an interpreter and one import
_CHILD = r"""
import json, sys, threading
import numpy as np
import onnxruntime as ort
ort.set_default_logger_severity(4)
inp, out = sys.stdin.buffer, sys.stdout.buffer
sess, sess_id = None, None
def reply(**kw):
    out.write(json.dumps(kw).encode() + b"\n"); out.flush()
while True:
    line = inp.readline()
    if not line:
        break
    req = json.loads(line)
    if req["op"] == "load":
        sess, sess_id = None, req["id"]
        so = ort.SessionOptions()
        so.log_severity_level = 4
        if req["threads"]:
            so.intra_op_num_threads = req["threads"]
        if req["opt_level"] is not None:
            so.graph_optimization_level = ort.GraphOptimizationLevel(req["opt_level"])
        if not req["prepack"]:
            so.add_session_config_entry("session.disable_prepacking", "1")
        so.enable_cpu_mem_arena = req["arena"]
        try:
            sess = ort.InferenceSession(req["path"], so, providers=["CPUExecutionProvider"])
        except Exception as e:
            reply(ok=False, reason=str(e)[:300])
        else:
            if not req["keep"]:
                sess = None
            reply(ok=True)
    elif req["op"] == "run":
        feed = {name: np.lib.format.read_array(inp, allow_pickle=False) for name in req["names"]}
        if sess is None or sess_id != req["id"]:
            reply(ok=False, reason="no session"); continue
        ro = ort.RunOptions(); ro.log_severity_level = 4
        timer = threading.Timer(req["timeout"], setattr, (ro, "terminate", True)); timer.daemon = True
        timer.start()
        try:
            sess.run(req["outputs"], feed, ro)
        except Exception as e:
            reply(ok=False, reason=str(e)[:300])
        else:
            reply(ok=True)
        finally:
            timer.cancel()
            sess = None
    else:
        sess = None
        reply(ok=True)
"""


def probe_mode() -> str:
    mode = os.environ.get(PROBE_ENV, "auto").strip().lower()
    return mode if mode in MODES else "auto"


def is_risky(model) -> bool:
    """Does `model` (IR Model, ModelProto or serialized bytes) hold a body (If, Loop, Scan) or a local function?
    Bodies nest under main-graph nodes, so the main graph's nodes decide.

    NOTE: not nodes of other domains: qcompiler's own outputs hold com.microsoft MatMulNBits and
    GatherBlockQuantized (weight-only), and probing those sessions cost minilm_l6's quantize a third more CPU."""
    if isinstance(model, (bytes, bytearray)):
        if len(model) > BYTES_PARSE_LIMIT:
            return False
        try:
            model = onnx.load_from_string(bytes(model))
        except Exception:   # noqa: BLE001 - onnxruntime will say what is wrong with it
            return True
    if hasattr(model, "SerializeToString"):
        if len(model.functions):
            return True
        graph_types = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        return any(a.type in graph_types for n in model.graph.node for a in n.attribute)
    return bool(getattr(model, "functions", None)) or bool(model.graph.subgraphs(False))


def wants_probe(risky: bool) -> bool:
    """Probe a session whose model `is_risky` (or not), under $QCOMPILER_ORT_PROBE?"""
    mode = probe_mode()
    return mode == "always" or (mode == "auto" and risky)


class Crash(Exception):
    """The probe child died by a signal: `signal` its number, `what` the last thing it said (one line)."""

    def __init__(self, signum: int, what: str):
        super().__init__(f"signal {signum}")
        self.signal, self.what = signum, what

    def signal_name(self) -> str:
        try:
            return signal.Signals(self.signal).name
        except ValueError:
            return ""


class _Child:
    """The spawned child: one request at a time, each answered by one JSON line (or by its death)."""

    def __init__(self):
        self._err = tempfile.TemporaryFile()
        env = dict(os.environ)
        env.pop("PYTHONSTARTUP", None)
        self.proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._err, env=env, close_fds=True)
        self.owner = os.getpid()   # a fork of this process (a fork server's worker) must start its own child

    def alive(self) -> bool:
        return self.proc.poll() is None

    def ask(self, header: dict, arrays=()) -> Optional[dict]:
        """Send one request; its reply, or None when the child is gone without a signal (no probe then).
        Raises Crash when it died by a signal."""
        try:
            self.proc.stdin.write(json.dumps(header).encode() + b"\n")
            for a in arrays:
                np.lib.format.write_array(self.proc.stdin, a, allow_pickle=False)
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError, ValueError):
            line = b""
        except BaseException:   # interrupted mid-request: its reply would answer the next one, so end the child
            self.proc.kill()
            raise
        if line:
            try:
                return json.loads(line)
            except ValueError:
                return None
        rc = self.proc.wait()
        if rc < 0:
            raise Crash(-rc, self._what())
        return None

    def _what(self) -> str:
        """What the child printed before dying: libstdc++'s `what():` line, or its last line."""
        try:
            self._err.seek(0, os.SEEK_END)
            size = self._err.tell()
            self._err.seek(max(0, size - 8192))
            text = self._err.read().decode("utf-8", "replace")
        except OSError:
            return ""
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        what = [ln.split("what():", 1)[1].strip() for ln in lines if "what():" in ln]
        return what[-1] if what else (lines[-1] if lines else "")

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._err.close()


_child: Optional[_Child] = None
_child_lock = threading.Lock()
_loads = 0


def _get_child() -> Optional[_Child]:
    global _child
    if _child is not None and _child.owner != os.getpid():
        _child = None   # the parent's, inherited through a fork: its pipes are not ours to use or close
    if _child is not None and not _child.alive():
        _child.close()
        _child = None
    if _child is None:
        try:
            _child = _Child()
        except OSError:
            return None
    return _child


def _at_exit() -> None:
    """Our exit closes the child's stdin, which ends it; nothing to wait for."""
    if _child is not None and _child.owner == os.getpid():
        try:
            _child.proc.stdin.close()
        except OSError:
            pass


atexit.register(_at_exit)


class Probe:
    """A model loaded in the child, waiting for its first run (`first_run`) or for the next probe."""

    def __init__(self, child: _Child, ident: int):
        self._child, self._id = child, ident

    def first_run(self, output_names, feed: dict, timeout: float) -> None:
        """Run `feed` once in the child; raises Crash if that kills it. Anything else (a refusal, a feed that
        cannot be sent) is left to this process's own run to report."""
        child, self._child = self._child, None
        if child is None:
            return
        try:
            names = list(feed)
            arrays = [np.ascontiguousarray(feed[n]) for n in names]
        except Exception:   # noqa: BLE001 - an OrtValue or an odd feed: our own run reports what is wrong
            return
        if any(a.dtype.hasobject for a in arrays):
            return
        header = {"op": "run", "id": self._id, "names": names, "timeout": timeout,
                  "outputs": list(output_names) if output_names is not None else None}
        with _child_lock:
            child.ask(header, arrays)


def load(path: str, threads, opt_level, prepack: bool, arena: bool = True, keep: bool = True) -> Optional[Probe]:
    """Create a session on `path` in the child; raises Crash when that kills it, returns None when the child is
    unavailable or onnxruntime refused the model there (this process's own load gives the refusal its line).
    `keep=False`: the child drops the session at once (no first-run probe: for a large model, whose second
    session would double the memory held)."""
    global _loads
    with _child_lock:
        child = _get_child()
        if child is None:
            return None
        _loads += 1
        level = None if opt_level is None else int(opt_level)
        reply = child.ask({"op": "load", "path": path, "threads": threads, "opt_level": level, "prepack": prepack,
                           "arena": arena, "keep": keep, "id": _loads})
        if reply is None or not reply.get("ok") or not keep:
            return None
        return Probe(child, _loads)
