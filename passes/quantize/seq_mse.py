"""`seq-mse` (optional, `--recipe seq-mse`): Sequential MSE weight ranges for MatMul/Gemm (issue 15 item 2).

Runs after `assign-encodings` and before `insert-qdq`. Layer by layer in graph order, each MatMul/Gemm whose
weight the plan quantizes gets, per output channel (per block with `--block-size`, one for a per-tensor grid),
the weight scale among 20 candidates (0.5..1.0 times the assigned one) that minimises the layer output's squared
error on the calibration data, its input taken from the model with the weights of the layers before it already
quantized. The plan's weight encodings are rewritten; nothing else changes. Best where weights are narrow:

    qcompiler quantize model.onnx --calib calib.npz -o model.int4.onnx \\
        --weight-bits 4 --block-size 32 --act-bits 16 --recipe seq-mse

How the inputs are captured: with onnxruntime, not numpy. Feeding each layer the outputs of the quantized layers
before it means running everything between them (LayerNorm, Softmax, GELU, reshapes), which only the model can do;
so one session of the float model takes every optimised weight as an overridable input, and each level of
layers (qcompiler/quant/layer_inputs.py: Q, K and V together) costs one pass over at most 128 samples with the
chosen fake-quantized weights fed in. The search itself is numpy (qcompiler/quant/seq_mse.py): all candidates at
once through the input's Gram matrix or a factor of it; a 4096 x 4096 MatMul takes about a second.

The report's `layers` entry of each optimised node gets `seq_mse`: mean and least fraction chosen, how many
channels (or blocks) changed, and the layer output MSE on the captured rows under the assigned grid and under the
chosen one (never larger: f = 1 is a candidate). Skipped nodes (shared, frozen or non-float32 weights, Gemm
with transA) are listed in the pass's stats. Conv is not handled (its encodings stay as assigned): the stats'
`skipped_op_types` and a note name each op type left alone and why.

Order with bias correction: `--recipe seq-mse,bias-correction` (bias correction must see the final grid);
named the other way round, the biases are corrected for the grid seq-mse then replaces, and a note says so.
"""
from __future__ import annotations

from qcompiler.errors import DataError
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.context import QuantPass


def _samples(ctx):
    """The feeds calibration kept (no file read again) when they are all the samples the capture would use;
    else the sample set, read again once per level (a reader that cannot rewind: the kept ones, with a note)."""
    from qcompiler.quant.layer_inputs import MAX_SAMPLES
    cal = ctx.calibration
    kept = [feed for feed, _ in cal.kept] if cal is not None else []
    if kept and len(kept) >= min(cal.samples, MAX_SAMPLES):
        return kept
    try:
        it = iter(ctx.samples)
        next(it, None)              # a reader read once without rewind() refuses here, not mid-run
        it.close()
    except DataError:
        if not kept:
            raise
        ctx.notes.append(f"seq-mse used the {len(kept)} calibration samples kept in memory: the reader cannot be "
                         f"read again (no rewind())")
        return kept
    return ctx.samples


@register_pass
class SequentialMse(QuantPass):
    name = "seq-mse"
    description = "Sequential MSE: per-channel/per-block MatMul/Gemm weight ranges minimising each layer's " \
                  "output error, layer by layer on calibration data"
    preserves_semantics = False
    requires = ("quant-context", "statistics", "encodings")
    after = "assign-encodings"

    def run(self, ctx) -> PassResult:
        from qcompiler.quant.seq_mse import run_seq_mse
        names = [p.name for p in ctx.passes]
        if "bias-correction" in names and self.name in names \
                and names.index("bias-correction") < names.index(self.name):
            ctx.notes.append("seq-mse ran after bias-correction: the biases were corrected for the grids "
                             "seq-mse replaced (name seq-mse first in --recipe)")
        results, skipped, capture_s = run_seq_mse(ctx.model, ctx.plan, _samples(ctx), progress=ctx.settings.progress)
        for r in results:
            ctx.layers.setdefault(r.name, {})["seq_mse"] = r.report()
        if results:
            before = sum(r.mse_before for r in results)
            after = sum(r.mse_after for r in results)
            ctx.notes.append(f"seq-mse on {len(results)} MatMul/Gemm layers: summed layer output MSE "
                             f"{before:.4g} -> {after:.4g}; {sum(r.changed for r in results)} of "
                             f"{sum(r.groups for r in results)} channel/block ranges narrowed")
        from qcompiler.quant.layer_inputs import LAYER_OPS
        from qcompiler.quant.report import skipped_op_types
        other = skipped_op_types(ctx.model, ctx.plan, LAYER_OPS, self.name)
        if other:
            ctx.notes.append("seq-mse left alone: " + "; ".join(f"{op} ({why})" for op, why in other.items()))
        stats = {"layers": len(results), "skipped": dict(list(skipped.items())[:20]), "skipped_op_types": other,
                 "capture_seconds": round(capture_s, 3),
                 "search_seconds": round(sum(r.seconds for r in results), 3)}
        return PassResult(bool(results), stats)
