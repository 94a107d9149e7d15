"""Instrumentations, as in MLIR/LLVM: IR printing, ONNX dumps, timing, statistics and verification are
objects hooked around each pass, never code inside a pass."""
from __future__ import annotations

import math
import os
import sys
import time
from typing import Optional, Sequence

import numpy as np
import onnx

from qcompiler.errors import (
    DataError,
    InvalidModelError,
    OnnxRuntimeError,
    PassError,
    VerificationError,
)
from qcompiler.ir.invariants import problems
from qcompiler.ir.printer import format_graph
from qcompiler.onnx_io import model_to_proto, save_model
from qcompiler.onnx_io.safe_write import make_output_folder
from qcompiler.onnx_io.tensor_check import short
from qcompiler.ort_session import create_session, model_prefix, short_path
from qcompiler.passmanager.manager import Instrumentation
from qcompiler.sqnr import sqnr_db


class PrintIR(Instrumentation):
    """Print the IR after the named passes (or all, or only those that changed the graph)."""

    def __init__(self, after: Sequence[str] = ("all",), stream=None, only_changed: bool = False):
        self.after = set(after)
        self.stream = stream or sys.stdout
        self.only_changed = only_changed

    def after_pass(self, p, model, result):
        if ("all" in self.after or p.name in self.after) and (result.modified or not self.only_changed):
            print(f"// ----- IR after {p.name} ({'changed' if result.modified else 'unchanged'}) -----",
                  file=self.stream)
            print(format_graph(model.graph), file=self.stream)


class DumpONNX(Instrumentation):
    """Write the model as ONNX after each pass into a folder: 00_input.onnx, 01_<pass>.onnx, ...

    The folder is made if missing (a file, a path under /proc or /sys, or one that cannot be made is one
    line). No dump is written over a file in `protect` or over the model's own files (see `save_model`);
    `file_names(passes)` gives the names in advance, so a command can check them before any work.
    """

    def __init__(self, folder: str, protect: Sequence = ()):
        self.folder = make_output_folder(folder, "--dump-dir")
        self.protect = tuple(protect)
        self.n = 0

    @staticmethod
    def _name(n: int, label: str) -> str:
        return f"{n:02d}_{label.replace('/', '_')}.onnx"

    @classmethod
    def file_names(cls, passes) -> list:
        """The files a pipeline of `passes` dumps, in order."""
        return [cls._name(0, "input")] + [cls._name(i + 1, p.name) for i, p in enumerate(passes)]

    def _write(self, model, label):
        save_model(model, os.path.join(self.folder, self._name(self.n, label)), protect=self.protect)
        self.n += 1

    def before_pipeline(self, passes, model):
        self._write(model, "input")

    def after_pass(self, p, model, result):
        self._write(model, p.name)


class Timing(Instrumentation):
    """Wall time of each pass (and of verification, as MLIR's timing has a Verifier row)."""

    def __init__(self):
        self.rows: list = []
        self._t0 = 0.0

    def before_pass(self, p, model):
        self._t0 = time.perf_counter()

    def after_pass(self, p, model, result):
        self.rows.append((p.name, time.perf_counter() - self._t0))

    def after_pass_failed(self, p, model, error):
        self.rows.append((p.name + " (failed)", time.perf_counter() - self._t0))

    def report(self) -> str:
        total = sum(t for _, t in self.rows) or 1e-12
        lines = ["===- Pass execution timing report -===", f"  Total: {total:.4f} s", "   Wall(s)   %    Name"]
        for name, t in self.rows:
            lines.append(f"  {t:8.4f} {100 * t / total:5.1f}%  {name}")
        return "\n".join(lines)


class Statistics(Instrumentation):
    """Counters each pass reports in PassResult.stats, keyed by pass (in pipeline order)."""

    def __init__(self):
        self.rows: list = []

    def after_pass(self, p, model, result):
        self.rows.append((p.name, result.modified, dict(result.stats)))

    def report(self) -> str:
        lines = ["===- Pass statistics -==="]
        for name, modified, stats in self.rows:
            lines.append(f"{name} ({'changed' if modified else 'unchanged'})")
            for k, v in stats.items():
                lines.append(f"  {k}: {v}")
        return "\n".join(lines)


# Random feeds for --verify-each: at most this many elements over all graph inputs (512 MB of float64)
RANDOM_FEED_LIMIT = 1 << 26


def random_feeds(proto: onnx.ModelProto, seed: int = 0, dims: Optional[dict] = None) -> dict:
    """Random inputs of the right dtype/shape for every graph input that is not an initializer.

    Symbolic or unknown dimensions become 1 (or `dims[name]`). Shapes come from the model file, so all of them
    are checked against RANDOM_FEED_LIMIT before anything is allocated: a 2^20 x 2^20 input is one DataError
    line suggesting --verify-inputs, not an 8 TiB allocation.
    """
    rng = np.random.default_rng(seed)
    inits = {t.name for t in proto.graph.initializer}
    specs = []
    total = 0
    for vi in proto.graph.input:
        if vi.name in inits:
            continue
        name = short(vi.name)
        if vi.type.WhichOneof("value") != "tensor_type":
            raise DataError(f"graph input '{name}' is not a tensor; random inputs cannot be made for it: "
                            f"pass inputs with --verify-inputs")
        tt = vi.type.tensor_type
        try:
            dt = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
        except (KeyError, ValueError, TypeError):
            raise DataError(f"graph input '{name}' has element type {tt.elem_type}, which random inputs cannot be "
                            f"made of: pass inputs with --verify-inputs") from None
        shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else (dims or {}).get(d.dim_param, 1)
                 for d in tt.shape.dim]
        count = math.prod(int(x) for x in shape)
        total += count
        if count > RANDOM_FEED_LIMIT or total > RANDOM_FEED_LIMIT:
            text = str(shape)
            text = text if len(text) <= 80 else text[:77] + "..."
            raise DataError(f"graph input '{name}' of shape {text} needs {count} random values for --verify-each "
                            f"({total} with the inputs before it; limit {RANDOM_FEED_LIMIT}): pass real inputs "
                            f"with --verify-inputs")
        specs.append((vi.name, dt, shape))
    feeds = {}
    for name, dt, shape in specs:
        if np.issubdtype(dt, np.floating):
            a = rng.standard_normal(shape).astype(dt)
        elif dt == np.bool_:
            a = rng.integers(0, 2, shape).astype(bool)
        elif np.issubdtype(dt, np.integer):
            # NOTE: 0/1 only: integer inputs are usually indices, token types or masks; larger values can be
            # out of range for a Gather and make the original model itself fail.
            a = rng.integers(0, 2, shape).astype(dt)
        else:
            a = np.zeros(shape, dt)
        feeds[name] = a
    return feeds


def run_onnxruntime(proto: onnx.ModelProto, feeds: dict, role: str = "") -> list:
    """Every output of `proto` on `feeds`, through a quiet session (qcompiler.ort_session): a refusal raises
    OnnxRuntimeError, a failed run DataError, each one line naming the model and onnxruntime's reason."""
    return create_session(proto, role=role, threads=None).run(None, feeds)


class Verifier(Instrumentation):
    """After each pass: IR invariants, onnx.checker, and (for semantics-preserving passes) a numerical check with
    onnxruntime against the outputs before the pass, naming the first output that differs and by how much.

    A pass that changes semantics (e.g. `insert-qdq`) gets the structural checks, then onnxruntime loads and
    runs the new model on the same feeds and the log gives each output's SQNR against the input model's outputs
    (quantization is expected to move them; the number says by how much).

    The input model is checked first: onnx.checker rejecting it, or onnxruntime refusing it or failing on the
    feeds (with `numeric`), is bad input (InvalidModelError, OnnxRuntimeError, DataError; exit 2), never blamed on
    the first pass. Messages name the model by `qcompiler.ort_session.model_label` (the CLI's MODEL path).
    """

    def __init__(self, numeric: bool = True, feeds: Optional[dict] = None, rtol: float = 1e-3, atol: float = 1e-4,
                 checker: bool = True, feeds_name: Optional[str] = None, feeds_factory=None):
        self.numeric, self.feeds, self.rtol, self.atol, self.checker = numeric, feeds, rtol, atol, checker
        self.feeds_name = feeds_name   # where `feeds` came from (the --verify-inputs file), for messages
        self.feeds_factory = feeds_factory   # model -> feeds, called once when no feeds are given
        self._reference = None   # the input model's outputs: what a semantics-changing pass is measured against
        self._before = None
        self._last = None   # outputs after the previous pass: the next pass's "before", computed once
        self._changed_by = None   # the last pass that changed the model
        self.log: list = []

    def before_pipeline(self, passes, model):
        proto = self._check_structure(None, model)
        if self.numeric:
            self._last = self._reference = self._input_outputs(model, proto)

    def before_pass(self, p, model):
        self._before = None
        if self.numeric and p.preserves_semantics:
            if self._last is None and self._changed_by is None:   # before_pipeline did not run
                self._last = self._input_outputs(model)
            elif self._last is None:   # a semantics-changing pass ran since the outputs were last taken
                self._last = self._outputs_after(self._changed_by, model_to_proto(model))
            self._before = self._last

    def _input_outputs(self, model, proto=None):
        """The outputs of the model as it came in (or as the last unverified pass left it) on the feeds."""
        proto = proto if proto is not None else model_to_proto(model)
        sess = create_session(proto, threads=None)   # a refusal is the input's fault: OnnxRuntimeError, exit 2
        if self.feeds is None and self.feeds_factory is not None:
            self.feeds = self.feeds_factory(model)
        given = self.feeds is not None
        if not given:
            self.feeds = random_feeds(proto)
        where = None
        if given:
            where = f"the verification inputs '{short_path(self.feeds_name)}'" if self.feeds_name else \
                "the verification inputs"
        try:
            return sess.run(None, self.feeds, where=where)
        except DataError as e:
            if given:
                raise
            raise InvalidModelError(f"{model_prefix()}onnxruntime cannot run the model on random inputs "
                                    f"({e.reason}); pass real inputs with --verify-inputs") from None

    def _outputs_after(self, p, proto):
        try:
            return run_onnxruntime(proto, self.feeds)
        except (OnnxRuntimeError, DataError) as e:
            raise VerificationError(f"after pass '{p.name}': onnxruntime can no longer run the model: "
                                    f"{e.reason}") from None

    def _check_structure(self, p, model):
        """Raise on broken IR invariants and on onnx.checker errors; returns the exported proto when the checker
        ran, so the numerical check need not export the model a second time."""
        where = f"after pass '{p.name}'" if p is not None else "on the input model"
        found = problems(model.graph)
        if found:
            raise PassError(f"IR invariants violated {where}: " + "; ".join(found[:5]))
        if not self.checker:
            return None
        proto = model_to_proto(model)
        try:
            onnx.checker.check_model(proto)
        except onnx.checker.ValidationError as e:
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:240]
            if p is not None:
                raise PassError(f"onnx.checker fails {where}: {reason}") from None
            raise InvalidModelError(f"{model_prefix()}onnx.checker rejects the model: {reason}") from None
        return proto

    def after_pass(self, p, model, result):
        proto = self._check_structure(p, model)
        if not result.modified:
            self.log.append(f"{p.name}: unchanged")
            return
        self._last = None
        self._changed_by = p
        if self._before is None:
            if not p.preserves_semantics and self.numeric and self._reference is not None:
                after = self._outputs_after(p, proto if proto is not None else model_to_proto(model))
                self._last = after
                self.log.append(f"{p.name}: structure verified, onnxruntime runs it; output SQNR against the input "
                                f"model: {sqnr_text([v.name for v in model.graph.outputs], self._reference, after)}")
                return
            why = "pass changes semantics" if not p.preserves_semantics else "numerical checks are off"
            self.log.append(f"{p.name}: structure verified (no numerical check: {why})")
            return
        after = self._outputs_after(p, proto if proto is not None else model_to_proto(model))
        self._last = after
        names = [v.name for v in model.graph.outputs]
        for name, a, b in zip(names, self._before, after):
            a, b = np.asarray(a), np.asarray(b)
            if a.shape != b.shape:
                raise VerificationError(f"after pass '{p.name}': output '{name}' changed shape {a.shape} -> {b.shape}")
            if a.dtype.kind in "fc":
                diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
                tol = self.atol + self.rtol * np.abs(a.astype(np.float64))
                bad = ~(diff <= tol) & ~(np.isnan(a) & np.isnan(b))
                if bad.any():
                    raise VerificationError(f"after pass '{p.name}': output '{name}' differs: max abs diff "
                                            f"{float(np.nanmax(diff)):.3g} at {np.unravel_index(int(np.argmax(np.where(bad, diff, -1))), a.shape)} "
                                            f"(rtol {self.rtol}, atol {self.atol})")
            elif not np.array_equal(a, b):
                raise VerificationError(f"after pass '{p.name}': output '{name}' differs ({int((a != b).sum())} elements)")
        self.log.append(f"{p.name}: outputs match ({len(names)} outputs)")


def sqnr_text(names, reference, got) -> str:
    """'y 43.1 dB, z inf dB' : each float output's SQNR of `got` against `reference` (others: equal or not)."""
    parts = []
    for name, a, b in zip(names, reference, got):
        a, b = np.asarray(a), np.asarray(b)
        label = short(name)
        if a.shape != b.shape:
            parts.append(f"{label} shape {a.shape} -> {b.shape}")
        elif a.dtype.kind in "fc":
            parts.append(f"{label} {sqnr_db(a, b):.1f} dB")
        else:
            parts.append(f"{label} {'equal' if np.array_equal(a, b) else 'differs'}")
    return ", ".join(parts)
