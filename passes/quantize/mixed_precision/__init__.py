"""`mixed-precision` (optional: `--max-drop X%`, `quantize(..., max_drop=0.01, metric=callable)`): the cheapest
per-layer precision (W4A8, W8A8, W8A16, W16A16, float16, float) whose measured drop stays within the budget
(passes/quantize/mixed_precision/search/: the layers, the candidates, how the drop is defined, the search).

It runs after `place` (the statistics and the user's plan are there) and before `assign-encodings`: it measures
each layer's sensitivity, chooses the assignment, then rebuilds the plan with one config rule per chosen
candidate, so every later pass (encodings, Q/DQ, fp16 islands, SQNR, safety net) works on the mixed plan.
The evaluations run through qcompiler/quant/runtime/executor.py: on Ray with `--ray`, else local processes, except for
a model under SMALL_MODEL_BYTES of weights (in this process).
"""
from __future__ import annotations

from qcompiler.passes.quantize.mixed_precision.search import Search, apply_result

from qcompiler.errors import ConfigError
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.progress import bar
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.runtime.executor import run_executor
from qcompiler.quant.runtime.memory import weight_bytes

# the sensitivity table runs on this many of the kept calibration samples (the whole-model measurements on all
# of them): the table only ranks the layers, and minilm's has 180 entries
SENSITIVITY_SAMPLES = 8


@register_pass
class MixedPrecision(QuantPass):
    name = "mixed-precision"
    description = "per-layer bits (W4A8 .. float) chosen from each layer's sensitivity within --max-drop"
    preserves_semantics = False
    requires = ("quant-context", "plan", "statistics")
    after = "place"

    def run(self, ctx) -> PassResult:
        s = ctx.settings
        if s.max_drop is None:
            raise ConfigError("pass 'mixed-precision' needs a budget: pass --max-drop X% (API: max_drop=0.01)")
        if not ctx.calibration.kept:
            raise ConfigError("mixed-precision needs calibration samples kept for the report (none were kept)")
        executor = s.executor if s.executor is not None else run_executor(s.ray, weight_bytes(ctx.model))
        search = Search(ctx, s.max_drop, s.metric, executor,
                        sensitivity_samples=SENSITIVITY_SAMPLES)
        try:
            with bar("mixed precision", None, s.progress, unit="model") as shown:
                search.on_model = shown.update
                res = search.run()
            search.reference(res, "W8A8") if "W8A8" in res.candidates else None
            apply_result(ctx, search, res)
        finally:
            search.close()
            if s.executor is None:
                executor.close()
        ctx.mixed_precision = res.to_dict()
        chosen = {}
        for c in res.assignment.values():
            chosen[c] = chosen.get(c, 0) + 1
        ctx.notes.append(f"mixed precision within {100 * res.budget:.3g} %: " +
                         (", ".join(f"{n} {c}" for c, n in sorted(chosen.items())) or "no layers") +
                         f"; measured drop {100 * res.drop:.3g} % on {len(ctx.calibration.kept)} calibration "
                         f"samples ({res.evaluations} evaluations, {res.seconds.get('total', 0):.1f} s)")
        ctx.notes.extend(res.notes)
        return PassResult(True, {"layers": len(res.layers), "evaluations": res.evaluations,
                                 "drop": round(res.drop, 6), "weight_bytes": res.weight_bytes})
