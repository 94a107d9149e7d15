"""The quantization report: every quantized value's encoding, per-output SQNR against float, and every value left
float with its reason (issue 3 item 7; field notes §1 and §6 ask that nothing is left float silently)."""
from __future__ import annotations

from typing import Dict

import numpy as np

from .encoding import Encoding


def sqnr_db(ref, got) -> float:
    """10·log10(Σref² / Σ(ref-got)²); inf when identical."""
    ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
    noise = float(np.sum((ref - got) ** 2))
    if noise == 0.0:
        return float("inf")
    signal = float(np.sum(ref ** 2))
    return float(10 * np.log10(signal / noise)) if signal > 0 else float("-inf")


def encoding_summary(enc: Encoding) -> dict:
    """A JSON-friendly view of an encoding (scalars per tensor, lists per channel)."""
    def plain(a):
        a = np.asarray(a)
        return a.item() if a.ndim == 0 or a.size == 1 else a.tolist()
    d = {"bits": int(enc.bits), "signed": bool(enc.signed), "symmetric": bool(enc.symmetric),
         "scale": plain(np.asarray(enc.scale, np.float64)), "zero_point": plain(enc.zero_point)}
    if enc.per_channel:
        d["axis"] = int(enc.axis)
        lo, hi = np.asarray(enc.min), np.asarray(enc.max)
        d["min"], d["max"] = float(lo.min()), float(hi.max())
    else:
        d["min"], d["max"] = float(np.asarray(enc.min)), float(np.asarray(enc.max))
    if enc.meta.get("range_bits"):
        d["range_bits"] = int(enc.meta["range_bits"])
    if enc.frozen:
        d["frozen"] = True
    return d


def output_sqnr(quant_proto, kept: list) -> Dict[str, float]:
    """Per graph output, SQNR of the quantized model against the float outputs kept during calibration."""
    if not kept:
        return {}
    from .calibrate import make_session
    sess = make_session(quant_proto)
    names = [o.name for o in sess.get_outputs()]
    refs: Dict[str, list] = {n: [] for n in names}
    gots: Dict[str, list] = {n: [] for n in names}
    for feed, ref in kept:
        outs = sess.run(names, feed)
        for n, a in zip(names, outs):
            if n in ref and np.issubdtype(np.asarray(ref[n]).dtype, np.floating):
                refs[n].append(np.asarray(ref[n]).ravel())
                gots[n].append(np.asarray(a).ravel())
    return {n: sqnr_db(np.concatenate(refs[n]), np.concatenate(gots[n])) for n in names if refs[n]}


def build_report(plan, activations: Dict[str, Encoding], params: Dict[str, Encoding], sqnr: Dict[str, float],
                 calib, timings: dict, target: str, scheme: str, notes=()) -> dict:
    """The report dict (JSON-serialisable)."""
    floats = {}
    for name, spec in plan.values.items():
        if spec.keep_float:
            floats[name] = spec.reason
    for (node, slot), spec in plan.uses.items():
        if spec.keep_float and spec.kind in ("weight", "bias"):
            floats[f"{node}:input{slot}"] = f"{spec.kind}: {spec.reason}"
    dtypes = plan.dtypes or calib.dtypes
    integers = sorted(n for n, dt in dtypes.items() if not np.issubdtype(dt, np.floating))
    return {
        "target": target, "scheme": scheme, "calibration_samples": calib.samples,
        "output_sqnr_db": {k: (round(v, 2) if np.isfinite(v) else v) for k, v in sqnr.items()},
        "sqnr_samples": len(calib.kept),
        "quantized_activations": {n: encoding_summary(e) for n, e in activations.items()},
        "quantized_params": {n: encoding_summary(e) for n, e in params.items()},
        "left_float": floats,
        "widened": {n: f"{s.bits} bits: {s.widened}" for n, s in plan.values.items()
                    if s.widened and not s.keep_float},
        "integer_tensors_never_quantized": integers,
        "supergroups": [{"kind": s.kind, "nodes": s.nodes} for s in plan.supergroups
                        if "+" not in s.kind],
        "fused_pairs": sum(1 for s in plan.supergroups if "+" in s.kind),
        "tie_groups": [m for m in plan.tie_groups().values()],
        "counts": {"activations": len(activations), "params": len(params), "left_float": len(floats),
                   "widened": sum(1 for s in plan.values.values() if s.widened and not s.keep_float)},
        "seconds": {k: round(v, 3) for k, v in timings.items()},
        "notes": list(notes),
    }


def format_summary(report: dict) -> str:
    """A few human lines for the CLI."""
    c = report["counts"]
    lines = [f"quantized {c['activations']} activations and {c['params']} params for {report['target']} "
             f"({report['scheme']}, {report['calibration_samples']} samples); {c['left_float']} values left float"]
    if c.get("widened"):
        lines.append(f"  {c['widened']} activations widened to 16 bits (an 8-bit grid would give < 30 dB; "
                     f"see report 'widened')")
    for n, s in report["output_sqnr_db"].items():
        lines.append(f"  output '{n}': SQNR {s} dB")
    reasons: Dict[str, int] = {}
    for r in report["left_float"].values():
        key = r.split(":")[0] if r.startswith("inside") else r[:70]
        reasons[key] = reasons.get(key, 0) + 1
    for r, k in sorted(reasons.items(), key=lambda t: -t[1])[:8]:
        lines.append(f"  float x{k}: {r}")
    return "\n".join(lines)
