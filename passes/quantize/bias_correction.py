"""`bias-correction` (optional, `--recipe bias-correction` or `--bias-correction`): empirical bias correction of
Conv/Gemm weights (qcompiler/quant/core/qdq.correct_biases; Nagel et al. 2019). Off by default: on ppocr_cls it helped
weight-only quantization (49 -> 56 dB output SQNR) but hurt W8A8 (43 -> 32 dB).

Inside If/Loop/Scan bodies too: the per-channel input means of a body Conv/Gemm are observed through
body_probe.py like any body value. An input defined in a body is asked for with a negative channel axis, so the
same axis holds whether the probe hands calibration the value itself (If branches) or its iterations stacked on a
new leading axis (inside one Loop/Scan); an input the probe can only give as per-run [min, max] (nested loops,
changing or large shapes: `BodyCalibration.minmax`) has no mean, and its node is left uncorrected (counted in the
note). A bias shared with another reader (an outer initializer both If branches read) is copied on write into
the corrected node's own graph.
"""
from __future__ import annotations

from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.core.qdq import correct_biases


def _channel_inputs(model) -> dict:
    """{input value name: channel axis} of every Conv and plain Gemm with a constant weight, in the main graph and
    every body: a superset of the nodes the plan will quantize (the plan does not exist yet when calibration
    collects the means). Main-graph values keep the axis as written (1 for Conv); a value defined in a body gets
    it counted from the end (module docstring)."""
    out = {}
    for g in model.graphs():
        for n in g.nodes:
            if len(n.inputs) < 2 or n.inputs[0] is None or n.inputs[1] is None:
                continue
            w = n.inputs[1].const_value()
            if w is None:
                continue
            x = n.inputs[0]
            body = x.graph is not model.graph
            if n.op_type == "Conv" and w.ndim >= 3:
                out[x.name] = -(w.ndim - 1) if body else 1
            elif n.op_type == "Gemm" and not n.attr("transA", 0) and n.attr("alpha", 1.0) == 1.0:
                out[x.name] = -1
    return out


@register_pass
class BiasCorrection(QuantPass):
    name = "bias-correction"
    description = "empirical bias correction: b' = b - (W_q - W)·E[x] on Conv/Gemm (per-channel input means)"
    preserves_semantics = False
    requires = ("quant-context", "statistics", "encodings")
    after = "assign-encodings"

    def calibration_request(self, ctx) -> dict:
        return _channel_inputs(ctx.model)

    def run(self, ctx) -> PassResult:
        cal = ctx.calibration
        coarse = set(cal.bodies.minmax) if cal.bodies is not None else set()   # [min, max] per run: no mean

        def mean(name):
            return None if name in coarse else cal.channel_mean(name)
        names: list = []
        n = correct_biases(ctx.model, ctx.plan, mean, names)
        inside = sum(1 for x in names if ctx.plan.nodes[x].graph is not ctx.model.graph)
        if n:
            ctx.notes.append(f"bias correction on {n} Conv/Gemm nodes" + (f" ({inside} inside If/Loop/Scan bodies)"
                                                                         if inside else ""))
        skipped = sorted({x.name for g in ctx.model.graphs() if g is not ctx.model.graph for node in g.nodes
                          if node.op_type in ("Conv", "Gemm") for x in node.inputs[:1] if x is not None
                          and x.name in coarse})
        if skipped:
            ctx.notes.append(f"bias correction skipped {len(skipped)} body Conv/Gemm inputs observed as per-run "
                             f"min/max only (no per-channel mean): {', '.join(repr(s[:40]) for s in skipped[:4])}")
        return PassResult(n > 0, {"corrected": n, "corrected_in_bodies": inside})
