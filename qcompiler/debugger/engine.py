"""`qcompiler.debug()`: where a QDQ model loses accuracy against its float model, value by value.

One streaming pass over the samples runs three onnxruntime sessions: the float model with every quantized
value as an extra output, the QDQ model with every quantizer's output as an extra output, and the QDQ model as
it is (its graph outputs, with onnxruntime's integer fusions, as `quantize` reports them). Per value, only sums
are kept (Σref², Σ(ref−q)², max|ref−q|): the value's SQNR in the QDQ model, and its SQNR with that quantizer
alone (the float value through its own Q/DQ grid in numpy, exactly what the pair computes when everything
before it is float). Weights are compared once, without samples. Per module (modules.py), the model with only
that module's quantizers is run again (one session each) and its worst output SQNR is its `alone_sqnr_db`.

The float model first goes through the graph preparation `quantize` runs (BatchNorm folding, canonical names,
HardSwish fusion), so the QDQ model's names mean the same values; `name` is the value's name there, which is
the float model's except for values those passes made.
"""
from __future__ import annotations

import time
from typing import Dict, List, Optional

import numpy as np
import onnx

from qcompiler.debugger.fallback import search
from qcompiler.debugger.modules import module_scopes
from qcompiler.debugger.quantizers import (
    GraphIndex,
    Quantizer,
    body_quantizers,
    dequantize_weight,
    fake_quantize,
    find_quantizers,
)
from qcompiler.debugger.result import DebugResult, ModuleReport, ValueReport, ranked
from qcompiler.debugger.variants import switchable, without
from qcompiler.errors import ArgumentError
from qcompiler.ir.model import Model
from qcompiler.onnx_io import load_model, model_from_proto, model_to_proto
from qcompiler.ort_session import create_session, model_label
from qcompiler.passmanager import PassManager, get_pass
from qcompiler.progress import bar
from qcompiler.quant.calibration.data import input_specs, load_samples
from qcompiler.quant.core.pipeline import PREPARE_PASSES
from qcompiler.quant.interop.report import OutputError
from qcompiler.quant.runtime.executor import check_ray, run_executor
from qcompiler.quant.runtime.memory import weight_bytes
from qcompiler.quant.runtime.switch_pool import SwitchPool
from qcompiler.quant.targets.profiles import get_profile

PREPARE_EXTRA = ("fuse-hardswish",)   # after convert-opset in quantize; only where the opset allows it
FLOOR_NOTE_DB = 60.0  # every quantizer off and the outputs still below this: something unlisted quantizes
BATCH = 8            # samples stacked into one run where the model takes it (Runner._batches)
ALONE_SAMPLES = 8    # samples per one-quantizer trial (those with the largest output error)
MODULE_SAMPLES = 16  # ... per one-module trial (minilm_l6: 10 modules on all 64 samples took 40 % of the run)


def _prepare_names() -> list:
    """The graph passes of quantize's preparation (those that need no quantization context)."""
    names = [n for n in PREPARE_PASSES + PREPARE_EXTRA
             if "quant-context" not in getattr(get_pass(n), "requires", ())]
    return names


def _load(model, what: str) -> Model:
    if isinstance(model, Model):
        return model_from_proto(model_to_proto(model))      # a copy: the caller's model is never changed
    if isinstance(model, onnx.ModelProto):
        return model_from_proto(model)
    if isinstance(model, (str, bytes)) or hasattr(model, "__fspath__"):
        return load_model(model)
    raise ArgumentError(f"{what}: expected a path, a qcompiler Model or an onnx ModelProto, "
                        f"got {type(model).__name__}")


class Runner:
    """The kept samples and their float outputs; measures the QDQ model, a variant of it (variants.without) or a
    setting of the switchable copy (variants.switchable) on them."""

    def __init__(self, qproto, idx: GraphIndex, kept: list, float_weights: Dict[str, np.ndarray], quants: list,
                 widen: bool = False, executor=None):
        self.qproto, self.idx, self.kept, self.float_weights = qproto, idx, kept, float_weights
        self.quants, self.widen = quants, widen
        self.trials = 0
        self._switch = None
        self.switches = None                    # the switch inputs of the switchable copy (_session)
        self.batching: Optional[bool] = None    # None: not checked yet (_batches)
        self.executor = executor                # runs switched_many's settings (None: all here)
        self.pool: Optional[SwitchPool] = None
        self._fed: Dict[Optional[int], tuple] = {}   # samples -> (batches, their feeds) for the pool

    def _errors(self, sess, kept, extra: Optional[dict] = None) -> Dict[str, OutputError]:
        names = [o.name for o in sess.get_outputs()]
        errs = {n: OutputError() for n in names}
        for feed, ref in self._batches(sess, kept, names, extra):
            got = sess.run(names, dict(feed, **extra) if extra else feed)
            for n, g in zip(names, got):
                if n in ref:
                    errs[n].update(ref[n], g, feed)
        self.trials += 1
        return errs

    def _batches(self, sess, kept, names, extra) -> list:
        """`kept` as batches of BATCH samples stacked on axis 0 when the model takes them (every input and output
        of batch 1, the same shapes, and a stacked run that gives what single runs give: checked once, on the
        first session, else one sample a run). A run of 8 minilm samples costs about 3 single runs."""
        if self.batching is False or len(kept) < 2:
            return kept
        groups = [kept[i:i + BATCH] for i in range(0, len(kept), BATCH)]
        stacked = [_stack(g) for g in groups]
        if any(b is None for b in stacked):
            self.batching = False
            return kept
        if self.batching is None:
            feed, _ = stacked[0]
            try:
                got = sess.run(names, dict(feed, **extra) if extra else feed)
                single = [sess.run(names, dict(f, **extra) if extra else f) for f, _ in groups[0]]
                self.batching = all(np.shape(g)[0] == len(groups[0]) and np.allclose(
                    g, np.concatenate([s[j] for s in single]), rtol=1e-3, atol=1e-4 * (np.abs(g).max() + 1e-30))
                    for j, g in enumerate(got))
            except Exception:  # noqa: BLE001 - a model that refuses a batch of 8: one sample a run
                self.batching = False
            if not self.batching:
                return kept
        return stacked

    def outputs(self, off: List[Quantizer], wide: List[Quantizer] = (), role: str = "variant"):
        """Per graph output, the error of the QDQ model with the quantizers `off` taken out and the activations
        `wide` on 16-bit grids (a real variant: the kernels onnxruntime fuses for it)."""
        sess = create_session(without(self.qproto, self.idx, off, self.float_weights, wide), role=role)
        return self._errors(sess, self.kept)

    def worst_db(self, off: List[Quantizer], wide: List[Quantizer] = ()) -> float:
        return _worst(self.outputs(off, wide))

    def switched_db(self, on: List[Quantizer], samples: Optional[int] = None, wide: List[Quantizer] = ()) -> float:
        """Worst output SQNR with only the quantizers `on` switched on, and `wide` on 16-bit grids (one shared
        session)."""
        kept = self.kept[:samples] if samples else self.kept
        return _worst(self._errors(self._session(), kept, self._switches(on, wide)))

    def _session(self):
        if self._switch is None:
            proto, self.switches = switchable(self.qproto, self.idx, self.quants, self.float_weights, self.widen)
            self.pool = SwitchPool.of(self.executor, proto)
            self._switch = create_session(proto, role="quantized (switchable)")
        return self._switch

    def _switches(self, on, wide=()) -> dict:
        ids, wids = {id(z) for z in on}, {id(z) for z in wide}
        return self.switches.feed(np.array([id(z) in ids for z in self.quants], bool),
                                  np.array([id(z) in wids for z in self.quants], bool))

    def switched_many(self, ons: List[List[Quantizer]], samples: Optional[int] = None) -> List[float]:
        """switched_db(on, samples) of each `on` in `ons`: independent runs, on the executor's workers when the
        runner has one (their raw outputs reduced here as _errors does: the same numbers), else one by one."""
        sess = self._session()
        kept = self.kept[:samples] if samples else self.kept
        if self.pool is not None and not self.pool.failed and len(ons) > 1 and self.batching is not None:
            names = [o.name for o in sess.get_outputs()]
            if samples not in self._fed:
                batches = self._batches(sess, kept, names, None)
                self._fed[samples] = (batches, [f for f, _ in batches])
            batches, feeds = self._fed[samples]
            runs = self.pool.run(feeds, [self._switches(on) for on in ons])
            if runs is not None:
                out = []
                for got_all in runs:
                    errs = {n: OutputError() for n in names}
                    for (feed, ref), got in zip(batches, got_all):
                        for n, g in zip(names, got):
                            if n in ref:
                                errs[n].update(ref[n], g, feed)
                    self.trials += 1
                    out.append(_worst(errs))
                return out
        return [self.switched_db(on, samples) for on in ons]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def _chunk(runner: Runner) -> int:
    """Settings per switched_many call: a few per worker (their outputs are held until reduced)."""
    return max(1, 2 * runner.pool.workers) if runner.pool is not None else 1


def _alone(runner: Runner, reported: list, samples: int, progress) -> List[float]:
    """Each quantizer alone (the worst output SQNR with only it on), in order, a chunk at a time."""
    out: List[float] = []
    with bar("debug: quantizers alone", len(reported), progress, unit="quantizer") as b:
        step = _chunk(runner)
        for i in range(0, len(reported), step):
            part = reported[i:i + step]
            out.extend(runner.switched_many([[z] for z in part], samples))
            b.update(len(part))
    return out


def _stack(group: list):
    """(feed, reference) of samples stacked on axis 0, or None when they are not all batch-1 of one shape."""
    feeds, refs = [f for f, _ in group], [r for _, r in group]
    for items in (feeds, refs):
        for k in items[0]:
            shapes = {np.shape(it.get(k)) for it in items}
            if len(shapes) != 1 or not next(iter(shapes)) or next(iter(shapes))[0] != 1:
                return None
    return ({k: np.concatenate([f[k] for f in feeds]) for k in feeds[0]},
            {k: np.concatenate([r[k] for r in refs]) for k in refs[0]})


def _worst(errs: Dict[str, OutputError]) -> float:
    vals = [e.sqnr_db() for e in errs.values() if e.count]
    return min(vals) if vals else float("inf")


def debug(float_model, quant_model, calib, *, limit: Optional[int] = None, depth: Optional[int] = None,
          modules: bool = True, progress: Optional[bool] = None, target_sqnr: Optional[float] = None,
          target=None, executor=None, ray: Optional[str] = None):
    """Compare `quant_model` (a QDQ model: path, Model or ModelProto) with `float_model` on the samples of `calib`
    (anything `quantize` takes; the first `limit`). Returns a DebugResult (see result.py for its fields).
    `depth`: the module scope depth (default: chosen from the names); `modules=False` skips the per-module runs;
    `target_sqnr`: also search the fewest nodes to keep float for that worst-output SQNR (fallback.py); `target`:
    the backend profile the model was made for (a name or file, as for quantize): when it runs 16-bit
    activations (`wide_activation_bits`), the fallback widens a node's activations to 16 bits where that reaches
    the target, and keeps it float otherwise. The one-quantizer and one-module runs are independent: they run
    on `executor` (an object with map(fn, items)), on Ray with `ray` ("auto" or an address), else on local worker
    processes where they pay (executor.run_executor's rule), with the same numbers (docs/parallel.md)."""
    t0 = time.perf_counter()
    ray = check_ray(ray)
    if executor is not None and not callable(getattr(executor, "map", None)):
        raise ArgumentError(f"executor: expected an object with map(fn, items), got {type(executor).__name__}")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ArgumentError(f"limit: expected a positive integer, got {limit!r}")
    widen = target is not None and get_profile(target).wide_activation_bits == 16   # a bad profile: before work
    fmodel = _load(float_model, "float_model")
    notes = []
    try:
        PassManager(_prepare_names()).run(fmodel)
    except Exception as e:  # noqa: BLE001 - preparation is for name alignment only: compare unprepared then
        notes.append(f"the float model's preparation failed ({type(e).__name__}); compared as given")
        fmodel = _load(float_model, "float_model")
    qmodel = _load(quant_model, "quant_model")
    qproto = model_to_proto(qmodel)
    fproto = model_to_proto(fmodel)
    fidx, idx = GraphIndex(fproto.graph), GraphIndex(qproto.graph)
    quants = find_quantizers(idx, fidx)
    if not quants:
        notes.append("no Q/DQ quantizer in the main graph of the quantized model")
    in_bodies = body_quantizers(qproto.graph, set(fidx.inits))
    if in_bodies:
        notes.append(f"{sum(z.kind == 'activation' for z in in_bodies)} activation quantizers inside If/Loop/Scan "
                     f"bodies are listed with their cost to the outputs only (a body's values cannot be compared "
                     f"one by one)")
        quants = sorted(quants + in_bodies, key=lambda z: z.order)
    acts = [z for z in quants if z.kind == "activation" and z.matched]
    float_outputs = [o.name for o in fproto.graph.output]
    fextra = list(dict.fromkeys(z.name for z in acts if z.name not in float_outputs))
    # a value read only by bodies (their own DQs): its quantized value is its Q/DQ grid over the QDQ model's value
    qextra = list(dict.fromkeys(z.x if "sites" in z.extra else z.out for z in acts
                                if (z.x if "sites" in z.extra else z.out) not in idx.outputs))
    with model_label(float_model if isinstance(float_model, str) else "the float model"):
        fsess = create_session(fmodel, role="float", extra_outputs=fextra)
    qsess = create_session(qproto, role="quantized")
    isess = create_session(qmodel, role="quantized (instrumented)", extra_outputs=qextra)
    samples = load_samples(calib, input_specs(fmodel.graph), limit)
    outs, full, alone, kept = _compare(samples, fsess, qsess, isess, acts, float_outputs, progress)
    fsess = isess = qsess = None
    # NOTE: trials on a few samples (alone, modules) take the samples the QDQ model gets most wrong: on the first
    # 8, every ppocr_cls quantizer alone read above 56 dB while the 64 samples' output was at 31.7 dB
    kept = [(feed, ref) for feed, ref, _ in sorted(kept, key=lambda t: -t[2])]
    float_weights: Dict[str, np.ndarray] = {}
    weight_errors: Dict[int, OutputError] = {}
    for z in quants:
        if z.kind != "weight" or not z.matched:
            continue
        w = fidx.const(z.name)
        d = dequantize_weight(idx, z)
        if w is None or d is None or np.shape(w) != np.shape(d):
            z.matched = False
            continue
        float_weights[z.name] = w
        e = weight_errors[id(z)] = OutputError()
        e.update(w, d)
    own = executor is None and kept and quants
    if own:
        executor = run_executor(ray, weight_bytes(qmodel))
    runner = Runner(qproto, idx, kept, float_weights, quants, widen, executor)
    try:
        res = _measure(runner, quants, reported_of(quants, full), full, alone, weight_errors, outs, kept, notes,
                       modules, depth, target_sqnr, progress)
    finally:
        runner.close()
        if own:
            executor.close()
    res.seconds = time.perf_counter() - t0
    return res


def reported_of(quants, full) -> list:
    """The quantizers listed: matched weights, and activations (an activation with no float counterpart still
    has its cost to the outputs, named as in the QDQ model)."""
    return [z for z in quants if (z.kind == "weight" and z.matched) or z.kind == "activation"
            and (full[id(z)].count if z.matched else True)]


def _measure(runner: Runner, quants, reported, full, alone, weight_errors, outs, kept, notes, modules, depth,
             target_sqnr, progress) -> DebugResult:
    """The runs on the switchable copy: every quantizer alone, every module alone, the fallback search."""
    values = []
    nan = float("nan")
    if kept and quants:
        floor = runner.switched_db([], ALONE_SAMPLES)
        if floor < FLOOR_NOTE_DB:
            notes.append(f"with every listed quantizer off the worst output is still at {floor:.1f} dB: the rest "
                         f"comes from quantization this debugger does not list (If/Loop/Scan bodies, weights "
                         f"with no float counterpart)")
    alone_dbs = _alone(runner, reported, ALONE_SAMPLES, progress) if kept else [nan] * len(reported)
    for z, alone_db in zip(reported, alone_dbs):
        if not z.matched:
            values.append(ValueReport(z.name, z.kind, nan, alone_db, nan, z.order, z.node, z.op_type, z.bits,
                                      nan, matched=False))
        else:
            e = full[id(z)] if z.kind == "activation" else weight_errors[id(z)]
            local = alone[id(z)].sqnr_db() if z.kind == "activation" else e.sqnr_db()
            values.append(ValueReport(z.name, z.kind, e.sqnr_db(), alone_db, e.max_abs, z.order, z.node,
                                      z.op_type, z.bits, local))
    unmatched = [z.name for z in quants if not z.matched and z.kind == "weight"]
    mods = []
    if modules and quants and kept:
        mods = _modules(quants, values, runner, depth, progress)
    res = DebugResult(ranked(values), mods, {n: e.sqnr_db() for n, e in outs.items() if e.count}, len(kept),
                      0.0, unmatched, notes)
    if target_sqnr is not None:
        res.fallback = search(res, quants, runner, target_sqnr, progress)
    return res


def _compare(samples, fsess, qsess, isess, acts: List[Quantizer], float_outputs: list, progress):
    """The streaming pass: per graph output and per quantized value, the sums of the QDQ model's error and of
    each quantizer's own; the samples with their float outputs and their worst output's noise-to-signal ratio."""
    fnames = [o.name for o in fsess.get_outputs()]
    inames = [o.name for o in isess.get_outputs()]
    qnames = [o.name for o in qsess.get_outputs()]
    full = {id(z): OutputError() for z in acts}
    alone = {id(z): OutputError() for z in acts}
    outs = {n: OutputError() for n in float_outputs}
    kept = []
    with bar("debug: comparing values", samples.length, progress, unit="sample") as b:
        for feed in samples:
            fo = dict(zip(fnames, fsess.run(fnames, feed, where="the float model")))
            io = dict(zip(inames, isess.run(inames, feed)))
            qo = dict(zip(qnames, qsess.run(qnames, feed)))
            worst = 0.0
            for n in float_outputs:
                if n in qo and np.shape(qo[n]) == np.shape(fo[n]):
                    e = OutputError()
                    e.update(fo[n], qo[n], feed)
                    for attr in ("signal", "noise", "count"):
                        setattr(outs[n], attr, getattr(outs[n], attr) + getattr(e, attr))
                    outs[n].max_abs = max(outs[n].max_abs, e.max_abs)
                    worst = max(worst, e.noise / e.signal if e.signal > 0 else float(e.noise > 0))
            for z in acts:
                ref = fo.get(z.name)
                got = io.get(z.x) if "sites" in z.extra else io.get(z.out)
                if got is not None and "sites" in z.extra:
                    got = fake_quantize(z, got)
                if ref is None or got is None or np.shape(ref) != np.shape(got):
                    continue
                full[id(z)].update(ref, got, feed)
                alone[id(z)].update(ref, fake_quantize(z, ref), feed)
            kept.append((feed, {n: fo[n] for n in float_outputs}, worst))
            del fo, io, qo
            b.update(1)
    return outs, full, alone, kept


def _modules(quants: List[Quantizer], values: list, runner: Runner, depth, progress) -> list:
    nodes = [z.node for z in quants if z.node]
    scope = module_scopes(nodes, depth)
    by_scope: Dict[str, list] = {}
    for z in quants:
        if z.node in scope:
            by_scope.setdefault(scope[z.node], []).append(z)
    signal: Dict[str, float] = {}
    noise: Dict[str, float] = {}
    name_scope = {}
    for z in quants:
        if z.node in scope:
            name_scope[(z.kind, z.name)] = scope[z.node]
    out = []
    with bar("debug: modules alone", len(by_scope), progress, unit="module") as b:
        scopes = list(by_scope.items())
        step = _chunk(runner)
        for i in range(0, len(scopes), step):
            part = scopes[i:i + step]
            ons = []
            for _, members in part:
                keep = {id(m) for m in members}
                ons.append([z for z in quants if id(z) in keep])
            for (s, members), db in zip(part, runner.switched_many(ons, MODULE_SAMPLES)):
                out.append([s, db, len(members)])
            b.update(len(part))
    # NOTE: a module's sqnr_db is the mean noise-to-signal ratio of its values (weights too) in dB, not Σnoise/Σsignal,
    # which the one value of largest magnitude would decide
    for v in values:
        s = name_scope.get((v.kind, v.name))
        if s is None or not np.isfinite(v.sqnr_db):
            continue
        signal[s] = signal.get(s, 0.0) + 1.0
        noise[s] = noise.get(s, 0.0) + 10 ** (-v.sqnr_db / 10)
    return [ModuleReport(s, (-10 * float(np.log10(noise[s] / signal[s])) if noise.get(s) else float("inf")),
                         db, n) for s, db, n in out]

