"""`measure-latency` (optional: `--measure-latency` or `--recipe measure-latency`): the quantized model's latency
against the float model's in onnxruntime (default session options, one thread, interleaved runs, medians;
qcompiler/quant/runtime/latency.py) on the first calibration sample, and which nodes run on integer kernels in
onnxruntime's optimized graph and why the others do not (qcompiler/quant/runtime/kernels.py, the ort_cpu fusion table).
"""
from __future__ import annotations

import os

from qcompiler.onnx_io import load_model
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.runtime.kernels import kernel_report
from qcompiler.quant.runtime.latency import measure_latency


def float_model_of(source):
    """The float model as the caller gave it (path, ModelProto or IR Model), never the pipeline's copy."""
    if isinstance(source, (str, os.PathLike)):
        return load_model(os.fspath(source))
    return source


@register_pass
class MeasureLatency(QuantPass):
    name = "measure-latency"
    description = "quantized vs float latency in onnxruntime (interleaved), and which nodes run on integer kernels"
    requires = ("quant-context", "statistics", "qdq")
    after = ("safety-net", "measure-sqnr")

    def run(self, ctx) -> PassResult:
        kept = ctx.calibration.kept
        feed = dict(kept[0][0]) if kept else None
        lat = measure_latency(float_model_of(ctx.source), ctx.model, feed=feed)
        ctx.latency = lat.to_dict()
        kr = kernel_report(ctx.model)
        reasons = kr.reasons()
        ctx.kernels = {"integer_nodes": kr.integer_count, "float_nodes": len(kr.float_nodes),
                       "runtime_qdq": dict(kr.runtime_qdq),
                       "float_reasons": dict(reasons.most_common()),
                       "nodes": {n.node: {"op": n.op, "kernel": n.kernel, "integer": n.integer,
                                          **({"reason": n.reason} if n.reason else {})} for n in kr.nodes}}
        return PassResult(False, {"float_ms": round(lat.float_ms, 3), "quantized_ms": round(lat.quant_ms, 3),
                                  "ratio": round(lat.ratio, 3), "integer_nodes": kr.integer_count,
                                  "float_nodes": len(kr.float_nodes)})
