"""What the quantization passes share: one QuantContext per `quantize` run, and the QuantPass base class.

Every step of quantization is a registered pass (passes/quantize/) that reads and fills this context: the
settings as the user gave them (checked), the target profile, the calibration samples and statistics, the plan,
the encodings and the report's notes. A new algorithm is one more QuantPass: the pass manager gives it timing,
--print-after, --dump-dir and --verify-each, and its `requires`/`ensures` (passmanager/facts.py) are checked
against the pipeline before anything runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from typing import Any, Dict, List, Optional

from qcompiler.passmanager.base import Pass, PassResult
from qcompiler.quant.core.switches import SWITCHES


def _settings_class():
    """QuantSettings: one field per switch (qcompiler/quant/core/switches.py), holding its checked value, plus `selection`."""
    fields = [(s.name, Any, field(default_factory=s.settings_default)) for s in SWITCHES]
    fields.append(("selection", Any, field(default=None)))     # quant.selection.Selection
    return make_dataclass("QuantSettings", fields, namespace={
        "__doc__": "The switches of one `quantize` run, checked (one field per entry of "
                   "qcompiler/quant/core/switches.py, e.g. `weight_bits`, `optimize`, `max_drop` as a fraction, "
                   "`min_sqnr` and `latency_budget_db` with their defaults filled in) and resolved by "
                   "api._context (config file read into a QuantConfig, scheme canonical, target chosen); "
                   "`selection`: the quant.selection.Selection of exclude/op_types/nodes and the symmetry "
                   "overrides.",
        "__module__": __name__})


QuantSettings = _settings_class()


@dataclass
class QuantContext:
    """The shared state of one quantization pipeline. Passes fill it in pipeline order."""

    model: Any
    settings: QuantSettings
    profile: dict
    samples: Any = None                 # data.SampleSet: read by `calibrate`
    opset: int = 13                     # the output opset, decided before the pipeline (quant.opset)
    opset_fallback: Optional[int] = None  # the opset the settings need, when `opset` is only the profile's wish
    options: Any = None                 # placement.PlacementOptions (config with the selection's rules)
    calibration: Any = None             # calibrate.CalibrationResult
    plan: Any = None                    # plan.QuantPlan
    layers: Dict[str, dict] = field(default_factory=dict)      # per-node precision choices (report 'layers')
    float16: list = field(default_factory=list)               # nodes placement chose for fp16 islands
    activations: Dict[str, Any] = field(default_factory=dict)  # value name -> Encoding, as written
    params: Dict[str, Any] = field(default_factory=dict)
    float_encodings: Dict[str, dict] = field(default_factory=dict)   # load-encodings: FLOAT entries applied
    prefolded: Dict[str, str] = field(default_factory=dict)    # weights stored float on their int grid
    errors: Optional[dict] = None       # report.output_errors: per-output SQNR on the kept samples
    safety_net: Any = None              # safety_net.Outcome
    source: Any = None                  # the float model as the caller gave it (path, ModelProto or IR Model)
    # float weights a prepare pass wrote (split-outlier-rows), by name: the safety net's weight phase reads them
    # where `source` has none or another value
    prepared_weights: Dict[str, Any] = field(default_factory=dict)
    latency: Optional[dict] = None      # measure-latency: float and quantized medians, their ratio
    kernels: Optional[dict] = None      # measure-latency: which nodes run on integer kernels, why not the rest
    latency_search: Optional[dict] = None  # latency-search: floor, SQNR before/after, pairs taken out
    weight_plan: Any = None             # weight_only.WeightOnlyPlan (plan-weights)
    narrow_weights: Any = None          # narrow-float-weights: the W8A8 float weights stored int8 (a WeightOnlyPlan)
    reference: Optional[list] = None    # reference-outputs: [(feed, float outputs)] when there is no calibration
    notes: List[str] = field(default_factory=list)
    smoothquant: Optional[dict] = None  # smoothquant: per layer how 1/s was placed and alpha (report 'smoothquant')
    mixed_precision: Optional[dict] = None   # the mixed-precision pass's result (report 'mixed_precision')
    passes: list = field(default_factory=list)   # the pipeline being run (calibration asks it what to observe)

    @property
    def warnings(self) -> list:
        """Warnings for the user (selectors, config rules or frozen encodings that match nothing)."""
        return self.settings.selection.warnings


class QuantPass(Pass):
    """A pass that runs on a QuantContext (`run(ctx)`), inside `qcompiler quantize`.

    `after`: for an optional pass (one not in the default pipeline), the pass it follows when a recipe names it
    (`--recipe bias-correction` runs it right after `assign-encodings`). `calibration_request(ctx)`: value name
    -> channel axis of the float activations whose per-channel means the pass needs (collected by `calibrate`
    in its one pass over the data).
    """

    requires: tuple = ("quant-context",)
    after: str = ""

    def run(self, ctx: QuantContext) -> PassResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def apply(self, model, context=None) -> PassResult:
        return self.run(context)

    def calibration_request(self, ctx: QuantContext) -> Dict[str, int]:
        return {}


@dataclass
class Outcome:
    """What the safety net did (the `safety-net` pass fills it; the report reads it)."""
    triggered: bool = False
    before_db: float = float("inf")
    after_db: float = float("inf")
    trials: int = 0
    samples: int = 0
    changed: List[dict] = field(default_factory=list)
    note: str = ""
    tried: List[dict] = field(default_factory=list)    # region and weight trials: what, SQNR, kept or not
    quantizer_search_db: Optional[float] = None        # what the quantizer-by-quantizer search reached (estimate)
    kept: Dict[str, str] = field(default_factory=dict)  # phase ("region", "weights") -> what it kept
    summary: str = ""                                  # one line: what was kept and why
    seconds_budget: float = 0.0                        # the wall-time last resort (safety_net/budget.py)
    runs_budget: int = 0                               # the budget of sample runs (safety_net/budget.py)
    runs: int = 0                                      # sample runs spent
    executor: str = "serial"                           # what ran the independent trials (safety_net/parallel.py)
    parallel_trials: int = 0                           # trials it ran (with those past a batch's first hit)
