"""The quantization pipeline: the default list of pass names, recipes and the one runner.

    initializers-as-constants, inline-functions, constant-to-initializer, upcast-float16, fold-batchnorm,
    simplify-shape-of, canonicalize, fold-weight-layout   (preparation; what exporters leave, see tests/quant/exporter_models.py)
    convert-opset        the output opset, chosen before the pipeline (qcompiler/quant/core/opset.py)
    fuse-hardswish       decomposed HardSwish becomes one op at opset >= 14 (after convert-opset)
    split-outlier-rows   a per-tensor MatMul weight's few outlier rows become a second MatMul (exact in float)
    calibrate            one streaming pass over the calibration data
    place                the plan: what each value and weight use becomes (quant/placement/)
    assign-encodings     scales and zero points from the statistics (and per-block weight grids)
    insert-qdq           the plan written into the model as Q/DQ (qcompiler/quant/core/qdq.py)
    float16-islands      nodes a config marks `precision: float16` run in fp16 between Casts
    measure-sqnr         per-output SQNR against float on the kept calibration samples
    latency-search       take out Q/DQ pairs between float kernels under an SQNR floor (--optimize)
    safety-net           below the SQNR floor: keep float or widen the quantizers that break an output

`--recipe a,b` adds optional passes, each right after the pass named by its `after` (docs/quantization.md's table): after
convert-opset fold-conv-bias-add; after fuse-hardswish cle, smoothquant; after calibrate mirror-untaken-branches;
after place load-encodings, mixed-precision; after assign-encodings bias-correction, seq-mse, adaround; after
safety-net measure-latency. A flag that asks for a pass adds it the same way (SWITCHES, from the `enables` of
qcompiler/quant/core/switches.py); `--pipeline` replaces the whole list for experts. Third-party passes join through the
`qcompiler.passes` entry point (passmanager/registry.py) and work the same way.
"""
from __future__ import annotations

from typing import Iterable, List, Sequence

from qcompiler.errors import PipelineError
from qcompiler.passmanager import PassManager, get_pass
from qcompiler.quant.core.switches import pass_switches, wanted_passes

PREPARE_PASSES = ("initializers-as-constants", "inline-functions", "constant-to-initializer", "upcast-float16",
                  "fold-batchnorm", "simplify-shape-of", "canonicalize", "fold-weight-layout")
DEFAULT_PIPELINE = PREPARE_PASSES + ("convert-opset", "fuse-hardswish", "split-outlier-rows", "calibrate", "place", "assign-encodings",
                                     "insert-qdq", "narrow-float-weights", "float16-islands", "measure-sqnr",
                                     "latency-search",
                                     "safety-net")
# weight-only (`--weight-only`): activations stay float, so no calibration pass and no placement; the float
# outputs for the report come from `reference-outputs` (nothing without calibration data)
WEIGHT_ONLY_PREPARE = ("initializers-as-constants", "inline-functions", "constant-to-initializer", "canonicalize")
WEIGHT_ONLY_PIPELINE = WEIGHT_ONLY_PREPARE + ("convert-opset", "reference-outputs", "plan-weights", "weight-grid",
                                              "measure-head-bits", "check-accuracy-level", "write-weights", "measure-sqnr")
START_FACTS = ("model", "quant-context")
# a switch's pass that weight-only runs as another (activations float: the plan differs)
WEIGHT_ONLY_VARIANTS = {"mixed-precision": "weight-mixed-precision"}
# what to use instead of a pass that has no place in the weight-only pipeline
WEIGHT_ONLY_INSTEAD = {
    "seq-mse": "--recipe gptq (minimises each layer's output error on the calibration data, weight-only)",
    "adaround": "--recipe gptq (the weight-only rounding that reads calibration data)",
    "smoothquant": "--recipe awq (per-channel scales folded into the op before, for weight-only grids)",
    "cle": "--recipe awq (per-channel scales folded into the op before, for weight-only grids)",
    "bias-correction": "--recipe gptq",
}


def _names(spec) -> List[str]:
    if spec is None:
        return []
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    return [s.strip() if isinstance(s, str) else s for s in items if not isinstance(s, str) or s.strip()]


def build_pipeline(recipe=None, pipeline=None, base: Sequence[str] = DEFAULT_PIPELINE) -> list:
    """The pass names to run: `pipeline` as given, else `base` (the default list) with each `recipe` pass
    inserted after its `after` pass (in recipe order when two follow the same pass). Unknown names raise
    UnknownPassError."""
    if pipeline is not None:
        names = _names(pipeline)
        if recipe:
            raise PipelineError("--recipe adds passes to the default pipeline; with --pipeline, list them in it")
        return names
    names = list(base)
    inserted: dict = {}
    for name in _names(recipe):
        if name in names:
            continue   # already in the pipeline (named twice, or a default pass)
        p = get_pass(name) if isinstance(name, str) else name
        anchors = getattr(p, "after", "")
        # `after` names one pass, or several (the first present wins: a pass that fits both pipelines)
        anchor = next((a for a in ((anchors,) if isinstance(anchors, str) else anchors) if a in names), "")
        if not anchor:
            if base is WEIGHT_ONLY_PIPELINE and p.name in WEIGHT_ONLY_INSTEAD:
                raise PipelineError(f"pass '{p.name}' has no place in the weight-only pipeline (activations stay "
                                    f"float); use {WEIGHT_ONLY_INSTEAD[p.name]}")
            which = "weight-only" if base is WEIGHT_ONLY_PIPELINE else "default"
            raise PipelineError(f"pass '{p.name}' has no place in the {which} pipeline (it names no `after` "
                                f"pass of it); list the whole order with --pipeline")
        at = names.index(inserted.get(anchor, anchor)) + 1
        names.insert(at, name)
        inserted[anchor] = name
    return names


def quantization_manager(names: Sequence, instrumentations: Iterable = ()):
    """The PassManager of a quantization pipeline: unknown names and broken contracts (passmanager.facts) raise
    here, before any model is read."""
    return PassManager(list(names), instrumentations, start=START_FACTS)


def run_quantization(ctx, pm) -> list:
    """Run `pm`'s passes on the context's model; returns [(pass, PassResult)]."""
    ctx.passes = pm.passes
    return pm.run(ctx.model, ctx)


SWITCHES = pass_switches()   # keyword -> the pass it asks for (the `enables` of qcompiler/quant/core/switches.py's table)


def pipeline_for(recipe=None, pipeline=None, **switches) -> list:
    """The pass names for `quantize`'s switches: a switch that asks for a pass (`bias_correction=True`,
    `load_encodings=FILE`, `untaken_branches="mirror"`; the table's `enabled`) adds it like a recipe entry; a
    full `pipeline` must already name it. Switches that ask for no pass are ignored."""
    wanted = wanted_passes(switches)
    base = WEIGHT_ONLY_PIPELINE if switches.get("weight_only") else DEFAULT_PIPELINE
    if base is WEIGHT_ONLY_PIPELINE:
        wanted = [WEIGHT_ONLY_VARIANTS.get(n, n) for n in wanted]
    if pipeline is not None:
        names = build_pipeline(recipe, pipeline)
        for name in wanted:
            if name not in names:
                raise PipelineError(f"the pipeline has no '{name}' pass, which "
                                    f"{[k for k, v in SWITCHES.items() if v == name][0]} asks for: add it")
        return names
    return build_pipeline(_names(recipe) + [n for n in wanted if n not in _names(recipe)], None, base)
