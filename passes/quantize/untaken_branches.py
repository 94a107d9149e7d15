"""`mirror-untaken-branches` (optional: `--untaken-branches mirror`, or `--recipe mirror-untaken-branches`): an If
branch the calibration data never took is calibrated from the other branch where the values are the same tensors.

By default (`--untaken-branches float`) a branch calibration never took keeps its activations float (nothing was
observed there) and the report's notes name it. With this pass, each value of the idle branch computed exactly
as a value of the branch that ran (same op, domain and attributes, inputs that are the same captured names or
values already paired: body_probe.mirrored_values) is given that twin's statistics, so placement quantizes it on
the twin's grid; the other values of the idle branch stay float, and the notes say per branch how many values
were calibrated this way. Both branches' twins are observed during calibration (`calibration_request`), since
which branch goes idle is only known afterwards; they are If-branch values, observed like main-graph ones.

Use it when the calibration set cannot reach a branch the deployment will (a sample-rate switch, a batch-size
special case): the twin's range is exact for the shared prefix of the two branches, and nothing is guessed for
what differs.
"""
from __future__ import annotations

from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.calibration.body_probe import (
    has_bodies,
    mirror_candidates,
    mirror_untaken,
)
from qcompiler.quant.core.context import QuantPass


@register_pass
class MirrorUntakenBranches(QuantPass):
    name = "mirror-untaken-branches"
    description = "calibrate an If branch calibration never took from the other branch's same tensors"
    requires = ("quant-context", "statistics")
    after = "calibrate"

    def calibration_request(self, ctx) -> dict:
        """The twins, each with axis None: observe the value, no per-channel means (calibrate sums only for an
        axis). A name another pass asks means for is left to it (the requests are merged into one dict)."""
        if not has_bodies(ctx.model):
            return {}
        others: dict = {}
        for p in ctx.passes:
            if p is not self and hasattr(p, "calibration_request"):
                others.update(p.calibration_request(ctx))
        return {name: None for name in mirror_candidates(ctx.model) if name not in others}

    def run(self, ctx) -> PassResult:
        cal = ctx.calibration
        if cal is None or cal.bodies is None:
            return PassResult(False, {"mirrored": 0})
        done = mirror_untaken(cal, ctx.model)
        tally = cal.bodies.tally
        left = set(tally.report())   # calibrate's "stays float" lines: this pass says what it did instead
        ctx.notes[:] = [n for n in ctx.notes if n not in left]
        notes = tally.untaken_notes("mirror", done, ctx.model)
        ctx.notes.extend(notes)
        return PassResult(False, {"mirrored": len(done), "untaken_branches": len(notes)})
