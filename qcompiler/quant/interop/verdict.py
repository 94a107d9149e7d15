"""The one-line verdict of a quantization: what share of the compute runs on integer kernels, the file against
float, and, when nothing is quantized, why and what to ask for instead.

A user who asked to quantize must see what they got: a run can end with every quantizer taken out (each integer
region too small to pay for its Q/DQ on ort_cpu) and the weights exact float, which is the right model for speed
but not what the word promised. The share is counted in multiply-accumulates per call of the weighted
Conv/MatMul/Gemm/LSTM/GRU/RNN (placement/cost.py, from the calibration statistics and the weights' dims;
plan.macs) and read
from the kernels onnxruntime really runs (runtime/kernels.py on its optimized graph), so it is only given for a
target whose fusion table describes onnxruntime; elsewhere the verdict says the file size alone.
"""
from __future__ import annotations

from typing import Dict, Optional

from qcompiler.errors import OnnxRuntimeError
from qcompiler.quant.runtime.kernels import kernel_report
from qcompiler.quant.runtime.memory import EXTRA_SESSION_MAX_BYTES, weight_bytes
from qcompiler.quant.targets.fusions import load_fusions

RUNTIME = "onnxruntime"   # the runtime kernel_report builds sessions of
NEGLIGIBLE = 0.01         # below this share of the compute on integer kernels, nothing runs quantized


def runs_on_onnxruntime(fusions: Optional[str]) -> bool:
    """Whether a target with this fusion table runs its models in onnxruntime (its kernels and latency can be
    measured on this machine)."""
    return bool(fusions) and load_fusions(fusions).runtime == RUNTIME


def integer_share(plan, model, fusions: Optional[str], kernels: Optional[dict] = None) -> Optional[dict]:
    """{"integer_macs", "macs", "share", "integer_nodes", "nodes"} over the nodes of `plan.macs`, judged integer
    or float by onnxruntime's optimized graph of `model` (or by `kernels`, measure-latency's rows, when given);
    None when the target's runtime is not onnxruntime or no weighted node has a known size."""
    macs: Dict[str, float] = getattr(plan, "macs", None) or {}
    if not macs or not runs_on_onnxruntime(fusions):
        return None
    table = load_fusions(fusions)
    if kernels is not None:
        integer = {name: row["integer"] for name, row in kernels.items()}
    elif weight_bytes(model) > EXTRA_SESSION_MAX_BYTES:   # --measure-latency reads it anyway
        return None
    else:
        try:
            integer = {row.node: row.integer for row in kernel_report(model, fusions=table).nodes}
        except OnnxRuntimeError:    # the model ran (measure-sqnr); an optimized copy onnxruntime will not
            return None             # write only costs the summary its share
    known = {n: m for n, m in macs.items() if n in integer}
    if not known:
        return None
    total = sum(known.values())
    on_int = sum(m for n, m in known.items() if integer[n])
    return {"integer_macs": int(on_int), "macs": int(total), "share": round(on_int / total, 4) if total else 0.0,
            "integer_nodes": sum(integer[n] for n in known), "nodes": len(known)}


def verdict_line(report: dict) -> str:
    """One line: the integer-kernel share, the file against float, and for a run that quantized nothing, the most
    common reason and the objectives or targets that would."""
    share, size = report.get("kernel_share"), report.get("size")
    parts = []
    if share:
        parts.append(f"{100 * share['share']:.0f}% of multiply-accumulates on integer kernels "
                     f"({share['integer_nodes']} of {share['nodes']} weighted nodes)")
    if size and size.get("float_bytes"):
        mb = 1 << 20
        parts.append(f"file {size['quantized_bytes'] / mb:.2f} MB against {size['float_bytes'] / mb:.2f} MB float "
                     f"({size['ratio']:.2f}x)")
    nothing = not report.get("weight_only") and (share["share"] < NEGLIGIBLE if share
                                                 else report["counts"].get("activations", 0) == 0)
    if nothing:
        reasons: Dict[str, int] = {}
        for r in report.get("left_float", {}).values():
            key = r.split(":")[0] if r.startswith("inside") else r
            reasons[key] = reasons.get(key, 0) + 1
        top = max(reasons.items(), key=lambda t: t[1])[0] if reasons else "nothing the target quantizes"
        asks = [a for a, o in (("--optimize size (weights int8: about a quarter of the file)", "size"),
                               ("--optimize accuracy (every quantizer kept)", "accuracy"))
                if report.get("optimize") != o]
        parts.append(f"nothing runs quantized on {report['target']} (most common reason: {top[:120]}); ask for "
                     f"{', '.join(asks)}, or a --target whose compiler reads the QDQ model (trt, qnn_htp)")
    return f"  verdict: {'; '.join(parts)}" if parts else ""
