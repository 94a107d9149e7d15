"""Calibration driver: one streaming onnxruntime pass over the samples, reducing every activation into observers.

A calibration copy of the model lists every non-constant value of the main graph as an extra graph output, so
one `session.run` per sample yields all activations; each array is reduced into its observer and dropped at
once (memory: one sample's activations plus O(bins) per value). The runtime dtype of each array tells integer
tensors (indices, shapes, masks, token ids) from float ones, so no quantizer is ever placed on an integer.
A few samples (with their float graph outputs) are kept for the report's SQNR.
"""
from __future__ import annotations

import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Optional

import numpy as np

from qcompiler.errors import DataError
from qcompiler.ir import walk_up
from qcompiler.ort_session import create_session
from qcompiler.progress import bar as progress_bar
from qcompiler.quant.calibration.body_probe import BodyCalibration, has_bodies
from qcompiler.quant.calibration.histogram import MagnitudeHistogram
from qcompiler.quant.calibration.observers import (
    CLIP_WARN_FRACTION,
    MAGNITUDE_SAMPLE,
    finite_flat,
    make_observer,
    weight_range,
)
from qcompiler.quant.calibration.rounding_noise import RoundingNoise
from qcompiler.quant.calibration.spill import SpillFile
from qcompiler.quant.core.encoding import Encoding, compute_encoding, scalar
from qcompiler.quant.core.plan import QuantPlan
from qcompiler.quant.runtime.memory import drop_cached, prepack_weights


class CalibrationResult:
    """Observers and runtime dtypes per value name, kept samples for SQNR, and timing."""

    def __init__(self):
        self.observers: Dict[str, object] = {}
        self.dtypes: Dict[str, np.dtype] = {}
        self.kept: list = []            # [(feed, {output name: float array})]
        self.spill = None               # spill.SpillFile holding the kept outputs (large models), else None
        self.channel_sums: Dict[str, list] = {}   # name -> [sum per channel, count] (bias correction)
        self.channel_axes: Dict[str, int] = {}
        self.samples = 0
        self.seconds = 0.0
        self.bodies = None              # body_probe.BodyCalibration when values inside bodies were observed
        self.bulk_names: frozenset = frozenset()   # values whose stats add their bulk (widening's cost rule)
        self.rounding_noise: Dict[str, RoundingNoise] = {}   # value -> level-4 rounding noise (rounding_noise.py)

    def channel_mean(self, name: str) -> Optional[np.ndarray]:
        acc = self.channel_sums.get(name)
        return None if acc is None or acc[1] == 0 else acc[0] / acc[1]

    def stats(self) -> Dict[str, dict]:
        """Observer stats plus `sqnr8_db`: the SQNR an 8-bit min/max grid would give (see `estimated_sqnr_db`)."""
        out = {}
        for k, o in self.observers.items():
            st = o.stats()
            st["sqnr8_db"] = estimated_sqnr_db(o, st)
            st["calls"] = self.samples      # runs observed: count / calls = elements per run (placement/cost.py)
            out[k] = st
        return out


def min_max_step(st: dict, bits: int) -> float:
    """The step of an asymmetric min/max grid of `bits` over the observed range of `st`, zero included."""
    return (max(st.get("max", 0.0), 0.0) - min(st.get("min", 0.0), 0.0)) / (2 ** bits - 1)


def estimated_sqnr_db(obs, st: dict, bits: int = 8) -> float:
    """10·log10(E[x²] / (s²/12)) for the min/max grid of `bits`: signal power over uniform rounding noise.

    E[x²] comes from the observer's log2 magnitude histogram (bin centres, within ~9%). Field notes §6: a
    tensor whose bulk is tiny next to its extremes (BERT's outlier channels, variances) scores low here
    although its range looks harmless.
    """
    if not st.get("count"):
        return float("inf")
    if "mean_sq" in st:
        power = st["mean_sq"]
    else:
        mags = getattr(obs, "magnitudes", None)
        if mags is None:
            return float("inf")
        counts = mags.abs_counts.astype(np.float64)
        e = mags.edges()
        lo, hi = e[:-1], np.minimum(e[1:], np.finfo(np.float32).max)
        centre = np.sqrt(np.maximum(lo, 0.0) * hi)
        power = float((counts * centre ** 2).sum() / max(counts.sum(), 1))
    scale = min_max_step(st, bits)
    if scale <= 0 or power <= 0:
        return float("inf")
    return float(10 * np.log10(power * 12 / scale ** 2))


class MinMaxPowerObserver:
    """The `min_max` observer on the hot path: min, max, count and Σx² (three reductions per array).

    Same `range()` as observers.RangeObserver for min_max; `stats()` carries `mean_sq` (for the §6 SQNR
    estimate) instead of the magnitude histogram, which costs a bincount over every activation of every sample.
    """

    scheme = "min_max"

    def __init__(self, bits: int = 8, symmetric: bool = False, bulk: bool = False):
        self.bits, self.symmetric = bits, symmetric
        self.min, self.max = np.inf, -np.inf
        self.count = self.nonfinite = 0
        self.sum_sq = 0.0
        # `bulk`: also a magnitude histogram, for `abs_median_nonzero` (what widening's cost rule reads: is the
        # 8-bit estimate the bulk's or one outlier channel's?); the other stats are the same as without it
        self.magnitudes = MagnitudeHistogram() if bulk else None

    def update(self, x) -> None:
        x, lo, hi, bad = finite_flat(x, np.float32)
        self.nonfinite += bad
        if x.size == 0:
            return
        self.min, self.max = min(self.min, lo), max(self.max, hi)
        self.count += int(x.size)
        # NOTE: einsum, not np.dot: a BLAS dot spins OpenBLAS threads against onnxruntime's (18x slower)
        self.sum_sq += float(np.einsum("i,i->", x, x, dtype=np.float64))
        if self.magnitudes is not None:
            k = max(x.size // MAGNITUDE_SAMPLE // 2, 1)     # every k-th value, counted k times (as RangeObserver)
            self.magnitudes.update(x[::k], weight=k)

    def range(self, bits=None):
        return (0.0, 0.0) if self.count == 0 else (float(self.min), float(self.max))

    def stats(self) -> dict:
        c = self.count
        out = {"min": float(self.min) if c else 0.0, "max": float(self.max) if c else 0.0, "count": c,
               "nonfinite": self.nonfinite, "mean_sq": self.sum_sq / c if c else 0.0, "bits": self.bits,
               "symmetric": self.symmetric, "scheme": self.scheme}
        if self.magnitudes is not None and c:
            out["abs_median_nonzero"] = self.magnitudes.abs_quantile(0.5, skip_zeros=True)
        return out


def _new_observer(scheme, bits, symmetric, opts, bulk: bool = False):
    if scheme == "min_max" and not opts:
        return MinMaxPowerObserver(bits, symmetric, bulk=bulk)
    return make_observer(scheme, bits, symmetric, **opts)


def candidate_names(model) -> list:
    """Graph inputs and every non-constant node output of the main graph, in graph order."""
    g = model.graph
    names = [v.name for v in g.inputs if not v.is_initializer]
    for n in g.nodes:
        if n.op_type == "Constant":
            continue
        names.extend(v.name for v in n.outputs if v is not None)
    return names


def make_session(model, opt_level=None, threads: int = 1, extra_outputs=(), role: str = "", prepack: bool = True):
    """A quiet CPU session for an IR model or a ModelProto (qcompiler.ort_session: a refusal is one line naming
    the model and onnxruntime's reason; a failed run one line naming the sample). One intra-op thread: the
    observers run on the other core, and per-run thread wake-ups cost more than they gain on small models
    (char_rnn calibration 0.17 s -> 0.10 s, minilm 5.3 s -> 3.9 s). `extra_outputs`: value names added as graph
    outputs (IR models only); `role`: which copy the messages name ("quantized"); `prepack=False`: no repacked
    weight copies (create_session).
    """
    return create_session(model, role=role, opt_level=opt_level, threads=threads, extra_outputs=extra_outputs,
                          prepack=prepack)


def extra_output_names(model, names) -> list:
    """`names` that are neither graph outputs nor graph inputs, in order, once each (the calibration outputs)."""
    g = model.graph
    present = {v.name for v in g.outputs} | {v.name for v in g.inputs}
    out = []
    for name in names:
        if name not in present:
            out.append(name)
            present.add(name)
    return out


def calibrate(model, samples, scheme: str = "min_max", bits: int = 8, symmetric: bool = False,
              keep_samples: int = 4, keep_bytes: int = 64 << 20, progress: Optional[bool] = None,
              observer_opts: Optional[dict] = None, names: Optional[list] = None,
              channel_axes: Optional[Dict[str, int]] = None, bodies=False,
              bulk_names: frozenset = frozenset(),
              rounding_blocks: Optional[Dict[str, int]] = None, spill: bool = False) -> CalibrationResult:
    """Run every sample once through a calibration copy of `model`; return observers and dtypes per value.

    `names`: the values to observe (default: every candidate). onnxruntime runs sample i+1 on a worker
    thread while the observers reduce sample i (both release the GIL for their heavy parts). `bodies`: True to
    observe every float value inside If/Loop/Scan bodies too, or the names of the body values to observe,
    each keyed by its (model-wide unique) name (body_probe.py);
    `res.bodies` then holds the probe (`.probe.mapping`, `.probe.minmax_values`) and the branches never taken
    (`.tally.never_taken()`). `bulk_names`: values whose min_max stats also give `abs_median_nonzero`.
    `rounding_blocks`: value name -> block; `res.rounding_noise` gathers what MatMulNBits' int8 activations of
    that block would add to it (rounding_noise.py). `spill`: the kept float outputs go to a temporary file,
    read back when indexed (spill.py).
    """
    t0 = time.perf_counter()
    res = CalibrationResult()
    names = candidate_names(model) if names is None else list(names)
    res.bulk_names = frozenset(bulk_names)
    res.channel_axes = dict(channel_axes or {})
    res.spill = SpillFile() if spill else None
    res.rounding_noise = {n: RoundingNoise(b) for n, b in (rounding_blocks or {}).items()}
    names += [n for n in list(res.channel_axes) + list(res.rounding_noise) if n not in set(names)]
    it = iter(samples)
    first = next(it, None) if bodies is not False and bodies is not None and has_bodies(model) else None
    if first is not None:   # the probe copy's symbolic sizes and learnt shapes come from the first sample
        it = itertools.chain([first], it)
        res.bodies = BodyCalibration(model, first, extra_output_names(model, names),
                                     **({} if bodies is True else {"body_names": set(bodies)}))
        sess, out_names = res.bodies, res.bodies.names
    else:
        sess = make_session(model, extra_outputs=extra_output_names(model, names), prepack=prepack_weights(model))
        out_names = [o.name for o in sess.get_outputs()]
    graph_outputs = [v.name for v in model.graph.outputs]
    input_names = {v.name for v in model.graph.inputs}
    observe_inputs = input_names & set(names)
    total = getattr(samples, "length", None)
    bar = progress_bar("calibrating", total, progress, unit="sample")
    kept_bytes = 0
    opts = dict(observer_opts or {})

    def run(i, feed):
        return sess.run(out_names, feed, where=f"calibration sample {i}")   # DataError naming the sample

    with ThreadPoolExecutor(max_workers=1) as pool, bar:
        pending = None
        i = 0
        while True:
            feed = next(it, None)
            nxt = pool.submit(run, i, feed) if feed is not None else None
            if pending is not None:
                pfeed, fut = pending
                arrays, names_run = fut.result(), out_names
                if res.bodies is not None:   # probe outputs -> the body values they carry
                    got = res.bodies.values(arrays)
                    names_run, arrays = list(got), list(got.values())
                    for v in res.bodies.minmax & got.keys() - res.observers.keys():
                        # two numbers per run: a histogram scheme's search would clip them (body_probe.py)
                        res.observers[v], res.dtypes[v] = MinMaxPowerObserver(bits, symmetric), got[v].dtype
                kept_bytes = _observe(res, arrays, pfeed, names_run, observe_inputs, graph_outputs,
                                      scheme, bits, symmetric, opts, keep_samples, keep_bytes, kept_bytes)
                bar.update(1)
                # NOTE: this sample's arrays go now, not when the next one replaces them: held (here and in
                # its future) while the next two runs filled theirs, a 0.5 B decoder had three samples' values
                # (~450 MB each) at once
                arrays = got = fut = pending = None
            if nxt is None:
                break
            pending = (feed, nxt)
            i += 1
    bar.close()
    if res.samples == 0:
        raise DataError("empty sample set (0 samples)")
    for name in output_adjacent(model) & set(res.observers):
        res.observers[name].keep_extremes = True
    res.seconds = time.perf_counter() - t0
    return res


# Ops that pass a value on to a graph output keeping its order: clipping their input clips the result itself
# (the top logit before a Softmax is exactly the value a clip cuts, and ties it with the runner-up).
OUTPUT_PATH_OPS = frozenset({"Softmax", "LogSoftmax", "Sigmoid", "Tanh", "Identity", "Reshape", "Flatten", "Squeeze",
                             "Unsqueeze", "Transpose", "Cast"})


def output_adjacent(model) -> set:
    """Names of the graph outputs and of the values that reach one through `OUTPUT_PATH_OPS` only (their first
    input): the observers of these keep their observed min/max whatever the scheme."""
    def step(v):
        p = v.producer
        return [p.inputs[0]] if p is not None and p.op_type in OUTPUT_PATH_OPS and p.inputs else []
    return {v.name for v in walk_up(model.graph.outputs, step)}


def _observe(res, arrays, feed, out_names, observe_inputs, graph_outputs, scheme, bits, symmetric, opts,
             keep_samples, keep_bytes, kept_bytes) -> int:
    """Reduce one sample's arrays into the observers (then they are dropped); returns bytes kept for SQNR."""
    by_name = dict(zip(out_names, arrays))
    for name in observe_inputs:
        if name in feed:
            by_name.setdefault(name, np.asarray(feed[name]))
    for name, arr in by_name.items():
        obs = res.observers.get(name)
        if obs is None and name not in res.dtypes:
            res.dtypes[name] = arr.dtype
            if np.issubdtype(arr.dtype, np.floating):
                obs = res.observers[name] = _new_observer(scheme, bits, symmetric, opts,
                                                          bulk=name in res.bulk_names)
        noise = res.rounding_noise.get(name)
        if noise is not None:
            noise.update(arr)
        if obs is not None:
            obs.update(arr)
            axis = res.channel_axes.get(name)
            if axis is not None and arr.ndim > 0:
                ax = axis % arr.ndim
                other = tuple(i for i in range(arr.ndim) if i != ax)
                sums = arr.sum(axis=other, dtype=np.float64)
                acc = res.channel_sums.setdefault(name, [np.zeros_like(sums), 0])
                if acc[0].shape == sums.shape:
                    acc[0] += sums
                    acc[1] += arr.size // max(arr.shape[ax], 1)
    if len(res.kept) < keep_samples and kept_bytes < keep_bytes:
        # copies: onnxruntime's arrays live in its session's memory arena, which a kept one holds whole (growth-2,
        # 16 kept logits of 16 MB: 120 MB more after calibration; a 0.5 B decoder's ~1 GB)
        outs = {n: np.array(by_name[n], copy=True) for n in graph_outputs if n in by_name}
        kept_bytes += sum(a.nbytes for a in outs.values()) + sum(np.asarray(a).nbytes for a in feed.values())
        if res.spill is not None:
            outs = res.spill.outputs(outs)
        res.kept.append((dict(feed), outs))
    res.samples += 1
    return kept_bytes


# --------------------------------------------------------------------------- plan -> encodings

def _act_encoding(lo: float, hi: float, spec) -> Encoding:
    enc = compute_encoding(lo, hi, bits=spec.bits, symmetric=spec.symmetric, signed=spec.signed)
    return enc


def assign_encodings(plan: QuantPlan, model, calib: CalibrationResult, scheme: str = "min_max") -> None:
    """Turn every quantized spec into an Encoding: tie groups share one range; weights are per use."""
    # activations: one range per tie group (a frozen or fixed member decides for the whole group)
    groups: Dict[str, list] = {}
    for name, spec in plan.values.items():
        if spec.kind == "activation" and not spec.keep_float:
            groups.setdefault(plan.find(name), []).append(name)
    for root, members in groups.items():
        specs = [plan.values[m] for m in members]
        frozen = next((s.encoding for s in specs if s.frozen and s.encoding is not None), None)
        if frozen is not None:
            enc = frozen
        else:
            fixed = next((s.fixed_range for s in specs if s.fixed_range is not None), None)
            if fixed is not None:
                lo, hi = fixed
            else:
                wide = max(s.bits for s in specs)  # search the clipping range for the grid it will get
                ranges = [calib.observers[m].range(wide) for m in members if m in calib.observers]
                if not ranges:
                    for s in specs:
                        s.float_("never observed during calibration")
                    continue
                lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
            lead = max(specs, key=lambda s: s.bits)   # a widened member widens its whole group
            for s in specs:
                s.bits = lead.bits
            enc = _act_encoding(lo, hi, lead)
        for s in specs:
            if not s.frozen:
                s.encoding = enc
    # per-use activation quantizers tied to a value's group
    for key, spec in plan.uses.items():
        if spec.kind == "activation" and spec.tie_root is not None:
            target = plan.values.get(spec.tie_root)
            if target is None or target.keep_float or target.encoding is None:
                spec.float_("tied group is float")
            else:
                spec.encoding = target.encoding
    # weights, per use
    by_name = plan.nodes     # body weights too (field notes §1)
    for (node_name, slot), spec in plan.uses.items():
        if spec.kind != "weight" or spec.keep_float or (spec.frozen and spec.encoding is not None):
            continue
        node = by_name[node_name]
        w = node.inputs[slot].const_value()
        if not np.isfinite(w).all():
            # NOTE: an inf/NaN weight has no grid; quantized it would saturate into a finite value and change
            # what the model computes (and its output SQNR is not measurable): it stays as the model has it
            bad = int(w.size - np.count_nonzero(np.isfinite(w)))
            spec.float_(f"weight holds {bad} non-finite value(s) (inf/NaN): kept float as the model has it")
            drop_cached(node.inputs[slot])
            continue
        rb = spec.range_bits or spec.bits
        if spec.axis is not None:
            lo, hi = weight_range(w, spec.axis, scheme, rb, spec.symmetric)
        else:
            lo, hi = weight_range(np.asarray(w).reshape(1, -1), 0, scheme, rb, spec.symmetric)
            lo, hi = scalar(lo, f"range of '{node_name[:80]}' input {slot}"), scalar(hi, "range")
        drop_cached(node.inputs[slot])   # a 2 GB model's weights are read one at a time (memory.py)
        enc = compute_encoding(lo, hi, bits=rb, symmetric=spec.symmetric, signed=True, axis=spec.axis)
        enc.bits = spec.bits
        enc.meta["range_bits"] = rb
        spec.encoding = enc


# --------------------------------------------------------------------------- clipping diagnostics

def clipped_fractions(calib: CalibrationResult, activations: Dict[str, Encoding]) -> Dict[str, float]:
    """{value name: share of its observed range [min, max] that its encoding's grid cannot represent}.

    0.0 when the grid covers everything calibration saw (min_max), 0.78 for a ReLU output whose grid ends at 22% of
    its observed max. Only per-tensor activation encodings of observed values are listed; the report warns for the
    values above `observers.CLIP_WARN_FRACTION` (see `clip_warnings`).
    """
    out: Dict[str, float] = {}
    for name, enc in activations.items():
        obs = calib.observers.get(name)
        if obs is None or not getattr(obs, "count", 0) or enc is None or enc.dtype != "int":
            continue
        if np.ndim(enc.scale) != 0 and np.size(enc.scale) != 1:
            continue
        lo, hi = float(obs.min), float(obs.max)
        if not hi > lo:
            continue
        # beyond the grid by less than half a step is rounding (compute_encoding nudges the range to hold 0)
        half = scalar(enc.scale) / 2
        emin, emax = scalar(enc.min) - half, scalar(enc.max) + half
        outside = max(emin - lo, 0.0) + max(hi - emax, 0.0)
        out[name] = float(min(outside / (hi - lo), 1.0))
    return out


def clip_warnings(fractions: Dict[str, float], limit: Optional[float] = None) -> list:
    """One line per value whose grid clips more than `limit` (default `observers.CLIP_WARN_FRACTION`) of its
    observed range, largest first (names cut to 80 characters)."""
    limit = CLIP_WARN_FRACTION if limit is None else float(limit)
    hits = sorted(((f, n) for n, f in fractions.items() if f > limit), reverse=True)
    return [f"calibration clipped {100 * f:.0f}% of the observed range of '{n[:80]}' (over {100 * limit:.0f}%: "
            f"values beyond the grid saturate; try --scheme min_max)" for f, n in hits]
