"""fuse-hardswish: rewrite a decomposed HardSwish into one HardSwish op (opset >= 14).

Exporters write HardSwish as x·Relu6(x+3)/6 (PaddlePaddle: Add(+3) → Clip(0,6) → Mul(x) → Div(6); Relu6 as
Clip with attributes before opset 11, Min/Max, or Min(Relu, 6); /6 as ·(1/6); the Mul and Div in either order)
or as x·HardSigmoid(x; α=1/6, β=½). The pattern library's `hardswish` group finds them (patterns/activations.py),
with the exclusive-use rule: no interior value is read outside the match or is a graph output.

Why (FINDINGS §1 rule 2): onnxruntime fuses a HardSwish op into the NCHWc Conv before it, while the
decomposition runs as four float elementwise passes; ppocr_cls's float model alone runs 0.80× with the ops.

The pattern matches constants with rtol 1e-3 (it recognises); this pass rewrites, so `check` re-reads every
structural constant at 1e-6 relative (3, 6, 1/6, Clip's 0 and 6, HardSigmoid's 1/6 and ½) and refuses a
constant that could broadcast x to a higher rank. Below opset 14 (no HardSwish) the decomposition stays and
annotate-supergroups keeps it one unit.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from qcompiler.passes.supergroups import replace_match
from qcompiler.patterns import find_matches
from qcompiler.patterns.activations import clip_bounds

from qcompiler.passmanager import Pass, PassResult, register_pass

HARDSWISH_OPSET = 14
RTOL = 1e-6
# pattern constant name -> the value it must hold
_EXPECTED = {"three": 3.0, "six": 6.0, "sixth": 1.0 / 6.0, "relu6_min": 0.0, "relu6_max": 6.0}
_FLOAT_TYPES = (1, 10, 11)   # FLOAT, FLOAT16, DOUBLE: HardSwish-14's T


def _close(got: float, want: float) -> bool:
    return abs(got - want) <= RTOL * abs(want) if want else abs(got) <= 1e-12


def check(match) -> Optional[str]:
    """None if the match is exactly HardSwish (constants within 1e-6 relative, x float, no broadcast widening),
    else the reason it stays decomposed."""
    x = match.get("x")
    if x is None:
        return "no input bound"
    if x.dtype is not None and x.dtype not in _FLOAT_TYPES:
        return f"input '{x.name[:80]}' is not float (element type {x.dtype})"
    rank = len(x.shape) if x.shape is not None else None
    for name, v in match.constants.items():
        arr = v.const_value()
        if arr is None:
            return f"constant '{name}' is not a constant"
        if arr.size != 1:
            return f"constant '{name}' has {arr.size} elements, not 1"
        if arr.ndim > (rank if rank is not None else 0):
            return f"constant '{name}' of rank {arr.ndim} could broadcast '{x.name[:80]}' to a higher rank"
        want = _EXPECTED.get(name)
        if want is not None and not _close(float(np.ravel(arr)[0]), want):
            return f"constant '{name}' is {float(np.ravel(arr)[0])!r}, not {want!r} within {RTOL:g}"
    clip = match.get("relu6")
    if clip is not None and getattr(clip, "op_type", None) == "Clip":
        b = clip_bounds(clip)
        if b is None or not _close(b[0], 0.0) or not _close(b[1], 6.0):
            return f"Clip '{clip.name[:80]}' bounds {b} are not (0, 6)"
        for v in clip.inputs[1:]:
            arr = None if v is None else v.const_value()
            if arr is not None and arr.ndim > (rank if rank is not None else 0):
                return f"Clip bound '{v.name[:80]}' of rank {arr.ndim} could widen the output"
    hs = match.get("hardsigmoid")
    if hs is not None:
        alpha, beta = float(hs.attr("alpha", 0.2)), float(hs.attr("beta", 0.5))
        if not _close(alpha, 1.0 / 6.0) or not _close(beta, 0.5):
            return f"HardSigmoid alpha={alpha!r}, beta={beta!r}, not 1/6, 0.5 within {RTOL:g}"
    return None


@register_pass
class FuseHardSwish(Pass):
    name = "fuse-hardswish"
    description = "rewrite decomposed HardSwish (x·Relu6(x+3)/6, x·HardSigmoid(x)) into HardSwish (opset >= 14)"
    preserves_semantics = True

    def run(self, model) -> PassResult:
        matches = find_matches(model.graph, "hardswish")
        if model.opset < HARDSWISH_OPSET:
            return PassResult(False, {"fused": 0, "kept": len(matches),
                                      "reason": f"opset {model.opset} < {HARDSWISH_OPSET} has no HardSwish; "
                                                f"kept as supergroups"} if matches else {"fused": 0})
        fused, kept = 0, {}
        for m in matches:
            why = check(m)
            if why:
                kept[m.root.name] = why
                continue
            replace_match(m.root.graph, m, "HardSwish", [m.get("x")], {}, name=m.root.name + "_hardswish")
            fused += 1
        return PassResult(fused > 0, {"fused": fused, "kept": len(kept), "kept_reasons": kept})
