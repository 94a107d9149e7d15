"""`weight-mixed-precision` (weight-only with `--max-drop X%`): each weight at 4 bits, 8 bits or float, the cheapest
assignment whose drop, measured on the calibration samples, stays within the budget; the head and the embedding
are weights like the others.

The drop is the one the W8A8 search uses (passes/quantize/mixed_precision/search.py): the worst graph output's
relative RMS error against float, sqrt(sum (q - f)^2 / sum f^2) (1 % ~ 40 dB SQNR; a 4-bit decoder's logits
are nearer 10 %), or with `metric(outputs, reference) -> score` (API) drop = (F - Q) / |F|.

How: one onnxruntime session of the float model in which every planned weight is a graph input, so each
evaluation feeds the weights it wants (float, or dequantized from a candidate grid) and no model is rebuilt.
1. Sensitivity: each weight alone at each width (the others float) on the search samples (every other kept
   sample when there are HOLDOUT_MIN or more; the rest are held out).
2. Greedy: from all float, take the move (a weight one width down) that saves the most bytes per unit of
   estimated drop while the estimate stays within the budget; the estimate adds the single-weight drops as
   noise powers (the default metric: root of the sum of squares) or linearly (a user metric).
3. Verify the assignment on every kept sample and on the held-out ones: both within the budget, or the budget
   the greedy sees shrinks to what the measurement shows and it runs again (MAX_VERIFICATIONS at most); all
   float is always within. The cheapest verified assignment wins.
The planned grid (round-to-nearest, or GPTQ's when it ran) is kept at its own width; the other width gets a
round-to-nearest grid. The search holds the weights in float and one candidate's codes, and its session is one
ModelProto: models up to ONE_PROTO_MAX_BYTES of weights (a larger one is a one-line error). Its measure is at float activations (MatMulNBits
accuracy_level 0); check-accuracy-level runs after it.
"""
from __future__ import annotations

import math
import time
from typing import Dict, List

import numpy as np
import onnx
from onnx import helper

from qcompiler.errors import ArgumentError, ConfigError
from qcompiler.onnx_io import model_to_proto
from qcompiler.onnx_io.files import ONE_PROTO_MAX_BYTES
from qcompiler.onnx_io.graph_protos import graph_protos
from qcompiler.ort_session import create_session
from qcompiler.passes.quantize.mixed_precision.search import relative_error
from qcompiler.passes.quantize.plan_weights import DEFAULT_BLOCK, channel_block, stored_nk, weight_value
from qcompiler.passes.quantize.weight_grid import grid_job
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.progress import bar
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.core.weight_only import WeightJob
from qcompiler.quant.runtime.memory import weight_bytes

FLOAT = "float"
MAX_SAMPLES = 32          # kept calibration samples the search measures on
HOLDOUT_MIN = 8           # with this many samples or more, every other one is held out of the search
MAX_VERIFICATIONS = 6
EPS = 1e-12


def measurable(ctx) -> bool:
    """Whether the evaluation model fits one ModelProto (ONE_PROTO_MAX_BYTES of initializers at most: it is one
    in-memory ModelProto, its weights as inputs)."""
    return weight_bytes(ctx.model) <= ONE_PROTO_MAX_BYTES


def weights_as_inputs(model, names) -> onnx.ModelProto:
    """The model as a ModelProto in which the initializers `names` (of the main graph or any body) are main-graph
    inputs instead: a body reads them from the outer scope as it read its own initializer."""
    proto = model_to_proto(model)
    names = set(names)
    moved = []
    for gp in graph_protos(proto.graph):
        keep = [i for i in gp.initializer if i.name not in names]
        moved.extend(i for i in gp.initializer if i.name in names)
        if len(keep) != len(gp.initializer):
            del gp.initializer[:]
            gp.initializer.extend(keep)
    for t in moved:
        proto.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return proto


class Evaluator:
    """Runs the float model with chosen weights replaced, on the kept samples; measures the drop."""

    def __init__(self, ctx, jobs: List[WeightJob], samples: list, metric=None):
        g = ctx.model.graph
        self.values = {j.weight: weight_value(g, j.weight) for j in jobs}
        self.floats = {n: np.asarray(v.tensor.numpy_uncached()) for n, v in self.values.items()}
        self.session = create_session(weights_as_inputs(ctx.model, self.floats), role="float")
        self.outputs = [v.name for v in g.outputs]
        self.samples = samples
        self.metric = metric
        self.reference = self.run({}, range(len(samples)))
        self.evaluations = 0

    def run(self, replaced: Dict[str, np.ndarray], which) -> list:
        feeds = dict(self.floats, **replaced)
        out = []
        for i in which:
            res = self.session.run(self.outputs, dict(self.samples[i], **feeds), where=f"calibration sample {i}")
            out.append(dict(zip(self.outputs, res)))
        return out

    def drop(self, replaced: Dict[str, np.ndarray], which) -> float:
        which = list(which)
        self.evaluations += 1
        outs = self.run(replaced, which)
        ref = [self.reference[i] for i in which]
        if self.metric is None:
            return relative_error(ref, outs)
        f, q = self._score(ref, ref), self._score(outs, ref)
        if not math.isfinite(q):
            return math.inf
        return (f - q) / abs(f) if f else (0.0 if q >= f else math.inf)

    def _score(self, outs, ref) -> float:
        v = self.metric(outs, ref)
        try:
            return float(v)
        except (TypeError, ValueError):
            raise ArgumentError(f"metric must return a number (a score, higher is better), got {type(v).__name__}") \
                from None


def first_samples(ctx, n: int) -> list:
    """The first `n` calibration samples as feed dicts (the search reads each many times)."""
    out = []
    for i, feed in enumerate(ctx.samples):
        if i >= n:
            break
        out.append(dict(feed))
    return out


def candidate_job(ctx, job: WeightJob, bits: int) -> WeightJob:
    """`job` at `bits`: its own grid at its own width, else a round-to-nearest grid at that width's block."""
    if bits == job.bits:
        return job
    s, form = ctx.settings, ctx.profile.weight_only
    if job.per_channel:
        block = channel_block(form, job.k)
    else:
        block = s.weight_block or DEFAULT_BLOCK.get(bits, 32)
    alt = WeightJob(weight=job.weight, n=job.n, k=job.k, bits=bits, block_size=block, symmetric=job.symmetric,
                    readers=list(job.readers), rows_axis=job.rows_axis, body=job.body, algorithm="rtn",
                    per_channel=job.per_channel, end=job.end)
    alt.grid = grid_job(alt, stored_nk(alt, weight_value(ctx.model.graph, job.weight)))
    return alt


def dequantized(job: WeightJob, like: np.ndarray) -> np.ndarray:
    """The job's grid as a float tensor in the weight's stored layout and dtype (what the kernel computes with)."""
    w = job.grid.dequantize()
    w = w if job.rows_axis == 0 else w.T
    return np.ascontiguousarray(w.astype(like.dtype))


class WeightSearch:
    def __init__(self, ctx, budget: float):
        plan = ctx.weight_plan
        self.ctx, self.budget = ctx, budget
        self.jobs = list(plan.jobs.values())
        samples = first_samples(ctx, ctx.settings.limit or MAX_SAMPLES)
        if not samples:
            raise ConfigError("--max-drop needs calibration samples: the calibration data has none")
        self.samples = samples
        n = len(samples)
        self.search_idx = list(range(0, n, 2)) if n >= HOLDOUT_MIN else list(range(n))
        self.held_idx = list(range(1, n, 2)) if n >= HOLDOUT_MIN else []
        widths = sorted(b for b in plan.form.bits)
        self.widths = widths
        self.names = [f"W{b}" for b in widths] + [FLOAT]      # cheapest first
        self.cands: Dict[str, Dict[str, WeightJob]] = {}
        self.cost: Dict[str, Dict[str, int]] = {}
        for j in self.jobs:
            self.cands[j.weight] = {f"W{b}": candidate_job(ctx, j, b) for b in widths}
            self.cost[j.weight] = {c: (self.cands[j.weight][c].stored_bytes() if c != FLOAT else j.float_bytes())
                                   for c in self.names}
        self.ev = Evaluator(ctx, self.jobs, samples, ctx.settings.metric)
        self.deq: Dict[tuple, np.ndarray] = {}

    def weights(self, assignment: Dict[str, str]) -> Dict[str, np.ndarray]:
        out = {}
        for name, c in assignment.items():
            if c != FLOAT:
                out[name] = dequantized(self.cands[name][c], self.ev.floats[name])
        return out

    def sensitivity(self) -> Dict[str, Dict[str, float]]:
        table = {}
        with bar("max-drop", len(self.jobs), self.ctx.settings.progress) as progress:
            for j in self.jobs:
                row = {FLOAT: 0.0}
                for c in self.names[:-1]:
                    row[c] = self.ev.drop(self.weights({j.weight: c}), self.search_idx)
                table[j.weight] = row
                progress.update(1)
        return table

    def estimate(self, assignment, table) -> float:
        drops = [table[n][c] for n, c in assignment.items()]
        if self.ctx.settings.metric is None:
            return math.sqrt(sum(d * d for d in drops))
        return sum(max(d, 0.0) for d in drops)

    def greedy(self, table, budget: float) -> Dict[str, str]:
        assignment = {j.weight: FLOAT for j in self.jobs}
        while True:
            base = self.estimate(assignment, table)
            best, best_gain = None, 0.0
            for name, c in assignment.items():
                i = self.names.index(c)
                for c2 in self.names[:i]:
                    trial = dict(assignment, **{name: c2})
                    est = self.estimate(trial, table)
                    if not est <= budget:
                        continue
                    saved = self.cost[name][c] - self.cost[name][c2]
                    gain = saved / (max(est - base, 0.0) + EPS * max(budget, EPS))
                    if saved > 0 and gain > best_gain:
                        best, best_gain = (name, c2), gain
            if best is None:
                return assignment
            assignment[best[0]] = best[1]

    def bytes_of(self, assignment) -> int:
        return sum(self.cost[n][c] for n, c in assignment.items())

    def run(self) -> dict:
        t0 = time.perf_counter()
        table = self.sensitivity()
        t_sens = time.perf_counter() - t0
        everything = list(range(len(self.samples)))
        trials, chosen, scale = [], None, 1.0
        for _ in range(MAX_VERIFICATIONS):
            assignment = self.greedy(table, self.budget * scale)
            if any(t["assignment"] == assignment for t in trials):
                break
            w = self.weights(assignment)
            drop = self.ev.drop(w, everything)
            held = self.ev.drop(w, self.held_idx) if self.held_idx else None
            ok = drop <= self.budget and (held is None or held <= self.budget)
            trials.append({"assignment": assignment, "drop": drop, "held_out_drop": held, "ok": ok,
                           "weight_bytes": self.bytes_of(assignment)})
            if ok and (chosen is None or trials[-1]["weight_bytes"] < chosen["weight_bytes"]):
                chosen = trials[-1]
            worst = max(drop, held or 0.0)
            if ok and worst > 0.8 * self.budget:
                break
            scale *= min(max(self.budget / max(worst, EPS), 0.5), 1.5) * (0.9 if not ok else 1.0)
        if chosen is None:       # all float: exactly the float model
            assignment = {j.weight: FLOAT for j in self.jobs}
            chosen = {"assignment": assignment, "drop": 0.0, "held_out_drop": 0.0 if self.held_idx else None,
                      "ok": True, "weight_bytes": self.bytes_of(assignment)}
            trials.append(chosen)
        seconds = {"sensitivity": t_sens, "total": time.perf_counter() - t0}
        return {"table": table, "chosen": chosen, "trials": trials, "seconds": seconds}


def _num(x):
    return round(float(x), 6) if x is not None and math.isfinite(x) else (None if x is None else "inf")


def apply_choice(ctx, search: WeightSearch, res: dict) -> None:
    """Rewrite the plan: each job at its chosen width (its candidate's grid), or out of the plan (float, why)."""
    plan = ctx.weight_plan
    table = res["table"]
    for name, c in res["chosen"]["assignment"].items():
        job = plan.jobs[name]
        if c == FLOAT:
            del plan.jobs[name]
            if name in plan.layer_order:
                plan.layer_order.remove(name)
            plan.left_float[name] = (f"--max-drop: kept float (no narrower width fit the budget of "
                                     f"{100 * search.budget:.3g} % with the other weights; the mixed-precision "
                                     f"table gives its drop alone)")
            continue
        cand = search.cands[name][c]
        if cand is not job:
            job.bits, job.block_size, job.grid = cand.bits, cand.block_size, cand.grid
            job.sqnr_db, job.algorithm = cand.sqnr_db, cand.algorithm
        job.notes.append(f"--max-drop chose {c} (alone: {100 * table[name][c]:.3g} % drop)")


def report_section(search: WeightSearch, res: dict, ctx) -> dict:
    """The report's `mixed_precision` section, in the W8A8 search's shape (the CLI prints it as a table)."""
    chosen, table = res["chosen"], res["table"]
    metric = "relative output error (worst output)" if ctx.settings.metric is None else \
        getattr(ctx.settings.metric, "__name__", "metric")
    nodes = {j.weight: [r for r, _ in j.readers] for j in search.jobs}
    return {"budget": search.budget, "metric": metric, "candidates": list(search.names), "mode": "weight-only",
            "drop": _num(chosen["drop"]), "held_out_drop": _num(chosen["held_out_drop"]),
            "weight_bytes": chosen["weight_bytes"], "executor": "this process",
            "evaluations": search.ev.evaluations,
            "samples": {"search": len(search.search_idx), "held_out": len(search.held_idx)},
            "rule": "drop <= budget on every kept sample and on the held-out ones",
            "layers": {j.weight: {"op": "+".join(sorted({k for _, k in j.readers})), "nodes": nodes[j.weight],
                                  "weights": j.n * j.k, "chosen": chosen["assignment"][j.weight],
                                  "sensitivity": {c: _num(v) for c, v in table[j.weight].items()}}
                       for j in search.jobs},
            "trials": [{"what": f"greedy {i + 1}", "weight_bytes": t["weight_bytes"], "drop": _num(t["drop"]),
                        "held_out_drop": _num(t["held_out_drop"])} for i, t in enumerate(res["trials"])],
            "seconds": {k: round(v, 3) for k, v in res["seconds"].items()}, "notes": []}


@register_pass
class WeightMixedPrecision(QuantPass):
    name = "weight-mixed-precision"
    description = "weight-only: each weight at 4 bits, 8 bits or float, the cheapest within --max-drop (measured)"
    preserves_semantics = True
    requires = ("quant-context", "weight-grids")
    after = ("gptq", "weight-grid")

    def run(self, ctx) -> PassResult:
        s = ctx.settings
        if s.max_drop is None:
            raise ConfigError("pass 'weight-mixed-precision' needs a budget: pass --max-drop X% (API: max_drop=0.01)")
        if ctx.samples is None:
            raise ConfigError("--max-drop measures the drop on calibration data: give --calib")
        if not ctx.weight_plan.jobs:
            return PassResult(False, {"weights": 0})
        if not measurable(ctx):
            raise ConfigError(f"--max-drop with --weight-only measures on an in-memory copy of the model, up to "
                              f"{ONE_PROTO_MAX_BYTES >> 20} MiB of weights; this one has {weight_bytes(ctx.model) >> 20} "
                              f"MiB: give widths by a config rule (weights.bits) or --head-bits instead")
        search = WeightSearch(ctx, s.max_drop)
        res = search.run()
        apply_choice(ctx, search, res)
        ctx.mixed_precision = report_section(search, res, ctx)
        counts: Dict[str, int] = {}
        for c in res["chosen"]["assignment"].values():
            counts[c] = counts.get(c, 0) + 1
        ctx.notes.append(f"weight-only mixed precision within {100 * s.max_drop:.3g} %: "
                         f"{', '.join(f'{n} {c}' for c, n in sorted(counts.items()))}; measured drop "
                         f"{100 * res['chosen']['drop']:.3g} % on {len(search.samples)} calibration samples "
                         f"({search.ev.evaluations} evaluations, {res['seconds']['total']:.1f} s)")
        return PassResult(False, {"weights": len(search.jobs), "evaluations": search.ev.evaluations,
                                  "drop": round(float(res["chosen"]["drop"]), 6)})
