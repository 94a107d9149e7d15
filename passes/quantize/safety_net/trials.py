"""The switchable copy of a QDQ model and the trials run on it (the safety net's measuring instrument).

One onnxruntime session runs every trial: after each switchable quantizer's DequantizeLinear a
`Where(on[i], DQ, x)` (and, with 16-bit activations, `Where(wide[i], DQ16(Q16(x)), DQ)`) picks the quantized or
the float value, with `on`/`wide` as bool graph inputs (qcompiler/quant/runtime/switchable.py builds the copy);
a trial is one setting of the switches on the kept samples with the largest error. `weights.py` switches
weight DequantizeLinears the same way.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import numpy as np

from qcompiler.quant.core.encoding import compute_encoding
from qcompiler.quant.core.qdq import cast_ends, storage_dtype
from qcompiler.quant.interop.report import OutputError
from qcompiler.quant.runtime.switchable import ON_INPUT, WIDE_INPUT, Site, Wide

RUNS_IN_FLIGHT = 2         # a trial in this process runs this many samples at once (one thread each)
TRIAL_SAMPLES = 8          # calibration samples per trial: the kept samples with the largest error


def worst_sqnr(errors: dict) -> float:
    """Min SQNR (dB) over the outputs of `output_errors()`; +inf when there are none."""
    vals = [e.sqnr_db() for e in (errors or {}).values()]
    return min(vals) if vals else float("inf")


@dataclass
class _Quantizer:
    key: str            # the plan/encodings name of the quantized value
    q: object           # QuantizeLinear node (IR)
    dq: object          # DequantizeLinear node (IR)
    enc: object         # its Encoding


def activation_quantizers(model, acts: Dict[str, object]) -> List[_Quantizer]:
    """Main-graph activation Q→DQ pairs whose encoding is per tensor, in graph order, keyed by their value name."""
    g = model.graph
    found = []
    for q in g.nodes_by_op("QuantizeLinear"):
        x = q.inputs[0]
        if x is None or x.tensor is not None or (x.producer is not None and x.producer.op_type == "Constant"):
            continue
        out = q.outputs[0]
        uses = out.uses()
        if len(uses) != 1 or uses[0].is_graph_output or uses[0].user.op_type != "DequantizeLinear" \
                or uses[0].user.graph is not g:   # read only through bodies' own DQs (qdq.local_dequantizers)
            continue
        dq = uses[0].user
        if dq.outputs[0].is_output_of_any_graph() and not g.can_take_name(x):
            continue   # a graph input (or output) read straight into a graph output: nothing to turn off
        ends = cast_ends(q, dq)    # float16 at opset < 19: Cast -> Q -> DQ -> Cast (qdq.float_route)
        key = next((v.name for v in (dq.outputs[0], x, ends[1], ends[0]) if v.name in acts), x.name)
        enc = acts.get(key)
        if enc is None or enc.per_channel or enc.frozen or not _same_scale(q, enc):
            continue
        found.append(_Quantizer(key, q, dq, enc))
    order = {n: i for i, n in enumerate(g.topological_nodes(("QuantizeLinear",)))}
    found.sort(key=lambda z: order[z.q])
    return found


def reaching(model, quants: List[_Quantizer], outputs) -> List[_Quantizer]:
    """The quantizers whose value reaches one of the graph outputs named in `outputs` (turning the others off
    cannot change those outputs: a trial on them would be wasted)."""
    wanted = set(outputs)
    reached = model.graph.outputs_reached([z.dq.outputs[0] for z in quants])
    return [z for z in quants if any(o.name in wanted for o in reached[z.dq.outputs[0]])]


def _same_scale(q, enc) -> bool:
    """Is `enc` the grid this Q node carries (a per-use Q/DQ has its own, not its value's)?"""
    sv = q.inputs[1] if len(q.inputs) > 1 else None
    arr = sv.const_value() if sv is not None else None
    return arr is not None and np.size(arr) == 1 and np.allclose(np.asarray(arr, np.float64).reshape(()),
                                                                  np.asarray(enc.scale, np.float64).reshape(()))


def _wide_encoding(enc, bits: int):
    e = compute_encoding(enc.min, enc.max, bits=bits, symmetric=enc.symmetric, signed=enc.signed)
    e.meta = dict(enc.meta)
    return e


def switch_sites(quants: List[_Quantizer], wide_bits: Optional[int]) -> List[Site]:
    """Switch i after quantizer i's DequantizeLinear: off reads the value its Q reads; with `wide_bits`, a
    grid of that width over the same range is the wide alternative."""
    sites = []
    for i, z in enumerate(quants):
        x, wide = z.q.inputs[0].name, None
        if wide_bits:
            e = _wide_encoding(z.enc, wide_bits)
            s_dtype = np.asarray(z.q.inputs[1].const_value()).dtype      # float16 scales: qdq.float_route
            wide = Wide(x, np.asarray(e.scale, np.float32).astype(s_dtype),
                        np.asarray(e.zero_point).astype(storage_dtype(e)))
        sites.append(Site(i, z.dq.outputs[0].name, x, wide=wide))
    return sites


class _Trials:
    """Runs one setting of the switches on the trial samples; harm = max over outputs of noise/signal, scaled so
    that all quantizers on gives the harm over every kept sample (`pick`)."""

    def __init__(self, sess, kept, k: int, wide: bool, max_trials: int, clock=None, on_trial: Callable = None,
                 pool=None):
        self.sess, self.kept, self.k, self.wide, self.max_trials = sess, kept, k, wide, max_trials
        self.pool = pool                # parallel.TrialPool for harm_many (None: every trial in this process)
        self.names = [o.name for o in sess.get_outputs()]
        self.count = 0
        self.scale: Dict[str, float] = {}
        self.clock = clock              # budget.Clock (None: no time limit)
        self.on_trial = on_trial        # called after each trial (a progress bar's update)
        self.out_of_time = False

    def left(self) -> int:
        if self.clock is not None and self.clock.out():
            self.out_of_time = True
            return 0
        return self.max_trials - self.count

    def pick(self, samples: int) -> None:
        """All quantizers on, over every kept sample (one trial): keep the `samples` samples with the most noise
        relative to their output (the error is often in a few samples: ppocr_cls, first 8 of 32: 49 dB, all 32:
        24 dB) and the scale from their harm to the harm over all samples."""
        per = self._errors(self.kept, range(self.k), (), per_sample=True)
        total: Dict[str, OutputError] = {}
        for errs in per:
            for n, e in errs.items():
                t = total.setdefault(n, OutputError())
                t.signal, t.noise, t.count = t.signal + e.signal, t.noise + e.noise, t.count + 1
        worst = max(total, key=lambda n: _ratio(total[n]), default=None)
        if worst is None:
            return
        order = sorted(range(len(per)), key=lambda i: -(per[i][worst].noise if worst in per[i] else 0.0))
        self.kept = [self.kept[i] for i in sorted(order[:samples])]
        chosen = [per[i] for i in sorted(order[:samples])]
        for n, t in total.items():
            sig = sum(c[n].signal for c in chosen if n in c)
            noise = sum(c[n].noise for c in chosen if n in c)
            self.scale[n] = (_ratio(t) / (noise / sig)) if noise > 0 and sig > 0 else 1.0

    def _flags(self, on, wide):
        flags = np.zeros(self.k, bool)
        flags[list(on)] = True
        w = None
        if self.wide:
            w = np.zeros(self.k, bool)
            w[list(wide)] = True
        return flags, w

    def _reduce(self, kept, runs) -> list:
        """Per sample, {output: OutputError} of the outputs `runs` against the references in `kept`."""
        out = []
        for (feed, ref), outs in zip(kept, runs):
            errs: Dict[str, OutputError] = {}
            for n, a in zip(self.names, outs):
                r = ref.get(n)
                if r is not None and np.issubdtype(np.asarray(r).dtype, np.floating):
                    errs.setdefault(n, OutputError()).update(r, a, feed)
            out.append(errs)
        return out

    def _errors(self, kept, on, wide, per_sample: bool = False, runs=None):
        """`runs`: the outputs of this setting computed elsewhere (harm_many), else run here."""
        self.count += 1
        if runs is None:
            flags, w = self._flags(on, wide)
            feedx = {ON_INPUT: flags}
            if w is not None:
                feedx[WIDE_INPUT] = w
            # NOTE: two single-threaded runs in flight, as report._output_errors (a busy 2-core box)
            with ThreadPoolExecutor(max_workers=max(1, min(RUNS_IN_FLIGHT, os.cpu_count() or 1))) as pool:
                out = self._reduce(kept, pool.map(lambda item: self.sess.run(self.names, {**item[0], **feedx},
                                                                             where="a safety-net trial"), kept))
        else:
            out = self._reduce(kept, runs)
        if self.clock is not None:
            self.clock.spend(len(kept))
        if self.on_trial is not None:
            self.on_trial()
        if per_sample:
            return out
        return self._total(out)

    @staticmethod
    def _total(out) -> Dict[str, OutputError]:
        total: Dict[str, OutputError] = {}
        for errs in out:
            for n, e in errs.items():
                t = total.setdefault(n, OutputError())
                t.signal, t.noise = t.signal + e.signal, t.noise + e.noise
        return total

    def harm(self, on, wide=()) -> float:
        return self.harm_many([(on, wide)])[0]

    def _harm_here(self, on, wide=()) -> float:
        return self._harm(self._errors(self.kept, on, wide))

    def _harm(self, errs) -> float:
        return max((_ratio(e) * self.scale.get(n, 1.0) for n, e in errs.items()), default=0.0)

    def parallel(self) -> int:
        """How many independent trials are worth asking for at once (1: no pool)."""
        return self.pool.workers if self.pool is not None and not self.pool.failed else 1

    def harm_many(self, settings) -> List[float]:
        """harm(on, wide) of each (on, wide) in `settings`, independent trials run at once on the pool (each
        counted as a trial); the same numbers as one harm() after another. Here instead: before the first
        trial has run (the budget's clock), and a single setting unless the pool has more workers than the
        RUNS_IN_FLIGHT samples a trial runs here at once (then its samples are split over the workers)."""
        settings = list(settings)
        n = self.parallel()
        if n > 1 and (len(settings) > 1 or n > RUNS_IN_FLIGHT) and (self.clock is None or self.clock.started):
            runs = self.pool.run(self.kept, [self._flags(on, wide) for on, wide in settings])
            if runs is not None:
                return [self._harm(self._errors(self.kept, on, wide, runs=r)) for (on, wide), r in
                        zip(settings, runs)]
        return [self._harm_here(on, wide) for on, wide in settings]

    def refund(self, n: int) -> None:
        """Trials run ahead of need (a batch past the first hit) are not charged: the trial cap ends a search
        where the serial run ends it, and the run budget too."""
        self.count -= n
        if self.clock is not None:
            self.clock.spend(-n * len(self.kept))


def _ratio(e) -> float:
    if e.noise == 0.0:
        return 0.0
    return e.noise / e.signal if e.signal > 0 else float("inf")


def db(harm: float) -> float:
    if harm <= 0:
        return float("inf")
    return float(-10 * np.log10(harm)) if np.isfinite(harm) else float("-inf")

