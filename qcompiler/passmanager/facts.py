"""The facts that pass contracts name (`Pass.requires` / `Pass.ensures`), each with what it means.

A pipeline is checked against them before any pass runs (`check_contracts`): a pass whose requirement no earlier
pass ensures (and the start does not provide) is one line naming the pass, the fact and the passes that would
provide it. One table, so a misspelt fact in a plug-in's contract is an error too, not a silent pass.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from qcompiler.errors import PipelineError
from qcompiler.passmanager.registry import available_passes

FACTS = {
    "model": "a model to work on",
    "canonical-names": "every node has a unique, non-empty name (plans and reports key on node names)",
    "quant-context": "a quantization context: settings, profile, calibration data (made by `qcompiler quantize`)",
    "output-opset": "the model is at the output opset chosen for its Q/DQ",
    "statistics": "calibration statistics of the float model's activations",
    "plan": "a quantization plan: what each value and weight use becomes",
    "encodings": "an encoding for every quantized value of the plan",
    "qdq": "QuantizeLinear/DequantizeLinear nodes written into the model from the plan",
    "output-errors": "per-output SQNR and max abs error of the quantized model on the calibration samples",
    "float-outputs": "the float model's graph outputs kept on a few calibration samples (the report's reference)",
    "quantized": "the model holds its quantized form (Q/DQ pairs, or weight-only narrow weights)",
    "weight-plan": "a weight-only plan: which weights become narrow blocks, read by which nodes",
    "weight-grids": "a block grid for every weight of the weight-only plan",
    "weights-written": "the weight-only grids written into the model in the target's form",
}

# what a plain `qcompiler run` starts with; `qcompiler quantize` adds "quant-context"
START_FACTS = ("model",)


def check_contracts(passes: Sequence, start: Iterable[str] = START_FACTS) -> None:
    """Raise PipelineError (one line) on the first pass whose `requires` no earlier pass or the start ensures."""
    have = set(start)
    for i, p in enumerate(passes):
        for fact in tuple(p.requires) + tuple(p.ensures):
            if fact not in FACTS:
                raise PipelineError(f"pass '{p.name}' names an unknown fact '{fact}' in its contract "
                                    f"(known: {', '.join(FACTS)})")
        missing = [f for f in p.requires if f not in have]
        if missing:
            fact = missing[0]
            if fact == "quant-context":
                raise PipelineError(f"pass '{p.name}' is a quantization pass: it runs inside `qcompiler quantize` "
                                    f"(--recipe / --pipeline), not `qcompiler run`")
            providers = [n for n, cls in available_passes().items() if fact in getattr(cls, "ensures", ())]
            hint = f"run {' or '.join(repr(n) for n in providers)} before it" if providers else \
                "no registered pass provides it"
            before = ", ".join(q.name for q in passes[:i]) or "none"
            raise PipelineError(f"pass '{p.name}' requires {fact} ({FACTS[fact]}), which no pass before it "
                                f"ensures (before it: {before}): {hint}")
        have.update(p.ensures)
