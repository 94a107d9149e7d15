"""Mixed precision under an accuracy budget: `quantize(..., max_drop=0.01)`,
`qcompiler quantize ... --max-drop 1%`.

What it does, in the `mixed-precision` pass (after `place`, before `assign-encodings`: it rewrites which bits
each layer gets, then the plan is built again and the rest of the pipeline runs as usual):

1. **Layers.** Every node with a constant weight the target profile quantizes (Conv, ConvTranspose, Gemm,
   MatMul, LSTM/GRU/RNN; `Profile.weights`), together with the plan's supergroup it belongs to (Conv+Relu, ...)
   and the Add of an exported Linear's bias (`Profile.bias_add_ops`), is one layer. Layers the user's config or
   selection keeps float are not searched.
2. **Candidates** (cheapest first): W4A8, W8A8, W8A16, W16A16, float16, float. `WxAy` = the layer's weights on
   an x-bit grid and its output activation (what the next layer reads) on a y-bit grid; float16 = the layer runs
   in fp16 between Casts (the float16-islands pass); float = no quantizer. A candidate the target profile cannot
   carry is skipped: activation bits other than the profile's `activation.bits` / `wide_activation_bits`,
   weight bits other than `weight.bits`, 4 (`per_block_weight_bits` lists it: the profile knows int4 weights)
   or its 16-bit widening. The search needs opset 21 (int4/int16 Q/DQ): `quantize` asks for it.
3. **The drop.** `metric=None` (default): the drop is the relative RMS error of the outputs against float on
   the kept calibration samples (step 7: which ones), sqrt(sum (q - f)^2 / sum f^2), worst output: 1 % is an output SQNR of 40 dB
   (drop = 10^(-SQNR/20)). `metric=callable`: `metric(outputs, reference) -> score` (higher is better), where
   `outputs` is a list with one dict {graph output name: array} per kept calibration sample (the first ones of
   the calibration data, in order) and `reference` the float model's list: the float score F =
   metric(reference, reference) and a candidate's Q give drop = (F - Q) / |F| (an accuracy 0.90 -> 0.891 is a
   1 % drop; a mean cosine to the float outputs 1.0 -> 0.99 too). The callable runs in this process only,
   never in the workers.
4. **Sensitivity.** Each layer alone at each candidate (every other node float, model inputs too) on the first
   kept samples: the drop is its sensitivity. Each candidate's round is one switchable model (switched.py: every
   layer at the candidate, a Where after each of its quantizers; float16 emulated by float16 roundings) run
   once per layer with only that layer switched on, all samples in one batched run where the model's first
   dimension is free; a round that model cannot stand for (its all-off outputs are not float's) is measured
   one lowered model per layer. Report `sensitivity_rounds` says which. The switchable copy runs on the
   executor's workers (switch_pool.py) when there are several: local processes or a Ray cluster (`--ray`).
   The table is bounded by MAX_SENSITIVITY_SECONDS (rounds in MEASURE_ORDER: what is not measured by then is
   not chosen). It skips what cannot matter: W4A8 for a layer whose W8A8 alone breaks the budget (never
   chosen), the finer grids (W8A16, W16A16, float16) for a layer whose W8A8 alone drops at most NEGLIGIBLE of
   the budget (their drop taken as W8A8's: a finer grid is no worse; report 'sensitivity_inferred'); a model
   The table is measured on the first SENSITIVITY_SAMPLES samples (it only ranks the layers; every
   whole-model measurement uses all the kept samples).
   **Weights.** Every integer candidate's Conv/Gemm/MatMul weights are rounded by GPTQ on their plan grid
   (rounding.py: from one float run over the search's samples, cached per layer and grid; 4-bit rows also
   choose their clipping); an integer round is measured a second time with round-to-nearest for the layers
   GPTQ rounded, and each layer keeps the rounding that measured the smaller drop alone. Every later
   measurement and the model returned (apply_result) carry the same integers.
5. **The other nodes.** Everything outside the layers (Add, pooling, Softmax, LayerNorm, the model input, ...)
   is measured with every layer float at the given settings and, where the profile has them, at 16-bit
   activations: it runs at the cheapest of these (or float) whose drop is within REST_SHARE of the budget
   (else within the budget, else float), so a budget those nodes alone break still quantizes the layers.
6. **Assignment.** Every layer starts float; greedily, the move that saves the most weight bytes per unit of
   estimated drop is taken while the estimate stays within the budget. The estimate adds the layers' drops to
   the other nodes' (with the default metric, an RMS error, their squares add, as independent noise powers
   do). Under a user metric, moves of equal drop (an agreement on 64 samples is 0 for most single layers) are
   ordered by their relative output error. The whole assigned model is then built and measured, and the
   layers' part of the estimate is rescaled to fit what was measured (the layers' drops together are rarely
   their sum: alone, a layer reads float inputs): above the budget the scale grows (at least x1.25), well
   within it (below REFINE_BELOW of the budget) it shrinks (at most to REFINE_MIN_SCALE of itself), and the
   greedy runs again from every layer float, RESCALE_STEPS times at most; the cheapest assignment measured
   within the budget wins. If none was, the most sensitive layers of the last one (1, 2, 4, ... of them; ties
   broken by relative output error) go one candidate up until it is; every layer float (at the other nodes'
   level) was measured within the budget, so this always ends within it.
   At most MAX_VERIFICATIONS whole-model measurements.
7. **Held out, with a margin** (so the budget holds on data the search never saw, not only on the samples it
   fitted). With HOLDOUT_MIN kept samples or more, the search (steps 4-6) sees every other one (0, 2, 4, ...;
   interleaved, so calibration data sorted by class splits evenly); the others are held out. The chosen
   assignment is then measured on every kept sample (as many as there are: an agreement on few samples is
   noisy) and accepted only when
       drop + k x SE <= budget   and   drop on the held-out samples <= budget,
   k = VERIFY_MARGIN = 1 (one-sided, about 84 % confidence that the drop on the population is within the
   budget), SE = the jackknife standard error of the drop over the samples, sqrt((n-1)/n sum_i (drop_(-i) -
   mean)^2), drop_(-i) = the drop without sample i (any metric: it only needs to take a subset; for a mean
   over samples it is std / sqrt(n)). Else the back-off of step 6 runs on that rule (1, 2, 4, ... layers a
   candidate up; first, TIGHTEN_STEPS times, the greedy again with the layers' estimate scaled up by
   (verified drop / budget)^p; VERIFY_STEPS verifications at most), then all W8A8 if that passes, then every
   layer float with the other nodes at their level, then at the next levels up
   (A16, float: exact). The other nodes' level (step 5) is chosen by the same rule (max(drop + k SE, held-out
   drop)). A metric that moved on no sample has SE 0: on n samples it cannot see a rate below ~3/n (a top-1
   agreement on 64 samples: 4.7 %, above a 1 % budget): the report says so; use a smooth metric (the mean
   probability of the float top-1 class, a cosine) or more calibration samples.
   So the model `quantize` returns is within the budget with that margin on every kept sample and within it
   on the held-out ones; on other data it is a statistical statement, not a bound
   (benchmarks/bench_mixed_precision.py measures each corpus model's eval set with its eval.py).
8. **Output.** report['mixed_precision']: budget, metric, the chosen candidate and sensitivity per layer, the
   assignments tried (weight bytes, measured drop; the verifications also their held-out drop and margin),
   `drop` (every kept sample), `margin` (k x SE), `margin_k`, `held_out_drop`, `search_drop` (the search's
   choice on its own samples), `samples` ({search: n, held_out: m}), `rule`, `rounding` (the layers and bit
   widths GPTQ rounded, those round-to-nearest measured better on, its seconds), the seconds. The CLI prints
   the table and writes a Pareto plot (weight bytes against drop of every assignment tried) beside the report as
   `<report>.pareto.png` when matplotlib is installed (`pip install 'qcompiler[plot]'`), else one note.

Cost: a layer's bytes as the lowered candidate stores them among the rest at the given settings (stored_bytes:
on onnxruntime's CPU a layer whose kernel runs float keeps exact float weights at W8A8, so that move saves
nothing); float16 is half the float bytes (an estimate: a CPU target keeps some islands in float32); ties are
broken on activation bits. The bytes a move costs its readers are in the estimate too (model_bytes): on a target
that stores a float kernel's weights float, a layer written float or widened makes its 8-bit-only readers float
kernels with float weights (knock_on: from the plan alone, one plan per layer and output kind). From every layer
float such a reader saves nothing until its writer moves, so the greedy also runs up from every layer at the
given settings (the most estimated drop removed per byte added, then down again) and the estimate keeps the
smaller. A final pass (shrink) moves layers of the verified plan (or of every layer float, when that is what
passed) to cheaper candidates, 1, 2, 4, ... at once, keeping each step whose verification passes under the same
rule and whose file is no larger (SHRINK_STEPS verifications); its first step moves, in one verification, every
layer to float16 whose float16 drop alone is negligible and whose move makes the file smaller (a float layer, or
an 8-bit one that runs a float kernel among float16 neighbours and so stores float weights: ppocr_cls 362 -> 299
KB). An assignment verified once is never measured again (its trial is copied). Every measured model also carries the cost
model's multiply-accumulates on float kernels (`float_macs`, placement/kernels.py: a value widened or kept
float turns its 8-bit-only Conv/MatMul readers float). The returned plan is chosen among the assignments that
passed the rule (the search's, the plain run, every layer float): the smallest file, never one with more float
MACs than the plain run when the plain run passed; under `--optimize latency` the fewest float MACs, then
bytes. On a target whose runtime is onnxruntime (its fusion table says so) the choice and the plain run are then
timed interleaved (CPU clock, one thread, the first LATENCY_SAMPLES kept samples): the plain run replaces a choice slower by more
than LATENCY_TOLERANCE when it passed (under latency, whenever it is faster); report `latency` {plan_ms,
plain_ms} and `float_macs` {plan, plain}. Latency weighs under `balanced` (the default) and `latency` only:
`size` asked for the smallest file and `accuracy` for every quantizer as asked (both are still timed). A candidate the target would
store at float's size (16-bit activations on onnxruntime's CPU: no integer kernel reads them, so the layer's
weights sit float on their grid) is not offered (legal_candidates). Every measured model's real size (the QDQ
model as lowered, `file_bytes`) is reported; the plain run (every layer at the given settings) is verified last
and returned when it meets the rule and its file is no larger than the search's choice.
"""
from __future__ import annotations

import copy
import functools
import math
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import onnx

from qcompiler.arguments import got
from qcompiler.errors import ArgumentError, QCompilerError
from qcompiler.onnx_io import model_from_proto, model_to_proto
from qcompiler.ort_session import create_session
from qcompiler.quant.calibration.calibrate import assign_encodings
from qcompiler.quant.core.float16 import apply_float16, float16_nodes
from qcompiler.quant.core.qdq import apply_plan, assign_block_encodings
from qcompiler.quant.interop.verdict import runs_on_onnxruntime
from qcompiler.quant.placement import build_plan, decide_storage
from qcompiler.quant.placement.kernels import float_macs, group_bits_table, integer_kernel
from qcompiler.quant.placement.options import config_with_rules, node_settings
from qcompiler.quant.runtime.latency import time_interleaved
from qcompiler.quant.runtime.memory import release
from qcompiler.quant.runtime.switch_pool import SwitchPool
from qcompiler.passes.quantize.mixed_precision.rounding import WeightRounding
from qcompiler.passes.quantize.mixed_precision.switched import (
    batched_feeds,
    float16_switch_proto,
    run_settings,
    switchable_proto,
)
from qcompiler.quant.settings.config import Rule

MAX_SENSITIVITY_SECONDS = 600.0   # the sensitivity table stops here (what is left is not chosen)
MAX_VERIFICATIONS = 10            # whole-model measurements of assignments (back-off steps) at most
# the sensitivity rounds, most useful first: when MAX_SENSITIVITY_SECONDS cuts the table, 8-bit and 4-bit
# grids are measured and the back-off can still go up the ladder (an unmeasured candidate is never chosen)
MEASURE_ORDER = ("W8A8", "W4A8", "W8A16", "W16A16", "float16", "float")
REST_LEVELS = {"base": {}, "A16": {"act_bits": 16}, "float": {"precision": "float32"}}
REST_SHARE = 0.5                  # the nodes outside the layers take the cheapest level within this share
TIE_WEIGHT = 1e-3                 # a user metric's moves of equal drop are ordered by relative output error
RESCALE_STEPS = 6                 # greedy runs with the estimate rescaled to the last measurement
REFINE_MIN_SCALE = 0.5            # ... trusting the measurement at most this much over the table
REFINE_BELOW = 0.8                # ... when its drop is below this fraction of the budget
EPS = 1e-9
# the sensitivity table skips what cannot matter: W4A8 where W8A8 alone breaks the budget (not chosen), and
# the finer grids (PRECISE) where W8A8 alone drops at most NEGLIGIBLE x the budget (taken as W8A8's drop)
NEGLIGIBLE = 0.05
PRECISE = ("W8A16", "W16A16", "float16")
HOLDOUT_MIN = 4                   # with this many kept samples or more, every other one is held out
TIGHTEN_STEPS = 2                 # a failed verification re-runs the greedy tightened this often, then backs off
VERIFY_STEPS = 12                 # verifications (tightened or backed-off assignments) at most
SHRINK_STEPS = 6                  # verifications of the final pass moving layers to cheaper candidates
VERIFY_MARGIN = 1.0               # k: accepted when drop + k x standard error <= budget (one-sided ~84 %)
ORIGIN = "the mixed-precision search (--max-drop)"   # the reason a node's precision names
COLLECT_OVER_BYTES = 16 << 20
# with every switch off, the switchable model must give the float outputs to this relative error (else the
# round is measured one model per layer)
SWITCH_OFF_TOLERANCE = 1e-4
# the choice may run this much slower than the plain run before the plain run is returned (timing noise)
LATENCY_TOLERANCE = 0.05
LATENCY_OBJECTIVES = ("balanced", "latency")     # the --optimize values under which the choice weighs latency
# the choice and the plain run are timed on the first LATENCY_SAMPLES kept samples, LATENCY_RUNS interleaved
# rounds (each round: every sample once) after LATENCY_WARMUP untimed ones
LATENCY_SAMPLES = 4
LATENCY_RUNS = 10
LATENCY_WARMUP = 2


@dataclass(frozen=True)
class Candidate:
    name: str
    weight_bits: Optional[int]     # None: float weights
    act_bits: Optional[int]
    precision: str = "int"         # int | float16 | float32

    @property
    def weight_bytes_per_element(self) -> float:
        if self.precision == "float16":
            return 2.0
        if self.precision == "float32":
            return 4.0
        return self.weight_bits / 8.0

    @property
    def cost(self) -> float:
        """Weight bytes per element, activation bits as the tie-break (fp16 above W16A16: Casts)."""
        act = self.act_bits or (16 if self.precision == "float16" else 32)
        return self.weight_bytes_per_element + act / 1000.0 + (0.0005 if self.precision == "float16" else 0.0)

    def updates(self) -> dict:
        if self.precision != "int":
            return {"precision": self.precision}
        return {"precision": "int", "weight_bits": self.weight_bits, "act_bits": self.act_bits,
                "weight_quantized": True, "output_quantized": True}


CANDIDATES = (Candidate("W4A8", 4, 8), Candidate("W8A8", 8, 8), Candidate("W8A16", 8, 16),
              Candidate("W16A16", 16, 16), Candidate("float16", None, None, "float16"),
              Candidate("float", None, None, "float32"))
BY_NAME = {c.name: c for c in CANDIDATES}


def legal_candidates(profile, objective: str = "balanced") -> Tuple[List[Candidate], Dict[str, str]]:
    """The candidates `profile` can carry (cheapest first) and {skipped name: why}. A candidate whose
    activation width no integer kernel of the target reads (`integer_weight_kernels`: onnxruntime's CPU has no
    16-bit ones) runs float kernels; where the target then stores its weights float on their grid (the
    profile's `float_kernel_weights` under `objective`) it is as large as float and less exact: not a candidate."""
    acts = {profile.activation.bits} | ({profile.wide_activation_bits} if profile.wide_activation_bits else set())
    weights = {profile.weight.bits} | ({4} if 4 in profile.per_block_weight_bits else set()) | \
        ({16} if profile.wide_activation_bits == 16 else set())
    kernel_bits = {r.act_bits for r in profile.integer_weight_kernels.values()}
    stored_float = profile.prefold_unfused_weight_dq and \
        profile.float_kernel_weight_form(objective, "Conv", weight_only=False) != "int"
    out, skipped = [], {}
    for c in CANDIDATES:
        if c.precision == "int":
            if c.act_bits not in acts:
                skipped[c.name] = f"{profile.name} has no {c.act_bits}-bit activations"
                continue
            if c.weight_bits not in weights:
                skipped[c.name] = f"{profile.name} has no {c.weight_bits}-bit weights"
                continue
            if kernel_bits and c.act_bits not in kernel_bits and stored_float:
                skipped[c.name] = (f"{profile.name} has no integer kernel for {c.act_bits}-bit activations: the "
                                   f"weights would be stored float on their grid (float's size, less exact)")
                continue
        out.append(c)
    return sorted(out, key=lambda c: c.cost), skipped


def output_kind(c: Candidate, act_bits: int) -> Optional[str]:
    """What a layer at `c` writes for its readers when not the given settings' activations: 'float' (float16,
    float) or 'A<bits>'; None when its readers read what they read in the plain run."""
    if c.precision != "int":
        return "float"
    return None if c.act_bits == act_bits else f"A{c.act_bits}"


@dataclass
class Layer:
    name: str                 # the weighted node
    op_type: str
    nodes: Tuple[str, ...]    # every node of the unit (supergroup, bias Add)
    weight_elements: int


def find_layers(model, plan, profile, options) -> List[Layer]:
    """The searchable units: weighted nodes with their supergroup and bias Add (see the module docstring)."""
    in_group: Dict[str, List[str]] = {}
    for sg in plan.supergroups:
        for n in sg.nodes:
            in_group[n] = list(sg.nodes)
    layers = []
    taken = set()
    for node in model.graph.nodes:
        slots = profile.weights.get(node.op_type)
        if not slots or node.name in taken:
            continue
        elems = 0
        for slot in slots:
            v = node.inputs[slot] if slot < len(node.inputs) else None
            if v is not None and v.tensor is not None:
                elems += int(np.prod(v.tensor.dims)) if len(v.tensor.dims) else 1
        if not elems:
            continue
        if node_settings(options, profile, node).get("precision", "int") != "int":
            continue
        nodes = list(in_group.get(node.name, [node.name]))
        if node.op_type in profile.bias_add_ops and len(node.outputs) == 1 and node.outputs[0] is not None:
            uses = node.outputs[0].uses()
            if len(uses) == 1 and not uses[0].is_graph_output and uses[0].user.op_type == "Add" and \
                    any(i is not None and i.const_value() is not None for i in uses[0].user.inputs):
                nodes.append(uses[0].user.name)
        nodes = [n for n in dict.fromkeys(nodes) if n not in taken]
        taken.update(nodes)
        layers.append(Layer(node.name, node.op_type, tuple(nodes), elems))
    return layers


STORED_THROUGH = ("DequantizeLinear", "Cast")   # a weight's stored form may sit behind these
PACKED_4BIT = (onnx.TensorProto.INT4, onnx.TensorProto.UINT4)


def stored_bytes(model, layers: List[Layer]) -> Dict[str, int]:
    """layer name -> bytes of the constants its nodes read in `model` (a lowered candidate: int8 weights and
    their scales behind a DQ, float16 behind a Cast, or the float tensor): what the file holds for it."""
    owner = {n: l.name for l in layers for n in l.nodes}
    out = {l.name: 0 for l in layers}

    def size(v) -> int:
        if v is None or v.tensor is None or v.is_input:
            return 0
        if v.tensor.dtype in PACKED_4BIT:   # NOTE: two per byte in the file (Tensor.nbytes counts one each)
            return (v.tensor.size + 1) // 2
        return v.tensor.nbytes
    for node in model.graph.nodes:
        name = owner.get(node.name)
        if name is None:
            continue
        for v in node.inputs:
            if v is None:
                continue
            p = v.producer
            if v.tensor is None and p is not None and p.op_type in STORED_THROUGH:
                out[name] += sum(size(x) for x in p.inputs)
            else:
                out[name] += size(v)
    return out


# --- the worker: run one candidate model on the kept samples (module level: picklable by reference) ---------
@functools.lru_cache(maxsize=4)
def load_feeds(samples_path: str, n_inputs: int, mtime_ns: int) -> List[dict]:
    """The samples a search wrote (read once per process and file: digits_cnn's search read it 14 times)."""
    with np.load(samples_path, allow_pickle=False) as z:
        feeds = []
        names = [str(x) for x in z["__names__"]]
        i = 0
        while f"s{i}_0" in z.files:
            feeds.append({names[j]: z[f"s{i}_{j}"] for j in range(n_inputs)})
            i += 1
    return feeds


def run_candidate(item) -> Optional[list]:
    """item = (serialized ModelProto bytes, samples .npz path, input names): the model's outputs on every
    sample, [{output name: array}], or None when onnxruntime refuses the model."""
    if item is None:     # a candidate the plan cannot carry at this opset
        return None
    model_bytes, samples_path, n_inputs = item
    import onnxruntime as ort
    feeds = load_feeds(samples_path, n_inputs, os.stat(samples_path).st_mtime_ns)
    for level in (None, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC):
        try:
            sess = create_session(model_bytes, role="mixed-precision candidate", threads=1, opt_level=level)
            outs = [o.name for o in sess.get_outputs()]
            return [dict(zip(outs, r)) for r in sess.run_each(outs, feeds)]
        except Exception:   # noqa: BLE001 - a candidate onnxruntime cannot run is not chosen
            continue
    return None


def relative_error(float_outs: list, q_outs: list) -> float:
    """The default drop: worst output's sqrt(sum (q - f)^2 / sum f^2) over the samples."""
    worst = 0.0
    for name in float_outs[0]:
        num = den = 0.0
        for f, q in zip(float_outs, q_outs):
            fa = np.asarray(f[name], dtype=np.float64)
            if not np.issubdtype(np.asarray(f[name]).dtype, np.floating):
                continue
            d = np.asarray(q[name], dtype=np.float64) - fa
            num += float(np.sum(d * d))
            den += float(np.sum(fa * fa))
        if den > 0:
            worst = max(worst, math.sqrt(num / den))
        elif num > 0:
            worst = math.inf
    return worst


@dataclass
class Trial:
    what: str                     # "all float", "greedy", "back-off 1", "all W8A8", ...
    assignment: Dict[str, str]
    weight_bytes: int
    drop: float
    held_out: Optional[float] = None   # verification trials: the drop on the held-out samples alone
    margin: Optional[float] = None     # ... and VERIFY_MARGIN x the standard error of `drop`
    file_bytes: Optional[int] = None   # the QDQ model as the target stores it (what the file really holds)
    float_macs: Optional[float] = None  # multiply-accumulates per call the cost model puts on float kernels


@dataclass
class Result:
    budget: float
    metric: str
    layers: List[Layer]
    candidates: List[str]
    skipped: Dict[str, str]
    table: Dict[str, Dict[str, float]]          # layer -> candidate -> drop (sensitivity)
    assignment: Dict[str, str]                  # layer -> chosen candidate
    drop: float                                 # measured on every kept sample (the verification)
    weight_bytes: int
    trials: List[Trial] = field(default_factory=list)
    seconds: Dict[str, float] = field(default_factory=dict)
    evaluations: int = 0
    executor: str = "serial"
    whole_model_float: bool = False
    rest: str = "base"                          # the nodes outside the layers: base | A16 | float
    rest_drops: Dict[str, float] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    search_drop: float = math.inf               # the search's choice on its own samples
    held_out_drop: Optional[float] = None       # the chosen assignment on the held-out samples
    margin: float = math.inf                    # VERIFY_MARGIN x the standard error of `drop`
    samples: Dict[str, int] = field(default_factory=dict)   # search / held_out
    inferred: Dict[str, List[str]] = field(default_factory=dict)   # layer -> candidates not measured
    rounds: Dict[str, str] = field(default_factory=dict)     # candidate -> how its sensitivity was measured
    file_bytes: Optional[int] = None            # the chosen assignment's model, as stored
    latency: Optional[dict] = None              # plan_ms, plain_ms (CPU clock) on a target timed here
    float_macs: Optional[dict] = None           # plan, plain: multiply-accumulates on float kernels (cost model)
    plain_file_bytes: Optional[int] = None      # the plain run's (every layer at the given settings)
    rounding: Optional[dict] = None             # the GPTQ rounding of the weights (rounding.py)

    def to_dict(self) -> dict:
        def num(x):
            return round(float(x), 6) if math.isfinite(x) else ("inf" if x > 0 else "nan")
        return {"budget": self.budget, "metric": self.metric, "candidates": self.candidates,
                "skipped_candidates": self.skipped, "drop": num(self.drop), "weight_bytes": self.weight_bytes,
                "executor": self.executor, "evaluations": self.evaluations,
                "whole_model_float": self.whole_model_float, "rest": self.rest,
                "rest_drops": {k: num(v) for k, v in self.rest_drops.items()},
                "layers": {l.name: {"op": l.op_type, "nodes": list(l.nodes), "weights": l.weight_elements,
                                    "chosen": self.assignment.get(l.name, "float"),
                                    "sensitivity": {c: num(v) for c, v in self.table.get(l.name, {}).items()}}
                           for l in self.layers},
                "search_drop": num(self.search_drop),
                "held_out_drop": None if self.held_out_drop is None else num(self.held_out_drop),
                "sensitivity_inferred": {k: list(v) for k, v in self.inferred.items()},
                "sensitivity_rounds": dict(self.rounds),
                "margin": num(self.margin), "margin_k": VERIFY_MARGIN, "samples": dict(self.samples),
                "file_bytes": self.file_bytes, "plain_file_bytes": self.plain_file_bytes,
                "latency": self.latency, "float_macs": self.float_macs, "rounding": self.rounding,
                "rule": f"drop + {VERIFY_MARGIN:g} x standard error <= budget on every kept sample, "
                        f"held-out drop <= budget",
                "trials": [dict({"what": t.what, "weight_bytes": t.weight_bytes, "drop": num(t.drop),
                                 "file_bytes": t.file_bytes,
                                 "float_macs": None if t.float_macs is None else int(t.float_macs)},
                                **({} if t.margin is None else
                                   {"held_out_drop": None if t.held_out is None else num(t.held_out),
                                    "margin": num(t.margin)}))
                           for t in self.trials],
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()}, "notes": list(self.notes)}


class Search:
    """One search on a QuantContext after `place` (statistics and the user's plan are there)."""

    def __init__(self, ctx, budget: float, metric: Optional[Callable] = None, executor=None,
                 sensitivity_samples: Optional[int] = None):
        self.ctx, self.budget, self.metric = ctx, float(budget), metric
        self.executor = executor
        self.on_model = None        # called after each candidate model is measured (a progress bar's update)
        self.profile = ctx.profile
        self.base_bytes = model_to_proto(ctx.model).SerializeToString()
        self.stats = ctx.calibration.stats()
        kept = list(ctx.calibration.kept)
        # the search sees every other kept sample (interleaved: calibration data sorted by class splits
        # evenly); the others are held out for the verification (VERIFY_MARGIN, HOLDOUT_MIN)
        if len(kept) >= HOLDOUT_MIN:
            kept = kept[0::2] + kept[1::2]
            self.n_search = (len(kept) + 1) // 2
        else:
            self.n_search = len(kept)
        self.n_kept = len(kept)
        self.float_outs = [dict(o) for _, o in kept]
        self.feeds = [dict(f) for f, _ in kept]
        self.rounds: Dict[str, str] = {}    # candidate -> how its sensitivity round was measured
        self.verified: Dict[tuple, Tuple[bool, "Trial"]] = {}   # (assignment, rest level) -> (passed, trial)
        self.layer_bytes: Dict[str, Dict[str, int]] = {}   # layer -> candidate -> bytes as stored (stored_bytes)
        self.knock: Dict[str, Dict[str, frozenset]] = {}   # layer -> output kind -> readers stored float (knock_on)
        self.input_names = list(kept[0][0]) if kept else []
        # every candidate's weights rounded by GPTQ on their grid, from the search's own samples (rounding.py)
        self.rounding = WeightRounding(ctx.model, self.feeds[:self.n_search])
        self._float_scores: Dict[Tuple[int, int], float] = {}
        if metric is not None and kept:
            self._float_score(0, len(kept))
        self.evaluations = 0
        self.deadline = math.inf
        self.timed_out = False
        self.unresolved = False      # a user metric that moved on no sample (see the module docstring, 7.)
        self.power = 2 if metric is None else 1
        # the relative output error of every sensitivity run, also under a user metric: it orders the moves
        # and the back-off where the metric cannot (an agreement on 64 samples is 0 for most single layers)
        self.errors: Dict[str, Dict[str, float]] = {}
        self.last_errors: List[float] = []
        self.last_exact: List[bool] = []
        self._macs: Dict[tuple, float] = {}   # plan_float_macs
        self._parts: Dict[tuple, float] = {}  # model_bytes' terms: (layer, candidate, reader lost) -> bytes
        self._kinds: Dict[str, Optional[str]] = {}   # candidate -> output_kind
        self.all_nodes = [n.name for n in ctx.model.graph.nodes]
        self.other_weight_bytes = 0
        self._dir = tempfile.TemporaryDirectory(prefix="qcompiler-mp-")
        self.samples_path = os.path.join(self._dir.name, "samples.npz")
        self.all_path = os.path.join(self._dir.name, "all.npz")
        arrays = {"__names__": np.array(self.input_names)}
        for i, (feed, _) in enumerate(kept):
            for j, name in enumerate(self.input_names):
                arrays[f"s{i}_{j}"] = np.asarray(feed[name])
        np.savez(self.all_path, **arrays)
        if self.n_search < len(kept):
            arrays = {k: v for k, v in arrays.items()
                      if k == "__names__" or int(k[1:].split("_")[0]) < self.n_search}
            np.savez(self.samples_path, **arrays)
        else:
            self.samples_path = self.all_path
        self.sensitivity_samples = min(self.n_search, sensitivity_samples or self.n_search)
        self.sens_path = self.samples_path
        if self.sensitivity_samples < len(kept):
            self.sens_path = os.path.join(self._dir.name, "sensitivity.npz")
            np.savez(self.sens_path, **{k: v for k, v in arrays.items()
                                        if k == "__names__" or int(k[1:].split("_")[0]) < self.sensitivity_samples})

    def close(self):
        self._dir.cleanup()

    # --- building one candidate model ----------------------------------------------------------------------
    def config_for(self, assignment: Dict[str, str], layers: List[Layer], rest: str = "base"):
        """The user's config with rules appended: every node outside the assigned layers at `rest` (base: the
        user's settings, A16: 16-bit activations, float), then one rule per chosen candidate."""
        opts = self.ctx.options
        base = opts.config
        first = len(base.rules) if base is not None else 0
        rules = []
        if rest != "base":
            mine = {n for l in layers if l.name in assignment for n in l.nodes}
            rules.append(Rule(index=first, names=frozenset(n for n in self.all_nodes if n not in mine),
                              updates=REST_LEVELS[rest], origin=ORIGIN))
        by_cand: Dict[str, set] = {}
        for l in layers:
            c = assignment.get(l.name)
            if c is not None:
                by_cand.setdefault(c, set()).update(l.nodes)
        for c, names in by_cand.items():
            rules.append(Rule(index=first + len(rules), names=frozenset(names), updates=BY_NAME[c].updates(),
                              origin=ORIGIN))
        cfg = config_with_rules(opts, self.profile, rules)
        if rest == "float":   # a layer alone: the model inputs' quantizers are nobody's layer either
            cfg.model_input_quantized = False
        return cfg

    def options_for(self, config):
        o = copy.copy(self.ctx.options)
        o.config = config
        return o

    def lower_model(self, config):
        """(the QDQ IR model for `config`, the cost model's float multiply-accumulates of its plan), built from
        the calibrated model as the pipeline would; None when the plan needs a later opset."""
        m = model_from_proto(onnx.load_from_string(self.base_bytes))
        cal = self.ctx.calibration
        plan = build_plan(m, self.profile, cal.dtypes, self.stats, self.options_for(config))
        if plan.needs_opset() > m.opset:
            return None
        scheme = self.ctx.settings.scheme
        assign_encodings(plan, m, cal, scheme)
        assign_block_encodings(plan, m, scheme)
        self.rounding.apply(m, plan)
        f16 = float16_nodes(m, config, plan.dtypes)
        decide_storage(plan, m)
        fm = float_macs(plan)
        apply_plan(m, plan)
        if f16:
            apply_float16(m, f16, probe_ort=self.profile.name.startswith("ort"))
        return m, fm

    def lower(self, config) -> Optional[bytes]:
        """The QDQ model for `config` (serialized); its float MACs go to self.last_float_macs."""
        lowered = self.lower_model(config)
        if lowered is None:
            self.last_float_macs.append(None)
            return None
        m, fm = lowered
        self.last_float_macs.append(fm)
        # no quantizer, no cast, nothing added: the float model itself, whose outputs the calibration kept
        self.last_exact.append(sum(1 for _ in m.graph.nodes) == len(self.all_nodes) and not any(
            n.op_type in ("QuantizeLinear", "DequantizeLinear", "Cast") for n in m.graph.nodes))
        out = model_to_proto(m).SerializeToString()
        del m, lowered
        if len(self.base_bytes) > COLLECT_OVER_BYTES:
            release(collect=True)   # an IR model is one reference cycle: without this, minilm's piled up (6 GB)
        return out

    def drop_of(self, outs: Optional[list], first: int = 0) -> float:
        """The drop of `outs` (the kept samples first, first + 1, ...) against those samples' float outputs."""
        if outs is None:
            return math.inf
        ref = self.float_outs[first:first + len(outs)]
        if self.metric is None:
            return relative_error(ref, outs)
        q, f = self._score(outs, ref), self._float_score(first, first + len(outs))
        if not math.isfinite(q):
            return math.inf
        return (f - q) / abs(f) if f else (0.0 if q >= f else math.inf)

    def _float_score(self, lo: int, hi: int) -> float:
        if (lo, hi) not in self._float_scores:
            ref = self.float_outs[lo:hi]
            f = self._float_scores[lo, hi] = self._score(ref, ref)
            if not math.isfinite(f):
                raise ArgumentError(f"metric returned {f} on the float model's own outputs: the drop "
                                    f"(F - Q) / |F| needs a finite score")
        return self._float_scores[lo, hi]

    def standard_error(self, outs: list) -> float:
        """The jackknife standard error of the drop over the samples of `outs` (the first kept ones):
        sqrt((n-1)/n * sum_i (drop without sample i - mean)^2). It needs nothing of the metric but that it
        takes any subset of the samples (a mean over samples gives the usual std / sqrt(n))."""
        n = len(outs)
        if n < 2:
            return math.inf
        ref = self.float_outs[:n]
        if self.metric is None:     # per-sample error and signal energies: each leave-one-out in O(1)
            loo = []
            for name in ref[0]:
                if not np.issubdtype(np.asarray(ref[0][name]).dtype, np.floating):
                    continue
                num = np.array([float(np.sum((np.asarray(q[name], np.float64) - np.asarray(f[name], np.float64))
                                             ** 2)) for f, q in zip(ref, outs)])
                den = np.array([float(np.sum(np.asarray(f[name], np.float64) ** 2)) for f in ref])
                d = den.sum() - den
                with np.errstate(divide="ignore", invalid="ignore"):
                    v = np.where(d > 0, np.sqrt(np.maximum(num.sum() - num, 0.0) / np.where(d > 0, d, 1.0)),
                                 np.where(num.sum() - num > 0, np.inf, 0.0))
                loo.append(v)
            if not loo:
                return 0.0
            vals = np.max(np.stack(loo), axis=0)
        else:
            vals = []
            for i in range(n):
                q = self._score(outs[:i] + outs[i + 1:], ref[:i] + ref[i + 1:])
                f = self._score(ref[:i] + ref[i + 1:], ref[:i] + ref[i + 1:])
                vals.append((f - q) / abs(f) if f else (0.0 if q >= f else math.inf))
            vals = np.asarray(vals, np.float64)
        if not np.all(np.isfinite(vals)):
            return math.inf
        return float(math.sqrt((n - 1) / n * float(np.sum((vals - vals.mean()) ** 2))))

    def _score(self, outs, ref) -> float:
        """The user's metric on `outs` as a float (one line when it is not a number)."""
        v = self.metric(outs, ref)
        try:
            return float(v)
        except (TypeError, ValueError):
            raise ArgumentError(f"metric must return a number (a score, higher is better), got {got(v)}") from None

    def measure(self, configs: list, sensitivity: bool = False, every: bool = False) -> List[float]:
        """Drops of the models for `configs`. Each is lowered when the executor asks for it (a window of them
        in flight, never all: minilm's are 90 MB each) and run in onnxruntime through the executor, on the
        first `sensitivity_samples` kept samples for the sensitivity table, on the search's samples otherwise,
        on every kept sample (held-out ones too) with `every` (then self.last_outs has the outputs)."""
        path = self.sens_path if sensitivity else self.all_path if every else self.samples_path
        n = self.sensitivity_samples if sensitivity else self.n_kept if every else self.n_search
        self.last_sizes, self.last_float_macs, self.last_exact = [], [], []
        exact = set()

        def items():
            for i, cfg in enumerate(configs):
                if sensitivity and time.perf_counter() > self.deadline:
                    self.timed_out = True
                    self.last_sizes.append(None)
                    self.last_float_macs.append(None)
                    yield None      # past MAX_SENSITIVITY_SECONDS: not measured, never chosen
                    continue
                b = self.lower(cfg)
                self.last_sizes.append(None if b is None else len(b))
                if b is not None and self.last_exact[-1]:
                    exact.add(i)    # the float model: its outputs are the kept float ones, not run again
                    yield None
                    continue
                yield None if b is None else (b, path, len(self.input_names))
        before = self.timed_out
        outs = self.executor.map(run_candidate, items()) if configs else []
        outs = [self.float_outs[:n] if i in exact else o for i, o in enumerate(outs)]
        self.evaluations += len(configs) if not self.timed_out or before else \
            sum(o is not None for o in outs)
        drops, self.last_errors = [], []
        self.last_outs = outs
        for o in outs:
            if self.on_model is not None:
                self.on_model()
            drops.append(self.drop_of(o))
            self.last_errors.append(drops[-1] if self.metric is None or o is None else
                                    relative_error(self.float_outs[:len(o)], o))
        return drops

    def measure_round(self, c: str, todo: List[Layer], layers: List[Layer]) -> Tuple[list, list]:
        """(drops, relative errors) of each layer of `todo` alone at `c`: one switchable model, else (no
        switchable form) one model per layer."""
        if not todo:
            return [], []
        measured = self.measure_switched(c, todo, layers)
        if measured is None:
            drops = self.measure([self.config_for({l.name: c}, layers, rest="float") for l in todo],
                                 sensitivity=True)
            measured = drops, self.last_errors
        return list(measured[0]), list(measured[1])

    def measure_switched(self, c: str, todo: List[Layer], layers: List[Layer]):
        """(drops, relative errors) of each layer of `todo` alone at candidate `c`, from one switchable model
        (switched.py), or None where that model cannot stand in for the per-layer ones."""
        if BY_NAME[c].precision == "float32" or time.perf_counter() > self.deadline:
            return None
        t0 = time.perf_counter()
        if BY_NAME[c].precision == "float16":   # emulated: float16 roundings, not a lowered island
            proto, has = float16_switch_proto(self.ctx.model, todo), list(range(len(todo)))
            # the bytes as the target stores the islands (a CPU target keeps some in float32)
            placed = self.lower_model(self.config_for({l.name: c for l in todo}, layers, rest="base"))
            got_bytes = stored_bytes(placed[0], todo) if placed is not None else {}
            del placed
            for l in todo:
                self.layer_bytes.setdefault(l.name, {})[c] = got_bytes.get(
                    l.name, self.layer_bytes.get(l.name, {}).get("float", 0) // 2)
            self._parts.clear()
        else:
            lowered = self.lower_model(self.config_for({l.name: c for l in todo}, layers, rest="float"))
            if lowered is None:
                self.rounds[c] = "one model per layer (the plan needs a later opset)"
                return None
            m = lowered[0]
            # the bytes as the plan would store them: every layer at `c` among the rest at the given settings
            # (with the rest float, a layer between float nodes runs a float kernel and keeps float weights)
            if not all(c in self.layer_bytes.get(l.name, {}) for l in todo):   # (a second rounding: known)
                placed = self.lower_model(self.config_for({l.name: c for l in todo}, layers, rest="base"))
                for name, b in stored_bytes(placed[0] if placed is not None else m, todo).items():
                    self.layer_bytes.setdefault(name, {})[c] = b
                del placed
                self._parts.clear()
            # a layer with no quantizer in this model (placement left none: ppocr_cls's islands between float
            # Convs) drops what the model with every switch off drops
            proto, has = switchable_proto(m, self.ctx.model, todo)
            del m, lowered
        feeds = self.feeds[:self.sensitivity_samples]
        settings = [np.zeros(len(todo), bool)] + [np.arange(len(todo)) == i for i in has]
        pool = SwitchPool.of(self.executor, proto) if batched_feeds(proto, feeds) is None else None
        try:
            runs = run_settings(proto, feeds, settings, pool)
            if runs is not None and relative_error(self.float_outs[:len(feeds)], runs[0]) > SWITCH_OFF_TOLERANCE:
                runs = run_settings(proto, feeds, settings, None, batch=False)   # a model that mixes samples
        except QCompilerError as e:
            self.rounds[c] = f"one model per layer (switchable model: {str(e)[:120]})"
            return None
        finally:
            if pool is not None:
                pool.close()
        off = relative_error(self.float_outs[:len(feeds)], runs[0]) if runs is not None else math.inf
        if off > SWITCH_OFF_TOLERANCE:
            self.rounds[c] = f"one model per layer (switchable model off: {off:.3g} from float)"
            return None
        def measured(outs):
            d = self.drop_of(outs)
            return d, d if self.metric is None else relative_error(self.float_outs[:len(outs)], outs)
        per = dict(zip(has, runs[1:]))
        drops, errors = [], []
        for i in range(len(todo)):
            d, e = measured(per.get(i, runs[0]))
            drops.append(d)
            errors.append(e)
            if self.on_model is not None:
                self.on_model()
        self.evaluations += len(todo)
        self.rounds[c] = f"one switchable model ({time.perf_counter() - t0:.1f} s)"
        return drops, errors

    # --- the search -----------------------------------------------------------------------------------------
    def weight_bytes(self, assignment: Dict[str, str], layers: List[Layer], rest: str = "base") -> int:
        base = self.ctx.options.weight_bits / 8.0
        total = self.other_weight_bytes * (4.0 / base if rest == "float" else 1.0)
        for l in layers:
            c = assignment.get(l.name)
            total += l.weight_elements * (BY_NAME[c].weight_bytes_per_element if c else base)
        return int(round(total))

    def run(self) -> Result:
        t0 = time.perf_counter()
        ctx = self.ctx
        cands, skipped = legal_candidates(self.profile, ctx.settings.optimize)
        layers = find_layers(ctx.model, ctx.plan, self.profile, ctx.options)
        self.other_weight_bytes = self._other_weight_bytes(layers)
        names = [c.name for c in cands]
        res = Result(budget=self.budget, metric="relative output error" if self.metric is None else
                     getattr(self.metric, "__name__", "metric"), layers=layers, candidates=names,
                     skipped=skipped, table={}, assignment={}, drop=math.inf, weight_bytes=0,
                     executor=getattr(self.executor, "name", "serial"),
                     samples={"search": self.n_search, "held_out": self.n_kept - self.n_search})
        for name, b in stored_bytes(ctx.model, layers).items():
            self.layer_bytes.setdefault(name, {})["float"] = b
        # 0. under an objective that weighs latency, a plain run within the budget is the floor: no plan may run
        # more float multiply-accumulates (choose). It is verified first, and a candidate whose move alone (from
        # the plain run) already does (plan_float_macs: the plan, no session) is neither measured nor chosen;
        # when that leaves every layer at the plain settings, the plain run is the answer
        banned = self.banned_by_plain(layers, names, res)
        if banned is not None and all(set(names) - banned.get(l.name, set()) <= {self.plain_name()} for l in layers):
            return self.plain_result(res, layers, t0)
        # 1. sensitivity: round by round over the candidates, every layer at once (one switchable model a round)
        table: Dict[str, Dict[str, float]] = {l.name: {"float": 0.0} for l in layers}
        self.errors = {l.name: {"float": 0.0} for l in layers}
        self.deadline = t0 + MAX_SENSITIVITY_SECONDS
        inferred: Dict[str, List[str]] = {}
        for c in sorted(names, key=lambda c: MEASURE_ORDER.index(c)):
            if c == "float":
                continue
            todo = []
            for l in layers:
                if banned and c in banned.get(l.name, ()):
                    table[l.name][c] = self.errors[l.name][c] = math.inf   # never chosen (step 0)
                    continue
                w8 = table[l.name].get("W8A8")
                if w8 is not None and c == "W4A8" and not w8 <= self.budget:
                    # 4-bit weights on a layer whose 8-bit ones alone break the budget: never chosen
                    table[l.name][c] = self.errors[l.name][c] = math.inf
                elif w8 is not None and c in PRECISE and w8 <= NEGLIGIBLE * self.budget:
                    # W8A8 costs this layer next to nothing: a finer grid cannot buy the search anything;
                    # its drop is taken as W8A8's (an upper bound: a finer grid is no worse)
                    table[l.name][c], self.errors[l.name][c] = w8, self.errors[l.name]["W8A8"]
                else:
                    todo.append(l)
                    continue
                inferred.setdefault(l.name, []).append(c)
            measured = self.measure_round(c, todo, layers)
            bits = BY_NAME[c].weight_bits if BY_NAME[c].precision == "int" else None
            rounded = [i for i, l in enumerate(todo) if (l.name, bits) in self.rounding.uses and
                       measured[0][i] > NEGLIGIBLE * self.budget and self.rounding.worth_measuring(l.name, bits)]
            if rounded:
                # the same round with round-to-nearest weights for the layers GPTQ rounded (and left a drop
                # above NEGLIGIBLE: below it the other rounding cannot buy anything): each keeps the rounding
                # that measured the smaller drop (GPTQ's layer loss is smaller, not always the model's)
                # (not where that is the model just measured: worth_measuring)
                with self.rounding.nearest():
                    nearest = self.measure_round(c, [todo[i] for i in rounded], layers)
                for i, d, e in zip(rounded, *nearest):
                    if d < measured[0][i]:
                        self.rounding.keep_nearest.add((todo[i].name, bits))
                        measured[0][i], measured[1][i] = d, e
            for l, d, e in zip(todo, *measured):
                table[l.name][c] = d
                self.errors[l.name][c] = e
        res.inferred = inferred
        res.rounds = dict(self.rounds)
        if self.timed_out:
            res.notes.append(f"mixed precision: the sensitivity table stopped after {MAX_SENSITIVITY_SECONDS:.0f} "
                             f"s: candidates not measured are not chosen")
        res.table = table
        self.knock = self.knock_on(layers, names)
        t1 = time.perf_counter()
        res.seconds["sensitivity"] = t1 - t0
        # 2. the nodes outside the layers (layers float): the user's settings, 16-bit activations or float;
        # the cheapest level within REST_SHARE of the budget (powers), else within the budget, else float
        all_float = {l.name: "float" for l in layers}
        levels = ["base"] + (["A16"] if self.profile.wide_activation_bits == 16 and
                             self.ctx.options.act_bits != 16 else [])
        # measured as the verification measures (every kept sample; drop + margin, held-out drop): the level
        # is chosen once, and a level the held-out samples break would make every assignment fail
        # one level at a time, cheapest first: a level within REST_SHARE is taken and the next is not measured
        p = self.power
        rest_drops, guarded, rest_trials = {}, {}, {}
        for lv in levels:
            d = self.measure([self.config_for(all_float, layers, rest=lv)], every=True)[0]
            outs, size, fm = self.last_outs[0], self.last_sizes[0], self.last_float_macs[0]
            rest_drops[lv] = d
            se, held = self.spread(outs)
            guarded[lv] = max(d + VERIFY_MARGIN * se, held or 0.0) if outs is not None else math.inf
            rest_trials[lv] = Trial(f"layers float, rest {lv}", dict(all_float),
                                    self.weight_bytes(all_float, layers, lv), d, held_out=held,
                                    margin=VERIFY_MARGIN * se, file_bytes=size, float_macs=fm)
            res.trials.append(rest_trials[lv])
            if guarded[lv] ** p <= REST_SHARE * self.budget ** p:
                break
        rest_drops["float"] = guarded["float"] = 0.0
        level = next((lv for lv, d in guarded.items() if d ** p <= REST_SHARE * self.budget ** p), None) or \
            next(lv for lv, d in guarded.items() if d <= self.budget)
        rest_drops = {lv: guarded[lv] if lv == level else d for lv, d in rest_drops.items()}
        rest = rest_drops[level]
        res.rest, res.rest_drops = level, rest_drops
        # 3. greedy from the table, measured on the whole model; the estimate is then rescaled to what was
        # measured (the layers' drops together are rarely their sum) and the greedy runs again, RESCALE_STEPS
        # times at most; then, if nothing was within the budget, back off from the last assignment
        p = self.power
        best: Optional[Tuple[Dict[str, str], float]] = None
        best_scale = 1.0
        tried: List[Dict[str, str]] = []
        scale, low = 1.0, 0.0       # low: the largest scale whose assignment was measured above the budget
        assignment = dict(all_float)
        for step in range(RESCALE_STEPS):
            assignment = self.greedy(layers, names, table, rest, scale=scale)
            if assignment in tried:
                if best is not None:
                    break
                low, scale = scale, scale * 2
                continue
            tried.append(dict(assignment))
            d = self.measure([self.config_for(assignment, layers, rest=level)])[0]
            res.trials.append(Trial("greedy" if step == 0 else f"rescaled x{scale:.3g}", dict(assignment),
                                    self.weight_bytes(assignment, layers, level), d,
                                    file_bytes=self.last_sizes[0], float_macs=self.last_float_macs[0]))
            est = self.estimate(assignment, layers, table, rest)
            fit = max(max(d, 0.0) ** p - max(rest, 0.0) ** p, 0.0) / max(est, EPS ** p) if math.isfinite(d) \
                else 2 * scale
            if d <= self.budget:
                if best is None or self.model_bytes(assignment, layers) < self.model_bytes(best[0], layers):
                    best, best_scale = (dict(assignment), d), scale
                if d > REFINE_BELOW * self.budget:
                    break
                scale = max(fit, scale * REFINE_MIN_SCALE, low * 1.05 if low else 0.0)
            else:
                low = scale
                scale = max(fit, scale * 1.25)
        step, k = len(res.trials), 1
        while best is None and len(tried) < MAX_VERIFICATIONS:
            if not self.back_off(assignment, layers, names, table, k):
                break
            k *= 2
            tried.append(dict(assignment))
            d = self.measure([self.config_for(assignment, layers, rest=level)])[0]
            res.trials.append(Trial(f"back-off {k // 2}", dict(assignment),
                                    self.weight_bytes(assignment, layers, level), d,
                                    file_bytes=self.last_sizes[0], float_macs=self.last_float_macs[0]))
            if d <= self.budget:
                best = (dict(assignment), d)
        if best is not None:
            res.assignment, res.search_drop = best
        else:   # every layer float at this rest level was measured within the budget
            res.assignment, res.search_drop = dict(all_float), rest
            res.notes.append("mixed precision: back-off reached every searched layer float")
        # 4. verification on every kept sample, held-out ones included: drop + VERIFY_MARGIN x its standard
        # error within the budget, and the held-out drop within it. Else tighten: the greedy again with the
        # layers' estimate scaled up by (verified drop / budget)^p (at least x1.25); where that gives nothing
        # new (layers of drop 0 under a coarse metric), back off (1, 2, 4, ... layers a candidate up)
        assignment, k, ok = dict(res.assignment), 1, False
        vscale, seen, what, tighten = best_scale, [], "verify", TIGHTEN_STEPS
        for i in range(VERIFY_STEPS):
            ok, t = self.verify(assignment, layers, level)
            t.what = what
            res.trials.append(t)
            seen.append(dict(assignment))
            if ok:
                break
            g = max(t.drop + t.margin, t.held_out or 0.0)
            ratio = max((g / self.budget) ** p, 1.25) if math.isfinite(g) else 4.0
            nxt = None
            for _ in range(3 if tighten > 0 else 0):
                vscale *= ratio
                cand = self.greedy(layers, names, table, rest, scale=vscale)
                if cand not in seen:
                    nxt, what, tighten = cand, f"verify tightened x{vscale:.3g}", tighten - 1
                    break
                ratio = 1.25
            if nxt is None:
                if not self.back_off(assignment, layers, names, table, k):
                    break
                what, k = f"verify back-off {k}", k * 2
            else:
                assignment = nxt
        if ok:
            assignment, t = self.shrink(assignment, t, layers, names, table, level, res)
        elif layers and level in rest_trials and guarded.get(level, math.inf) <= self.budget:
            # every layer float at this level passed the rule: shrink from there (float16 islands, ...)
            got_a, got_t = self.shrink(dict(all_float), rest_trials[level], layers, names, table, level, res)
            if got_a != all_float:
                assignment, t, ok = got_a, got_t, True
        # the plain run (every layer at the given settings, the rest too) is a plan every user has: never
        # return one whose file is larger when the plain run meets the same rule (the target's real bytes, as
        # stored: a W16A16 layer on a target without 16-bit kernels is float-sized)
        plain = f"W{self.ctx.options.weight_bits}A{self.ctx.options.act_bits}"
        all_plain = {l.name: plain for l in layers}
        options = [(t, dict(assignment), level)] if ok else []
        plain_option = None
        if plain in names and layers and (assignment != all_plain or level != "base"):
            okp, tp = self.verify(all_plain, layers, "base")
            tp.what = f"verify all {plain} (the plain run)"
            res.trials.append(tp)
            res.plain_file_bytes = tp.file_bytes
            plain_option = (tp, all_plain, "base")
            if okp:
                options.append(plain_option)
        elif ok and assignment == all_plain and level == "base":
            plain_option = options[0]
        # every layer float at the rest's level was measured under the same rule: on a target that stores a
        # float kernel's weights exact, it can be the smallest file of all
        rt = rest_trials.get(level)
        if rt is not None and guarded.get(level, math.inf) <= self.budget and layers:
            options.append((rt, dict(all_float), level))
        if options:
            ok = True
            t, assignment, level = self.choose(options, plain_option, layers, res)
        if not ok:   # every layer float, the rest at its level, then the next levels up (float: exact)
            order = levels + ["float"]
            for lv in order[order.index(level):]:
                level, assignment = lv, dict(all_float)
                ok, t = self.verify(assignment, layers, level)
                t.what = f"verify layers float, rest {level}"
                res.trials.append(t)
                if ok:
                    break
            res.notes.append("mixed precision: the verification backed off to every searched layer float")
        res.assignment, res.drop, res.held_out_drop, res.margin = assignment, t.drop, t.held_out, t.margin
        res.file_bytes = t.file_bytes
        if res.plain_file_bytes is None and assignment == all_plain and level == "base":
            res.plain_file_bytes = t.file_bytes
        res.rest = level
        if self.unresolved:
            res.notes.append(f"mixed precision: the metric moved on none of the {self.n_kept} samples: it cannot "
                             f"see a drop below ~{300 / max(self.n_kept, 1):.2g} % (3/n) there, above the budget; "
                             f"use a smooth metric or more calibration samples")
        if level != "base":
            res.notes.append(f"mixed precision: the nodes outside the searched layers drop "
                             f"{100 * rest_drops['base']:.3g} % at the given settings: they run at {level}")
        res.whole_model_float = level == "float" and all(c == "float" for c in res.assignment.values())
        res.weight_bytes = self.weight_bytes(res.assignment, layers, level)
        rd = self.rounding
        res.rounding = {"gptq": sorted({f"{n} {b}-bit" for n, b in rd.uses - rd.keep_nearest}),
                        "nearest_measured_better": sorted(f"{n} {b}-bit" for n, b in rd.keep_nearest),
                        "seconds": round(rd.seconds, 3)}
        res.seconds["assignment"] = time.perf_counter() - t1
        res.seconds["total"] = time.perf_counter() - t0
        res.evaluations = self.evaluations
        return res

    def plain_name(self) -> str:
        return f"W{self.ctx.options.weight_bits}A{self.ctx.options.act_bits}"

    def banned_by_plain(self, layers, names, res) -> Optional[Dict[str, set]]:
        """Under balanced/latency, when the plain run passes the rule: layer -> the candidates whose move alone
        puts more float multiply-accumulates on the plan than the plain run (LATENCY_TOLERANCE); None when the
        plain run does not pass (or is no candidate, or the objective does not weigh latency)."""
        plain = self.plain_name()
        if self.ctx.settings.optimize not in LATENCY_OBJECTIVES or plain not in names or not layers:
            return None
        all_plain = {l.name: plain for l in layers}
        ok, t = self.verify(all_plain, layers, "base")
        t.what = f"verify all {plain} (the plain run, first: every weight rounded by GPTQ)"
        res.trials.append(t)
        res.plain_file_bytes = t.file_bytes
        if not ok:
            return None
        self._plain_trial = t
        cap = (t.float_macs or 0.0) * (1 + LATENCY_TOLERANCE)
        banned = {l.name: {c for c in names if c != plain and
                           self.plan_float_macs(dict(all_plain, **{l.name: c}), layers, "base") > cap}
                  for l in layers}
        n = sum(len(v) for v in banned.values())
        if n:
            res.notes.append(f"mixed precision: the plain run meets the budget; {n} layer moves that would run more "
                             f"multiply-accumulates on float kernels than it were not measured")
        return banned

    def plain_result(self, res, layers, t0) -> Result:
        """The result when the plain run is the only plan allowed (banned_by_plain)."""
        t = self._plain_trial
        res.assignment = {l.name: self.plain_name() for l in layers}
        res.drop, res.held_out_drop, res.margin, res.search_drop = t.drop, t.held_out, t.margin, t.drop
        res.file_bytes = res.plain_file_bytes = t.file_bytes
        res.rest, res.rest_drops = "base", {}
        res.table = {l.name: {} for l in layers}
        if t.float_macs is not None:
            res.float_macs = {"plan": int(t.float_macs), "plain": int(t.float_macs)}
        res.notes.append("mixed precision: every cheaper move would run more multiply-accumulates on float kernels "
                         "than the plain run, which meets the budget: the plain run is returned")
        if runs_on_onnxruntime(self.profile.fusions):    # its latency, as every returned plan reports it
            ms = self.time_options([(t, res.assignment, "base")], layers)
            if ms is not None:
                res.latency = {"clock": "cpu", "threads": 1, "plan_ms": round(ms[0], 4),
                               "plain_ms": round(ms[0], 4)}
        if self.unresolved:
            res.notes.append(f"mixed precision: the metric moved on none of the {self.n_kept} samples: it cannot "
                             f"see a drop below ~{300 / max(self.n_kept, 1):.2g} % (3/n) there, above the budget; "
                             f"use a smooth metric or more calibration samples")
        res.weight_bytes = self.weight_bytes(res.assignment, layers, "base")
        rd = self.rounding
        res.rounding = {"gptq": sorted({f"{n} {b}-bit" for n, b in rd.uses - rd.keep_nearest}),
                        "nearest_measured_better": [], "seconds": round(rd.seconds, 3)}
        res.seconds["total"] = time.perf_counter() - t0
        res.evaluations = self.evaluations
        return res

    def shrink(self, assignment, trial, layers, names, table, level, res):
        """From a verified assignment, move layers to cheaper candidates while the verification still passes and
        the file shrinks: each layer's move that saves the most bytes (model_bytes, readers included) per
        estimated drop, the best k layers at once (k = 1, 2, 4, ... while they pass, halved when they fail); a
        single move that fails (or whose file is larger, or under balanced/latency whose float MACs are more)
        rules out that layer's cheaper candidates.
        SHRINK_STEPS verifications at most. The estimate only orders the moves (layers' drops together are
        rarely their sum): the measurement decides, so this can only give a smaller plan within the rule."""
        p = self.power
        rank = {c: i for i, c in enumerate(names)}
        floor: Dict[str, int] = {}    # layer -> lowest rank not ruled out
        weigh = self.ctx.settings.optimize in LATENCY_OBJECTIVES   # then no step may add float MACs
        k = 1
        steps = SHRINK_STEPS
        # first, every layer to float16 where that costs next to nothing alone (NEGLIGIBLE of the budget) and
        # makes the file smaller (a float layer; an 8-bit one whose kernel runs float among float16 neighbours
        # and so stores float weights), all at once: one verification instead of one per step (integer moves
        # of small drop alone do not add up that way: their 8-bit outputs meet their neighbours')
        free = {}
        now = self.model_bytes(assignment, layers)
        for l in layers:
            c = "float16"
            if c not in names or assignment[l.name] == c or table[l.name].get(c, math.inf) > NEGLIGIBLE * self.budget:
                continue
            nxt = dict(assignment)
            nxt[l.name] = c
            if now - self.model_bytes(nxt, layers) >= 1.0:
                free[l.name] = c
        if len(free) > 1:
            nxt = dict(assignment, **free)
            ok, t = self.verify(nxt, layers, level)
            t.what = f"verify shrink {len(free)} moves of negligible drop"
            res.trials.append(t)
            steps -= 1
            if ok and (t.file_bytes or 0) <= (trial.file_bytes or 0) and (not weigh or (
                    t.float_macs if t.float_macs is not None else math.inf) <= (
                    trial.float_macs if trial.float_macs is not None else math.inf)):
                assignment, trial = nxt, t
        spent, rounds = 0, 0     # verifications made; rounds of the loop (a move ruled out unmeasured is free)
        while spent < steps and rounds < 4 * steps + len(layers):
            rounds += 1
            now = self.model_bytes(assignment, layers)
            moves = []
            for l in layers:
                cur = assignment[l.name]
                d_now = max(0.0, table[l.name].get(cur, 0.0)) ** p
                best = None
                for c in names[floor.get(l.name, 0):rank[cur]]:
                    d = table[l.name].get(c, math.inf)
                    if not math.isfinite(d) or d > self.budget:
                        continue
                    nxt = dict(assignment)
                    nxt[l.name] = c
                    saved = now - self.model_bytes(nxt, layers)
                    eff = saved / (max(max(0.0, d) ** p - d_now, 0.0) + EPS ** p)
                    if saved >= 1.0 and (best is None or eff > best[0]):
                        best = (eff, l.name, c)
                if best is not None:
                    moves.append(best)
            if not moves:
                break
            moves.sort(key=lambda m: -m[0])
            if weigh:
                # a move the cost model already puts on more float MACs cannot be kept: ruled out unmeasured
                limit = trial.float_macs if trial.float_macs is not None else math.inf
                while moves and self.plan_float_macs(dict(assignment, **{moves[0][1]: moves[0][2]}),
                                                     layers, level) > limit:
                    floor[moves[0][1]] = rank[moves[0][2]] + 1
                    moves.pop(0)
                if not moves:
                    continue
            take = moves[:k]
            nxt = dict(assignment)
            for _, name, c in take:
                nxt[name] = c
            if weigh and len(take) > 1 and self.plan_float_macs(nxt, layers, level) > limit:
                k = max(1, len(take) // 2)
                continue
            ok, t = self.verify(nxt, layers, level)
            spent += 1
            t.what = "verify shrink " + ", ".join(f"{name} {c}" for _, name, c in take)
            res.trials.append(t)
            if ok and (t.file_bytes or 0) <= (trial.file_bytes or 0) and (not weigh or (
                    t.float_macs if t.float_macs is not None else math.inf) <= (
                    trial.float_macs if trial.float_macs is not None else math.inf)):
                assignment, trial = nxt, t
                k *= 2
            elif len(take) > 1:
                k = max(1, len(take) // 2)
            else:   # over the rule, a larger file (scales, Q/DQ: not in the estimate) or more float MACs
                _, name, c = take[0]
                floor[name] = rank[c] + 1
        return assignment, trial

    def plan_float_macs(self, assignment, layers, level) -> float:
        """The cost model's float multiply-accumulates of `assignment` from its plan alone (no encodings, no
        session): what a verification would report as `float_macs`."""
        key = (tuple(sorted(assignment.items())), level)
        if key not in self._macs:
            cal = self.ctx.calibration
            plan = build_plan(self.ctx.model, self.profile, cal.dtypes, self.stats,
                              self.options_for(self.config_for(assignment, layers, rest=level)))
            self._macs[key] = float_macs(plan)
        return self._macs[key]

    def choose(self, options, plain_option, layers, res):
        """The option (trial, assignment, rest level) to return, all within the rule: the smallest file, or under
        `--optimize latency` the fewest multiply-accumulates on float kernels (the cost model), bytes breaking
        ties. When the plain run is an option, no option the cost model puts on more float MACs than the plain
        run is taken under the bytes objective. Then, on a target whose runtime is this machine's onnxruntime,
        the choice and the plain run are timed interleaved (CPU clock): a choice slower than the plain run
        within the rule by more than LATENCY_TOLERANCE gives way to it; under latency the faster one wins."""
        latency = self.ctx.settings.optimize == "latency"

        def num(x):
            return math.inf if x is None else x

        def key(o):
            fb, fm = num(o[0].file_bytes), num(o[0].float_macs)
            return (fm, fb) if latency else (fb, fm)
        def describe(t):
            fm = "?" if t.float_macs is None else f"{t.float_macs / 1e6:.3g} M"
            return f"{t.file_bytes} bytes, {fm} multiply-accumulates on float kernels"
        first = options[0]
        plain_ok = plain_option is not None and any(o[0] is plain_option[0] for o in options)
        # latency weighs under balanced and latency; `size` asked for the smallest file and `accuracy` for every
        # quantizer as asked, whatever they run (their timings are still reported)
        weigh = self.ctx.settings.optimize in LATENCY_OBJECTIVES
        if plain_ok and not latency and weigh:
            cap = num(plain_option[0].float_macs) * (1 + LATENCY_TOLERANCE)
            options = [o for o in options if num(o[0].float_macs) <= cap or o[0] is plain_option[0]]
        best = min(options, key=key)
        if best is not first:
            why = "the fewest multiply-accumulates on float kernels" if latency else "the smallest file" if \
                any(o is first for o in options) else \
                "the search's plan runs more multiply-accumulates on float kernels than the plain run; the smallest"
            why += " of the plans within the rule"
            res.notes.append(f"mixed precision: '{best[0].what}' is returned ({why}): "
                             f"{describe(best[0])}, against the search's '{first[0].what}': {describe(first[0])}")
        if runs_on_onnxruntime(self.profile.fusions):
            timed = [best] + ([plain_option] if plain_option is not None and plain_option[0] is not best[0]
                              else [])
            ms = self.time_options(timed, layers)
            if ms is not None:
                res.latency = {"clock": "cpu", "threads": 1, "plan_ms": round(ms[0], 4),
                               "plain_ms": round(ms[-1], 4)}
                if len(timed) > 1 and plain_ok and weigh and (ms[0] > ms[1] * (1 + LATENCY_TOLERANCE) or
                                                              (latency and ms[1] < ms[0])):
                    res.notes.append(f"mixed precision: the search's choice ran {ms[0]:.3g} ms against the "
                                     f"plain run's {ms[1]:.3g} ms: the plain run is returned")
                    best = plain_option
                    res.latency["plan_ms"] = res.latency["plain_ms"]
        if best[0].float_macs is not None:
            res.float_macs = {"plan": int(best[0].float_macs)}
            if plain_option is not None and plain_option[0].float_macs is not None:
                res.float_macs["plain"] = int(plain_option[0].float_macs)
        return best

    def time_options(self, options, layers) -> Optional[List[float]]:
        """Median CPU milliseconds per sample of each option's QDQ model, timed interleaved on the first
        LATENCY_SAMPLES kept samples."""
        models = {}
        for i, (_, assignment, level) in enumerate(options):
            b = self.lower(self.config_for(assignment, layers, rest=level))
            if b is None:
                return None
            models[i] = b
        try:
            ms = time_interleaved(models, self.feeds[:LATENCY_SAMPLES] or None, runs=LATENCY_RUNS,
                                  warmup=LATENCY_WARMUP, threads=1, clock="cpu")
            n = max(1, min(len(self.feeds), LATENCY_SAMPLES))
            ms = {k: v / n for k, v in ms.items()}      # per sample
        except QCompilerError:
            return None
        return [ms[i] for i in range(len(options))]

    def verify(self, assignment: Dict[str, str], layers: List[Layer], level: str) -> Tuple[bool, Trial]:
        """Measure `assignment` on every kept sample: accepted when its drop there plus VERIFY_MARGIN standard
        errors is within the budget and its drop on the held-out samples alone is within the budget. An
        assignment already verified (the tightened greedy and the last pass often come back to one) is not
        measured again: its trial is copied."""
        key = (tuple(sorted(assignment.items())), level, frozenset(self.rounding.keep_nearest))
        seen = self.verified.get(key)
        if seen is not None:
            return seen[0], copy.copy(seen[1])
        d = self.measure([self.config_for(assignment, layers, rest=level)], every=True)[0]
        se, held = self.spread(self.last_outs[0])
        t = Trial("verify", dict(assignment), self.weight_bytes(assignment, layers, level), d,
                  held_out=held, margin=VERIFY_MARGIN * se, file_bytes=self.last_sizes[0], float_macs=self.last_float_macs[0])
        if self.metric is not None and se == 0.0 and d == 0.0 and self.n_kept < 3.0 / self.budget and \
                assignment and any(c != "float" for c in assignment.values()):
            self.unresolved = True
        ok = math.isfinite(d) and math.isfinite(se) and d + VERIFY_MARGIN * se <= self.budget and \
            (held is None or held <= self.budget)
        self.verified[key] = (ok, copy.copy(t))
        return ok, t

    def spread(self, outs) -> Tuple[float, Optional[float]]:
        """(standard error of the drop on every kept sample, drop on the held-out ones or None)."""
        if outs is None:
            return math.inf, math.inf
        se = self.standard_error(outs) if len(outs) > 1 else 0.0
        held = self.drop_of(outs[self.n_search:], first=self.n_search) if self.n_kept > self.n_search else None
        return se, held

    def reference(self, res: Result, name: str) -> None:
        """Measure every layer at candidate `name` (e.g. all W8A8) as one more point of the curve (not again
        when it was verified: the plain run usually was)."""
        a = {l.name: name for l in res.layers}
        seen = self.verified.get((tuple(sorted(a.items())), res.rest, frozenset(self.rounding.keep_nearest)))
        if seen is not None:
            t = seen[1]
            res.trials.append(Trial(f"all {name}", a, t.weight_bytes, t.drop, file_bytes=t.file_bytes,
                                    float_macs=t.float_macs))
            return
        d = self.measure([self.config_for(a, res.layers, rest=res.rest)], every=True)[0]
        res.trials.append(Trial(f"all {name}", a, self.weight_bytes(a, res.layers, res.rest), d,
                                file_bytes=self.last_sizes[0], float_macs=self.last_float_macs[0]))

    def greedy(self, layers, names, table, rest, scale: float = 1.0) -> Dict[str, str]:
        """The smaller (model_bytes) of two greedy assignments within the estimate: down from every layer float
        (greedy_down) and up from every layer at the given settings, then down again (greedy_up). Down alone
        misses the bytes a move costs the layer's readers (a float layer's readers store float weights on
        onnxruntime's CPU): from every layer float those readers save nothing until their writer moves."""
        down = self.greedy_down(layers, names, table, rest, scale=scale)
        up = self.greedy_up(layers, names, table, rest, scale=scale)
        if up is not None and self.model_bytes(up, layers) < self.model_bytes(down, layers):
            return up
        return down

    def greedy_up(self, layers, names, table, rest, scale: float = 1.0) -> Optional[Dict[str, str]]:
        """From every layer at the given settings (the plain run): while the estimate breaks the budget, take
        the move up with the most estimated drop removed per byte it adds (model_bytes, readers included);
        then greedy_down from there. None when the given settings are no candidate or nothing fits."""
        plain = f"W{self.ctx.options.weight_bits}A{self.ctx.options.act_bits}"
        if plain not in names:
            return None
        p = self.power
        rank = {c: i for i, c in enumerate(names)}
        cur = {l.name: plain for l in layers}

        def part(l, c):
            return scale * max(0.0, table[l.name].get(c, math.inf)) ** p
        est = max(0.0, rest) ** p + sum(part(l, plain) for l in layers)
        budget = self.budget ** p
        if not math.isfinite(est):
            return None
        now_bytes = self.model_bytes(cur, layers)
        while est > budget:
            best, best_eff = None, -1.0
            for l in layers:
                d_now = part(l, cur[l.name])
                for c in names[rank[cur[l.name]] + 1:]:
                    delta = part(l, c) - d_now
                    if not math.isfinite(delta) or delta >= 0:
                        continue
                    nxt = dict(cur)
                    nxt[l.name] = c
                    b = self.model_bytes(nxt, layers)
                    eff = -delta / (max(b - now_bytes, 0.0) + 1.0)
                    if eff > best_eff:
                        best, best_eff = (l.name, c, delta, b), eff
            if best is None:
                return None
            name, c, delta, now_bytes = best
            cur[name] = c
            est += delta
        return self.greedy_down(layers, names, table, rest, start=cur, scale=scale)

    def greedy_down(self, layers, names, table, rest, start=None, scale: float = 1.0) -> Dict[str, str]:
        """From `start` (every layer float): take the move with the most cost saved per estimated drop while
        the estimate stays within the budget. The estimate adds the layers' drops to the rest's (`scale` x
        each); with the default metric (an RMS error) their squares add, as independent noise powers do."""
        p = self.power
        cur = dict(start) if start else {l.name: "float" for l in layers}
        rank = {c: i for i, c in enumerate(names)}
        est = max(0.0, rest) ** p + sum(scale * max(0.0, table[l.name].get(cur[l.name], 0.0)) ** p
                                        for l in layers)
        budget = self.budget ** p
        while True:
            best, best_eff = None, -1.0
            cur_bytes = self.model_bytes(cur, layers) if self.knock else 0.0
            for l in layers:
                now = cur[l.name]
                d_now = scale * max(0.0, table[l.name].get(now, 0.0)) ** p
                for c in names[:rank[now]]:
                    d = table[l.name].get(c, math.inf)
                    if not math.isfinite(d):
                        continue
                    delta = scale * max(0.0, d) ** p - d_now
                    if est + delta > budget:
                        continue
                    if self.knock:
                        nxt = dict(cur)
                        nxt[l.name] = c
                        saved = cur_bytes - self.model_bytes(nxt, layers)
                    else:
                        saved = self.saved_bytes(l, now, c)
                    err = self.errors.get(l.name, {})
                    tie = 0.0 if self.metric is None else \
                        TIE_WEIGHT * max(0.0, err.get(c, math.inf) - err.get(now, 0.0))
                    eff = saved / (max(delta, 0.0) + tie + EPS ** p)
                    if saved > 0 and eff > best_eff:
                        best, best_eff = (l.name, c, delta), eff
            if best is None:
                return cur
            name, c, delta = best
            cur[name] = c
            est += delta

    def saved_bytes(self, layer: Layer, now: str, c: str) -> float:
        """Bytes saved moving `layer` from `now` to `c`: as the lowered candidates stored it where both were
        measured (on onnxruntime's CPU a layer that runs a float kernel keeps exact float weights at W8A8: it
        saves nothing), else from the weight elements; activation bits break ties (Candidate.cost)."""
        known = self.layer_bytes.get(layer.name, {})
        tie = (BY_NAME[now].cost - BY_NAME[c].cost) - (BY_NAME[now].weight_bytes_per_element -
                                                       BY_NAME[c].weight_bytes_per_element)
        if now in known and c in known:
            return known[now] - known[c] + tie
        return layer.weight_elements * (BY_NAME[now].cost - BY_NAME[c].cost)

    def model_bytes(self, assignment: Dict[str, str], layers: List[Layer]) -> float:
        """The layers' bytes as the target stores them at `assignment` (layer_bytes; weight elements where not
        measured), readers included: a layer at an integer candidate whose writer's output loses its integer
        kernel (knock_on) stores float weights. Activation bits break ties (Candidate.cost)."""
        lost = set()
        kinds = self._kinds
        for name, c in assignment.items():
            k = kinds.get(c)
            if k is None and c not in kinds:
                k = kinds[c] = output_kind(BY_NAME[c], self.ctx.options.act_bits)
            if k is not None:
                lost |= self.knock.get(name, {}).get(k, frozenset())
        total = 0.0
        parts = self._parts
        for l in layers:
            c = assignment.get(l.name, "float")
            key = (l.name, c, l.name in lost)
            v = parts.get(key)
            if v is None:
                v = parts[key] = self._part(l, BY_NAME[c], key[2])
            total += v
        return total

    def _part(self, l: Layer, c: Candidate, reader_lost: bool) -> float:
        """One layer's term of model_bytes (cached in self._parts, emptied when layer_bytes changes)."""
        known = self.layer_bytes.get(l.name, {})
        name = "float" if c.precision == "int" and reader_lost else c.name
        b = known[name] if name in known else l.weight_elements * BY_NAME[name].weight_bytes_per_element
        return b + c.cost - c.weight_bytes_per_element

    def knock_on(self, layers: List[Layer], names: List[str]) -> Dict[str, Dict[str, frozenset]]:
        """layer -> output kind (output_kind) -> the other layers that lose their integer kernel (integer_kernel,
        from the plan alone) when that layer writes that kind, every other layer at the given settings; only on a
        target that stores a float kernel's weights float (the profile's prefold_unfused_weight_dq): elsewhere
        a reader's bytes do not change."""
        prof, objective = self.profile, self.ctx.settings.optimize
        if not (prof.prefold_unfused_weight_dq and prof.integer_weight_kernels):
            return {}
        kinds: Dict[str, str] = {}
        for c in names:
            k = output_kind(BY_NAME[c], self.ctx.options.act_bits)
            if k is not None:
                kinds.setdefault(k, c)
        if not kinds:
            return {}
        cal = self.ctx.calibration
        stored_float = {l.name for l in layers if prof.float_kernel_weight_form(objective, l.op_type,
                                                                                 weight_only=False) != "int"}

        def integer_layers(assignment):
            plan = build_plan(self.ctx.model, prof, cal.dtypes, self.stats,
                              self.options_for(self.config_for(assignment, layers)))
            bits = group_bits_table(plan)
            return {l.name for l in layers if l.name in plan.nodes and integer_kernel(plan, bits, plan.nodes[l.name])}
        base = integer_layers({}) & stored_float
        out: Dict[str, Dict[str, frozenset]] = {}
        for x in layers:
            for k, c in kinds.items():
                lost = frozenset(base - integer_layers({x.name: c}) - {x.name})
                if lost:
                    out.setdefault(x.name, {})[k] = lost
        return out

    def estimate(self, assignment, layers, table, rest) -> float:
        """Sum of the layers' drops (powers) at `assignment`, without the rest's."""
        return sum(max(0.0, table[l.name].get(assignment[l.name], 0.0)) ** self.power for l in layers)

    def back_off(self, assignment, layers, names, table, k) -> int:
        """Raise the k layers whose current candidate is the most sensitive one step up (ties: the larger
        relative output error); returns how many."""
        rank = {c: i for i, c in enumerate(names)}
        movable = [l for l in layers if rank[assignment[l.name]] < len(names) - 1]
        movable.sort(key=lambda l: (-table[l.name].get(assignment[l.name], math.inf),
                                    -self.errors.get(l.name, {}).get(assignment[l.name], math.inf)))
        for l in movable[:k]:
            assignment[l.name] = names[rank[assignment[l.name]] + 1]
        return len(movable[:k])

    def _other_weight_bytes(self, layers) -> int:
        """Weight bytes outside the layers at the user's weight bits (quantized weights) or float."""
        mine = {n for l in layers for n in l.nodes}
        total = 0
        wb = self.ctx.options.weight_bits / 8.0
        for node in self.ctx.model.graph.nodes:
            if node.name in mine:
                continue
            for slot in (self.profile.weights.get(node.op_type) or {}):
                v = node.inputs[slot] if slot < len(node.inputs) else None
                if v is not None and v.tensor is not None:
                    total += int(np.prod(v.tensor.dims)) * wb
        return int(total)


def apply_result(ctx, search: Search, res: Result) -> None:
    """Make the chosen assignment the run's config and rebuild the plan (and the fp16 island list)."""
    cfg = search.config_for(res.assignment, res.layers, rest=res.rest)
    ctx.options = search.options_for(cfg)
    cal = ctx.calibration
    ctx.plan = build_plan(ctx.model, ctx.profile, cal.dtypes, search.stats, ctx.options)
    ctx.float16 = float16_nodes(ctx.model, cfg, ctx.plan.dtypes)
    # the weights as the search measured them: their encodings now, with GPTQ's integers (frozen, so
    # assign-encodings keeps them and insert-qdq writes them)
    assign_encodings(ctx.plan, ctx.model, cal, ctx.settings.scheme)
    assign_block_encodings(ctx.plan, ctx.model, ctx.settings.scheme)
    search.rounding.apply(ctx.model, ctx.plan)


def format_table(mp: dict) -> str:
    """The report's mixed_precision section as a text table: layer, chosen candidate, its sensitivity."""
    rows = [("layer", "op", "chosen", "drop alone %", "weights")]
    for name, l in mp["layers"].items():
        s = l["sensitivity"].get(l["chosen"])
        s = f"{100 * s:.4g}" if isinstance(s, (int, float)) else "not measured" if s is None else str(s)
        rows.append((name[:60], l["op"], l["chosen"], s, str(l["weights"])))
    w = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  " + "  ".join(c.ljust(w[i]) for i, c in enumerate(r)) for r in rows]
    d = mp["drop"]
    held = mp.get("held_out_drop")
    m = mp.get("margin")
    check = (f" + margin {100 * m:.3g} % ({mp.get('margin_k', 1):g} SE, {sum(mp['samples'].values())} samples)"
             if isinstance(m, (int, float)) else "") + \
        (f", held-out {100 * held:.4g} %" if isinstance(held, (int, float)) else "")
    fb, pb = mp.get("file_bytes"), mp.get("plain_file_bytes")
    size = f"model {fb} bytes as stored" + (f" (plain run {pb})" if pb and pb != fb else "") if fb else \
        f"weights {mp['weight_bytes']} bytes"
    lat = mp.get("latency")
    if lat:
        size += f", {lat['plan_ms']:.3g} ms against the plain run's {lat['plain_ms']:.3g} ms ({lat['clock']} clock)"
    lines.append(f"  mixed precision: drop {100 * d:.4g} %{check} (budget {100 * mp['budget']:.4g} %, "
                 f"{mp['metric']}), {size}, {mp['evaluations']} evaluations on "
                 f"{mp['executor']}, {mp['seconds'].get('total', 0):.1f} s" if isinstance(d, (int, float)) else
                 f"  mixed precision: drop {d}")
    return "\n".join(lines)


__all__ = ["CANDIDATES", "Candidate", "legal_candidates", "find_layers", "Search", "Result", "apply_result",
           "format_table", "relative_error", "run_candidate"]
