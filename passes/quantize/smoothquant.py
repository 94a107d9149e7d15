"""`smoothquant` (optional, `--recipe smoothquant`): migrate activation outliers into the weights (Xiao et al.
2023, "SmoothQuant"; issue 15 item 1).

For an activation X [.., K] read only by MatMul/Gemm nodes with constant weights W [K, N] (Gemm: transB
respected), X := X / s and W rows := W * s leave the float model unchanged; with
s_k = max|X_k|^alpha / max|W_k,:|^(1 - alpha) (alpha = SMOOTHQUANT_ALPHA, clipped to [S_MIN, S_MAX]) the
channels of X that are 50x the rest shrink and the per-tensor activation grid fits the others. Several MatMuls
reading one X (Q/K/V) get one s, from the max over all their weights.

The 1/s is folded into X's producer, never into a new op: a LayerNormalization (gamma and beta), or the final
Mul(γ) / Add(β) by constants of a decomposed LayerNorm/RMSNorm (the pattern library's `layernorm`/`rmsnorm`
matches). Anything else is skipped with its reason in the stats (no explicit Mul in this version): a producer that
cannot absorb a scale (Relu, Softmax, a graph input, ...), an X read by anything but such MatMul/Gemm (a residual
Add), a weight read elsewhere (never written: the other reader would change) or a protected constant. γ/β are
written copy-on-write (`scale_folding.write_constant_input`). Main graph only.

max|X_k| comes from one onnxruntime pass over ctx.samples (calibrate.make_session with X as extra outputs); the
SampleSet rewinds for `calibrate` (a reader without rewind raises one DataError line there).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.context import QuantPass

from ..scale_folding import is_protected, write_constant_input

SMOOTHQUANT_ALPHA = 0.5
S_MIN, S_MAX = 1e-5, 1e5
SHAPE_ONLY = ("Shape", "Size")   # readers that see only X's shape, which the scale does not change
_FLOATS = (np.float16, np.float32, np.float64)


def _std(node) -> bool:
    return node.domain in ("", "ai.onnx")


def _const(v):
    a = None if v is None else v.const_value()
    return a if a is not None and a.dtype in _FLOATS else None


def _short(s: str) -> str:
    return s[:80]


def _reader_weight(node, x):
    """(weight value, axis of K in the weight) for a MatMul/Gemm reading `x` as its data input, or (None, reason)."""
    what = f"{node.op_type} '{_short(node.name)}'"
    if not _std(node) or node.op_type not in ("MatMul", "Gemm"):
        return None, f"'{_short(x.name)}' is read by {node.op_type} '{_short(node.name)}' (not MatMul/Gemm)"
    if len(node.inputs) < 2 or node.inputs[0] is not x or node.inputs[1] is x:
        return None, f"{what} reads '{_short(x.name)}' other than as its data input"
    if node.op_type == "Gemm" and int(node.attr("transA", 0)):
        return None, f"{what} has transA"
    w = node.inputs[1]
    arr = _const(w)
    if arr is None or arr.ndim != 2:
        return None, f"{what} weight is not a 2-D float constant"
    if w.graph is not node.graph:
        return None, f"{what} weight '{_short(w.name)}' is an outer-scope value"
    if is_protected(w):
        return None, f"{what} weight '{_short(w.name)}' is protected"
    axis = 1 if node.op_type == "Gemm" and int(node.attr("transB", 0)) else 0
    return (w, axis), None


def _norm_tails(graph) -> dict:
    """{final node of a decomposed LayerNorm/RMSNorm match: kind}."""
    from qcompiler.patterns import find_matches
    out = {}
    for kind in ("layernorm", "rmsnorm"):
        try:
            matches = find_matches(graph, kind, recurse=False)
        except Exception:   # noqa: BLE001 - a pattern group missing: no decomposed norms of that kind
            continue
        for m in matches:
            if m.root is not None:
                out[m.root] = kind
    return out


def _absorber(x, k: int, tails: dict):
    """[(node, input index, axis-of-K array)] of the constants that scale X along its last axis, or (None, reason)."""
    p = x.producer
    if p is None:
        return None, f"'{_short(x.name)}' has no producer (graph input or initializer)"
    name = f"{p.op_type} '{_short(p.name)}'"
    if p.graph is not x.graph or not _std(p):
        return None, f"producer {name} cannot absorb a scale"
    if p.op_type == "LayerNormalization":
        ax = int(p.attr("axis", -1))
        rank = len(x.shape) if x.shape is not None else None
        if ax != -1 and (rank is None or ax != rank - 1):
            return None, f"{name} normalises from axis {ax}, not only the last"
        slots = [i for i in (1, 2) if i < len(p.inputs) and p.inputs[i] is not None]
        return _vector_slots(p, slots, k, name)
    if p in tails:
        if p.op_type == "Add":   # Add(Mul(normed, γ), β)
            ci = _const_index(p)
            if ci is None:
                return None, f"{name} (end of a decomposed {tails[p]}) has no constant β"
            inner = p.inputs[1 - ci].producer
            if inner is None or inner.op_type != "Mul" or len(p.inputs[1 - ci].uses()) != 1:
                return None, f"{name} (end of a decomposed {tails[p]}) does not follow a Mul by γ"
            gi = _const_index(inner)
            if gi is None:
                return None, f"{name}: the Mul before it has no constant γ"
            got, why = _vector_slots(inner, [gi], k, name)
            if why:
                return None, why
            more, why = _vector_slots(p, [ci], k, name)
            return (None, why) if why else (got + more, None)
        if p.op_type == "Mul":
            ci = _const_index(p)
            if ci is None:
                return None, f"{name} (end of a decomposed {tails[p]}) has no constant γ"
            return _vector_slots(p, [ci], k, name)
    return None, f"producer {name} cannot absorb a per-channel scale (only LayerNormalization or a decomposed " \
                 f"LayerNorm/RMSNorm's final Mul/Add)"


def _const_index(p) -> Optional[int]:
    if len(p.inputs) != 2 or p.inputs[0] is p.inputs[1]:
        return None
    for i in (1, 0):
        if _const(p.inputs[i]) is not None:
            return i
    return None


def _vector_slots(p, slots, k, name):
    out = []
    for i in slots:
        v = p.inputs[i]
        a = _const(v)
        if a is None:
            return None, f"{name} input {i} is not a float constant"
        if is_protected(v):
            return None, f"{name} constant '{_short(v.name)}' is protected"
        if a.size != k or a.shape[-1] != k:
            return None, f"{name} constant '{_short(v.name)}' shape {a.shape} is not [{k}]"
        out.append((p, i, a))
    return out, None


def _groups(ctx):
    """([(x, readers [(node, w, axis)], absorber slots)], {name: reason})."""
    g = ctx.model.graph
    tails = _norm_tails(g)
    seen, groups, skipped = set(), [], {}
    for op in ("MatMul", "Gemm"):
        for n in g.nodes_by_op(op):
            if not _std(n) or len(n.inputs) < 2 or n.inputs[0] is None or _const(n.inputs[1]) is None:
                continue
            x = n.inputs[0]
            if x.name in seen:
                continue
            seen.add(x.name)
            readers, why = [], None
            if x.is_output_of_any_graph():
                why = f"'{_short(x.name)}' is a graph output"
            for use in x.uses():
                r = use.user
                if use.is_graph_output or r is None or (_std(r) and r.op_type in SHAPE_ONLY):
                    continue
                got, reason = _reader_weight(r, x)
                if got:
                    readers.append((r, got[0], got[1]))
                why = why or reason
            skip_names = [r.name for r, _, _ in readers] + [u.user.name for u in x.uses() if u.user is not None
                                                            and _std(u.user) and u.user.op_type in ("MatMul", "Gemm")
                                                            and u.user.name not in {r.name for r, _, _ in readers}]
            if not why:
                own = {id(r) for r, _, _ in readers}
                for r, w, _ in readers:
                    others = [u for u in w.uses() if u.is_graph_output or id(u.user) not in own]
                    if others or sum(1 for rr, ww, _ in readers if ww is w) > 1:
                        why = f"{r.op_type} '{_short(r.name)}' weight '{_short(w.name)}' is shared"
                        break
            k = None
            if not why:
                ks = {w.const_value().shape[a] for _, w, a in readers}
                if len(ks) != 1:
                    why = f"the readers of '{_short(x.name)}' disagree on its channel count"
                else:
                    k = ks.pop()
            slots = None
            if not why:
                slots, why = _absorber(x, k, tails)
            if why:
                for name in skip_names or [n.name]:
                    skipped[name] = why
                continue
            groups.append((x, readers, slots))
    return groups, skipped


def _act_max(ctx, names) -> dict:
    """{name: per-channel max |x| over the last axis} from one pass over ctx.samples."""
    from qcompiler.errors import DataError
    from qcompiler.quant.calibrate import extra_output_names, make_session
    sess = make_session(ctx.model, extra_outputs=extra_output_names(ctx.model, names))
    out, n = {}, 0
    for i, feed in enumerate(ctx.samples):
        arrays = sess.run(names, feed, where=f"smoothquant sample {i}")
        for name, a in zip(names, arrays):
            a = np.abs(np.asarray(a, np.float64))
            m = a.reshape(-1, a.shape[-1]).max(axis=0) if a.ndim and a.size else None
            if m is not None:
                out[name] = m if name not in out else np.maximum(out[name], m)
        n += 1
    if n == 0:
        raise DataError("empty sample set (0 samples)")
    return out


def smoothing_scale(xmax: np.ndarray, wmax: np.ndarray, alpha: float = SMOOTHQUANT_ALPHA) -> np.ndarray:
    """s_k = max|X_k|^alpha / max|W_k|^(1 - alpha), clipped to [S_MIN, S_MAX]; 1 where either is 0 or not finite."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = np.power(xmax, alpha) / np.power(wmax, 1.0 - alpha)
    s = np.where(np.isfinite(s) & (xmax > 0) & (wmax > 0), s, 1.0)
    return np.clip(s, S_MIN, S_MAX)


@register_pass
class SmoothQuant(QuantPass):
    name = "smoothquant"
    description = "SmoothQuant: move activation outliers into MatMul/Gemm weights, 1/s folded into the " \
                  "LayerNorm/RMSNorm before them (Xiao et al. 2023)"
    preserves_semantics = True
    requires = ("quant-context", "canonical-names")
    after = "fuse-hardswish"

    def run(self, ctx) -> PassResult:
        groups, skipped = _groups(ctx)
        smoothed = []
        if groups:
            xmax = _act_max(ctx, [x.name for x, _, _ in groups])
            for x, readers, slots in groups:
                xm = xmax.get(x.name)
                if xm is None or xm.size != slots_k(readers):
                    for r, _, _ in readers:
                        skipped[r.name] = f"no activation statistics of shape [{slots_k(readers)}] for " \
                                          f"'{_short(x.name)}'"
                    continue
                wmax = np.zeros(xm.size)
                for _, w, axis in readers:
                    wa = np.abs(w.const_value().astype(np.float64))
                    wmax = np.maximum(wmax, wa.max(axis=1 - axis))
                s = smoothing_scale(xm, wmax)
                for p, i, a in slots:
                    write_constant_input(p, i, (a.astype(np.float64) / s.reshape(a.shape)).astype(a.dtype))
                for r, w, axis in readers:
                    wa = w.const_value()
                    shape = (-1, 1) if axis == 0 else (1, -1)
                    write_constant_input(r, 1, (wa.astype(np.float64) * s.reshape(shape)).astype(wa.dtype))
                    smoothed.append(r.name)
        if smoothed or skipped:
            ctx.notes.append(f"smoothquant (alpha {SMOOTHQUANT_ALPHA}): {len(smoothed)} MatMul/Gemm smoothed, "
                             f"{len(skipped)} skipped" + (f" (e.g. '{_short(next(iter(skipped)))}': "
                                                          f"{next(iter(skipped.values()))[:120]})" if skipped else ""))
        return PassResult(bool(smoothed), {"smoothed": len(smoothed), "smoothed_nodes": smoothed,
                                           "skipped": len(skipped), "skipped_reasons": skipped})


def slots_k(readers) -> int:
    _, w, axis = readers[0]
    return int(w.const_value().shape[axis])
