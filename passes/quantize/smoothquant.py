"""`smoothquant` (optional, `--recipe smoothquant`): migrate activation outliers into the weights (Xiao et al.
2023, "SmoothQuant").

For an activation X [.., K] read by MatMul/Gemm nodes with constant weights W [K, N] (Gemm: transB respected),
X := X / s and W rows := W * s leave the float model unchanged; with s_k = max|X_k|^alpha / max|W_k,:|^(1 -
alpha) the channels of X that are 50x the rest shrink and the per-tensor
activation grid fits the others. Several MatMuls reading one X (Q/K/V) get one s, from the max over all their
weights.

alpha: `--smoothquant-alpha A` (API `smoothquant_alpha=A`, 0 < A < 1) for every layer; by default ("auto")
it is searched per layer on the calibration rows of X over 0.3..0.8 (and "no smoothing"), scored by the layer
output's MSE with X/s and s*W fake-quantized at the run's activation and weight bits (all alphas in one
batched matmul). A layer whose best score is "no smoothing", or that would need an explicit Mul for less than
1 dB of layer MSE, is left alone, with that reason in the stats.

Where 1/s goes, in this order (the stats' `folds` and the report's `smoothquant.layers` say which, per layer):
- `fold`: into X's producer, when it can absorb a per-channel scale: a LayerNormalization's gamma/beta, the
  final Mul(gamma)/Add(beta) of a decomposed LayerNorm/RMSNorm, a previous MatMul/Gemm/Conv (its weights and
  bias, `scale_folding.plan_producer_fold`) or a Mul by a per-channel constant. Never into a node of a recognised
  structure (a GELU's Mul and its 0.5, SiLU, HardSwish), a protected constant, or a scalar constant that other
  nodes read too (GELUs sharing one 0.5: field notes §4, Intel's crash).
- `fold+restore`: as `fold`, and X also has readers that cannot take the scale (post-LN BERT: the LayerNorm
  output feeds the residual Add): those readers get X back through one inserted Mul(X/s, s), so X/s is the
  tensor the plan quantizes for the MatMuls and the residual sees X as before.
- `mul`: no fold is legal (the producer is a GELU, a Reshape, a graph input), or X stays float for its other
  readers (a config leaves X unquantized, as `--config w8a8` does: then a Mul before the MatMuls costs what the
  restoring Mul would and the others read X exactly): Mul(X, 1/s) is inserted before
  the MatMul/Gemm readers only; the other readers keep X. When the Mul is X's only reader, X (and the
  Reshape/Transpose chain back to the op computing it) gets no quantizer of its own (a config rule
  `output_quantized: false` added for this run; stats `left_unquantized`): the grid sits after the scale. On
  ort_cpu the Mul runs as a float op (measured on minilm_l6, 11 of them: CPU time within the noise, 8.7 vs
  8.9 ms W8A8); with the search, a Mul is inserted only for >= 1 dB lower layer MSE.
Why a GELU's output gets a Mul and not a fold into the MatMul before it: GELU(x / s) != GELU(x) / s (GELU is not
scale-equivariant), so 1/s cannot go into fc1's weights and bias. The GELU's last Mul by 0.5 could absorb it
exactly (0.5 / s per channel), but that constant is shared and part of a recognised structure (never written),
and onnxruntime fuses the decomposed GELU into one Gelu/BiasGelu kernel only while it is the scalar 0.5: the
explicit Mul (one element-wise op on the fc2 input) keeps that fusion.

W8A8 as the paper means it (int8 inputs and weights for every MatMul/Gemm, the rest float) is the config preset
`--config w8a8` (qcompiler/quant/settings/presets/w8a8.yaml): `qcompiler quantize m.onnx --calib c.npz --config w8a8
--recipe smoothquant -o q.onnx`. On minilm_l6: mean cosine 0.9964 (0.9878 without smoothquant; 0.8487 with every
activation 8-bit); with `--recipe smoothquant,seq-mse` 0.9978, and `--scheme tf_enhanced` too 0.9982: after
smoothing, the 7-bit per-channel weights cost about as much as all the MatMul inputs together, and of those the
fc2 input (the GELU output) most (`python benchmarks/bench_smoothquant.py --only paper`).

Skipped, with the reason in `skipped_reasons`: shared or protected weights, readers that disagree on K, no
statistics. Weights and constants are written copy-on-write (`scale_folding.write_constant_input`); main graph
only.

X's rows come from one onnxruntime pass over ctx.samples (calibrate.make_session with X as extra outputs; a
uniform reservoir of 512 rows per X plus max|X_k| over all rows); the SampleSet rewinds for `calibrate` (a
reader without rewind raises one DataError line there).

SmoothQuant's numbers (Xiao et al. 2023): the smoothing scale and the per-layer alpha search, in numpy.

For a linear layer Y = X W (X [n, K], W [K, N]) and a per-channel s > 0, (X / s)(s W) = Y. With
s_k = max|X_k|^alpha / max|W_k,:|^(1 - alpha) the outlier channels of X shrink and W's rows grow: alpha moves
the quantization difficulty from the activation (alpha -> 1) to the weight (alpha -> 0).

`search_alpha` picks alpha per layer on calibration rows: every alpha of the grid at once (one batched matmul,
no loop over alphas), each scored by the MSE of the layer output with X/s fake-quantized per tensor at the
activation bits and s W fake-quantized per output channel (or per block along K) at the weight bits, as the
plan will quantize them. The grid always holds 0.5 (the paper's default), so the pick is never worse than 0.5 on
that MSE; `NO_SMOOTHING` scores s = 1 too, so a layer that smoothing would not help can be left alone.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
from onnx import helper
from qcompiler.passes.scale_folding import (
    apply_plan,
    is_protected,
    plan_producer_fold,
    write_constant_input,
)
from qcompiler.patterns import find_matches

from qcompiler.errors import DataError
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.calibration.layer_inputs import stream_values
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.placement.options import config_with_rules, node_settings
from qcompiler.quant.settings.config import Rule

DEFAULT_ALPHA = 0.5
ALPHA_GRID = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
NO_SMOOTHING = None            # the grid entry meaning s = 1 (no scale)
S_MIN, S_MAX = 1e-5, 1e5
MAX_ROWS = 512                 # calibration rows of X kept per layer for the search (uniform reservoir)


def smoothing_scale(xmax: np.ndarray, wmax: np.ndarray, alpha=DEFAULT_ALPHA) -> np.ndarray:
    """s_k = max|X_k|^alpha / max|W_k|^(1 - alpha), clipped to [S_MIN, S_MAX]; 1 where either is 0 or not finite.

    `alpha` may be an array: the result then has shape alpha.shape + xmax.shape (one row per alpha)."""
    a = np.asarray(alpha, np.float64)
    xm, wm = np.asarray(xmax, np.float64), np.asarray(wmax, np.float64)
    ab = a.reshape(a.shape + (1,) * xm.ndim)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = np.power(xm, ab) / np.power(wm, 1.0 - ab)
    s = np.where(np.isfinite(s) & (xm > 0) & (wm > 0), s, 1.0)
    return np.clip(s, S_MIN, S_MAX)


def fake_quant_activation(x: np.ndarray, bits: int, symmetric: bool = False) -> np.ndarray:
    """x [A, n, K]: each x[a] rounded to its own per-tensor min/max grid (the range always holds 0)."""
    red = tuple(range(1, x.ndim))
    if symmetric:
        m = np.abs(x).max(axis=red, keepdims=True)
        scale = np.where(m > 0, m / (2 ** (bits - 1) - 1), 1.0)
        lim = 2 ** (bits - 1) - 1
        return np.clip(np.round(x / scale), -lim - 1, lim) * scale
    lo = np.minimum(x.min(axis=red, keepdims=True), 0.0)
    hi = np.maximum(x.max(axis=red, keepdims=True), 0.0)
    scale = np.where(hi > lo, (hi - lo) / (2 ** bits - 1), 1.0)
    zp = np.round(-lo / scale)
    return (np.clip(np.round(x / scale) + zp, 0, 2 ** bits - 1) - zp) * scale


def fake_quant_weight(w: np.ndarray, bits: int, range_bits: Optional[int] = None,
                      block: Optional[int] = None) -> np.ndarray:
    """w [A, K, N]: symmetric per output channel N (per block of `block` rows of K when it divides K)."""
    rb = range_bits or bits
    lim = 2 ** (rb - 1) - 1
    a, k, n = w.shape
    if block and 0 < block < k and k % block == 0:
        wb = w.reshape(a, k // block, block, n)
        m = np.abs(wb).max(axis=2, keepdims=True)
        scale = np.where(m > 0, m / lim, 1.0)
        return (np.clip(np.round(wb / scale), -lim, lim) * scale).reshape(w.shape)
    m = np.abs(w).max(axis=1, keepdims=True)
    scale = np.where(m > 0, m / lim, 1.0)
    return np.clip(np.round(w / scale), -lim, lim) * scale


def layer_mse(x: np.ndarray, w: np.ndarray, scales: np.ndarray, act_bits: int = 8, act_symmetric: bool = False,
              weight_bits: int = 8, weight_range_bits: Optional[int] = None,
              block: Optional[int] = None) -> np.ndarray:
    """MSE of Q(X / s) Q(s W) against X W for each row of `scales` [A, K]; x [n, K], w [K, N]. Returns [A]."""
    x = np.asarray(x, np.float32)
    w = np.asarray(w, np.float32)
    s = np.asarray(scales, np.float32)
    ref = x @ w
    xq = fake_quant_activation(x[None] / s[:, None, :], act_bits, act_symmetric)
    wq = fake_quant_weight(w[None] * s[:, :, None], weight_bits, weight_range_bits, block)
    err = np.matmul(xq.astype(np.float32), wq.astype(np.float32)) - ref[None]
    return np.mean(np.square(err, dtype=np.float64), axis=(1, 2))


def search_alpha(x: np.ndarray, w: np.ndarray, xmax: np.ndarray, wmax: np.ndarray,
                 grid: Sequence = ALPHA_GRID, **quant) -> tuple:
    """(best alpha, {alpha: layer MSE}) over `grid`; alpha None in the grid scores s = 1 (no smoothing).

    Ties go to the earlier grid entry. `quant`: act_bits, act_symmetric, weight_bits, weight_range_bits, block."""
    grid = list(grid)
    rows = [np.ones(np.size(xmax)) if a is NO_SMOOTHING else smoothing_scale(xmax, wmax, a) for a in grid]
    mse = layer_mse(x, w, np.stack(rows), **quant)
    best = int(np.argmin(np.where(np.isfinite(mse), mse, np.inf)))
    return grid[best], dict(zip(grid, (float(m) for m in mse)))


class RowReservoir:
    """A uniform sample of at most `size` rows (last axis = channels) out of every row seen, plus max|x| per channel."""

    def __init__(self, size: int = MAX_ROWS, seed: int = 0):
        self.size, self.rng = size, np.random.default_rng(seed)
        self.rows: Optional[np.ndarray] = None
        self.keys: Optional[np.ndarray] = None
        self.absmax: Optional[np.ndarray] = None

    def add(self, a: np.ndarray) -> None:
        if a.ndim == 0 or a.size == 0:
            return
        r = np.asarray(a, np.float32).reshape(-1, a.shape[-1])
        if self.absmax is not None and self.absmax.size != r.shape[1]:
            return
        m = np.abs(r).max(axis=0).astype(np.float64)
        self.absmax = m if self.absmax is None else np.maximum(self.absmax, m)
        keys = self.rng.random(r.shape[0])
        if self.rows is not None:
            r, keys = np.concatenate([self.rows, r]), np.concatenate([self.keys, keys])
        if r.shape[0] > self.size:
            keep = np.argpartition(keys, self.size)[:self.size]
            r, keys = r[keep], keys[keep]
        self.rows, self.keys = r, keys


SMOOTHQUANT_ALPHA = DEFAULT_ALPHA
SHAPE_ONLY = ("Shape", "Size")   # readers that see only X's shape, which the scale does not change
# an explicit Mul costs a float op per inference: a searched alpha inserts one only for at least this much lower
# layer MSE (1 dB); a fold costs nothing and is taken for any gain
MUL_MIN_GAIN = 10 ** 0.1
# walked back from an explicit Mul's input to the op computing it (all left unquantized)
DATA_MOVEMENT = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten")
# recognised structures whose nodes and constants never absorb a scale (their outputs get an explicit Mul)
STRUCTURES = ("gelu", "silu", "hardswish", "hardsigmoid_gate", "layernorm", "rmsnorm")
_FLOATS = (np.float16, np.float32, np.float64)
__all__ = ["SmoothQuant", "smoothing_scale", "S_MIN", "S_MAX", "SMOOTHQUANT_ALPHA"]


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


class _Structures:
    """The pattern library's matches in the main graph: decomposed norm tails, structure nodes and constants."""

    def __init__(self, graph):
        self.tails, self.nodes, self.consts = {}, {}, set()
        for kind in STRUCTURES:
            try:
                matches = find_matches(graph, kind, recurse=False)
            except Exception:   # noqa: BLE001 - a pattern group missing: no structures of that kind
                continue
            for m in matches:
                if kind in ("layernorm", "rmsnorm") and m.root is not None:
                    self.tails[m.root] = kind
                for n in m.nodes:
                    self.nodes.setdefault(n, kind)
                for c in m.constants.values():
                    self.consts.add(c)


def _norm_slots(x, k: int, st: _Structures):
    """[(node, input index, array)] of the γ/β constants that scale X along its last axis, or (None, reason);
    (None, None) when X's producer is not a norm."""
    p = x.producer
    name = f"{p.op_type} '{_short(p.name)}'"
    if p.op_type == "LayerNormalization":
        ax = int(p.attr("axis", -1))
        rank = len(x.shape) if x.shape is not None else None
        if ax != -1 and (rank is None or ax != rank - 1):
            return None, f"{name} normalises from axis {ax}, not only the last"
        slots = [i for i in (1, 2) if i < len(p.inputs) and p.inputs[i] is not None]
        return _vector_slots(p, slots, k, name)
    tails = st.tails
    if p not in tails:
        return None, None
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
    return None, f"{name} ends a decomposed {tails[p]} in an unknown way"


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


def _fold_target(x, k: int, st: _Structures):
    """How 1/s can be folded into X's producer: ("norm", slots), ("producer", None) or (None, reason)."""
    p = x.producer
    if p is None:
        return None, f"'{_short(x.name)}' has no producer (graph input or initializer)"
    name = f"{p.op_type} '{_short(p.name)}'"
    if p.graph is not x.graph or not _std(p):
        return None, f"producer {name} cannot absorb a scale"
    slots, why = _norm_slots(x, k, st)
    if slots is not None or why is not None:
        return (("norm", slots), None) if slots is not None else (None, why)
    if p in st.nodes:
        return None, f"producer {name} is part of a {st.nodes[p]} (a structure: its constants never change)"
    if p.op_type not in ("MatMul", "Gemm", "Conv", "ConvTranspose", "Add", "Mul"):
        return None, f"producer {name} cannot absorb a per-channel scale"
    if p.op_type == "Mul":
        ci = _const_index(p)
        c = None if ci is None else p.inputs[ci]
        if c is not None and c.const_value().size == 1 and len(c.uses()) > 1:
            return None, f"producer {name}: its scalar '{_short(c.name)}' is shared by {len(c.uses())} readers"
    plan, why = plan_producer_fold(x, np.ones(k), None, -1, protected=st.consts)
    return (("producer", None), None) if plan is not None else (None, f"producer {name}: {why}")


def _groups(ctx, st: _Structures):
    """([group dicts], {node name: reason}) for every X read by a MatMul/Gemm with a constant weight."""
    g = ctx.model.graph
    seen, groups, skipped = set(), [], {}
    for n in g.topological_nodes(("MatMul", "Gemm")):
        if n.graph is not g or not _std(n) or len(n.inputs) < 2 or n.inputs[0] is None or \
                _const(n.inputs[1]) is None:
            continue
        x = n.inputs[0]
        if x.name in seen:
            continue
        seen.add(x.name)
        readers, others, why = [], [], {}
        for use in x.uses():
            r = use.user
            if use.is_graph_output:
                others.append(use)
                continue
            if _std(r) and r.op_type in SHAPE_ONLY:
                continue
            got, reason = _reader_weight(r, x)
            if got:
                readers.append((r, got[0], got[1]))
            else:
                others.append(use)
                if _std(r) and r.op_type in ("MatMul", "Gemm"):
                    why[r.name] = reason
        # a weight read by anything but this group's readers stays as it is: its reader goes with the others
        own = {id(r) for r, _, _ in readers}
        kept = []
        for r, w, a in readers:
            outside = [u for u in w.uses() if u.is_graph_output or id(u.user) not in own]
            if outside or sum(1 for rr, ww, _ in readers if ww is w) > 1:
                why[r.name] = f"{r.op_type} '{_short(r.name)}' weight '{_short(w.name)}' is shared"
                others.extend(u for u in x.uses() if u.user is r and not u.is_graph_output)
            else:
                kept.append((r, w, a))
        readers = kept
        if readers:
            ks = {w.const_value().shape[a] for _, w, a in readers}
            if len(ks) != 1:
                for r, _, _ in readers:
                    why[r.name] = f"the readers of '{_short(x.name)}' disagree on its channel count"
                readers = []
        skipped.update(why)
        if not readers:
            continue
        k = readers[0][1].const_value().shape[readers[0][2]]
        target, reason = _fold_target(x, k, st)
        if target is not None and any(u.is_graph_output for u in others):
            target, reason = None, f"'{_short(x.name)}' is a graph output"
        elif target is not None and others and _float_for_others(ctx, x, others):
            target, reason = None, f"'{_short(x.name)}' stays float for its other readers (the config leaves " \
                                   f"it unquantized): a Mul before the MatMuls keeps them exact"
        groups.append({"x": x, "readers": readers, "others": others, "k": k, "target": target,
                       "why_not_fold": reason})
    return groups, skipped


def _float_for_others(ctx, x, others) -> bool:
    """Will X stay float for its readers other than the smoothed MatMuls (a config leaves its producer's output
    unquantized and none of those readers asks for quantized inputs, as in the w8a8 preset)? Then 1/s goes into
    a Mul before the MatMuls rather than into the producer with a Mul restoring X for the others: the same one
    Mul, and the others read X itself instead of X/s's grid times s (minilm_l6, --config w8a8: 0.9960 -> 0.9964)."""
    opts = getattr(ctx, "options", None)
    if opts is None or opts.config is None or x.producer is None:
        return False
    s = node_settings(opts, ctx.profile, x.producer)
    if not (s["keep_float"] or not s["output_quantized"]):
        return False
    return not any(node_settings(opts, ctx.profile, u.user).get("input_quantized") for u in others
                   if getattr(u, "user", None) is not None)


def _collect(ctx, names) -> dict:
    """{name: RowReservoir} from one pass over ctx.samples (layer_inputs.stream_values: the one capture path)."""
    out = {name: RowReservoir() for name in names}
    n = 0
    for _, _, arrays in stream_values(ctx.model, ctx.samples, names, where="smoothquant sample"):
        for name in names:
            a = arrays.get(name)
            if a is None:
                continue
            a = np.asarray(a)
            if a.dtype in _FLOATS:
                out[name].add(a)
        n += 1
    if n == 0:
        raise DataError("empty sample set (0 samples)")
    return out


def _weights_kn(readers) -> np.ndarray:
    """The readers' current weights as one [K, sum N] float32 matrix."""
    mats = []
    for r, _, axis in readers:
        w = r.inputs[1].const_value().astype(np.float32)
        mats.append(w if axis == 0 else w.T)
    return np.concatenate(mats, axis=1)


def _quant_args(ctx) -> dict:
    s, prof = ctx.settings, ctx.profile
    act = getattr(prof, "activation", None)
    wgt = getattr(prof, "weight", None)
    sym = getattr(act, "symmetric", False) if getattr(s, "selection", None) is None or \
        getattr(s.selection, "act_symmetric", None) is None else bool(s.selection.act_symmetric)
    wb = int(getattr(s, "weight_bits", 8))
    rb = getattr(wgt, "range_bits", None)
    return {"act_bits": int(getattr(s, "act_bits", 8)), "act_symmetric": bool(sym), "weight_bits": wb,
            "weight_range_bits": min(wb, rb) if rb and wb == 8 else wb, "block": getattr(s, "weight_block", None)}


def _insert_mul(g, x, scale: np.ndarray, uses, hint: str):
    """Mul(x, scale) feeding `uses` of x (the others keep x); returns the Mul node."""
    c = g.add_constant(scale, hint)
    node = g.insert_after(x, "Mul", [c], uses=uses, name=hint)
    out = node.outputs[0]
    if out.type is None and x.type is not None:
        out.type = x.type
    return node


def _dtype(x, readers=()):
    """x's float type: declared, else its readers' weights' (a MatMul/Gemm reads both in one type: fp16 models)."""
    elem = x.dtype or next((r.inputs[1].dtype for r, _, _ in readers if r.inputs[1].dtype), None)
    try:
        return helper.tensor_dtype_to_np_dtype(elem)
    except Exception:   # noqa: BLE001 - unknown type: float32, the only type the readers' weights had
        return np.dtype(np.float32)


@register_pass
class SmoothQuant(QuantPass):
    name = "smoothquant"
    description = "SmoothQuant: move activation outliers into MatMul/Gemm weights; 1/s folded into the producer " \
                  "(LayerNorm/RMSNorm, MatMul/Gemm/Conv, Mul) or an inserted Mul; alpha searched per layer"
    preserves_semantics = True
    requires = ("quant-context", "canonical-names")
    after = "fuse-hardswish"

    def run(self, ctx) -> PassResult:
        g = ctx.model.graph
        st = _Structures(g)
        groups, skipped = _groups(ctx, st)
        fixed = getattr(ctx.settings, "smoothquant_alpha", None)
        quant = _quant_args(ctx)
        smoothed, folds, alphas, inserted, unquantized = [], {}, {}, [], []
        if groups:
            stats = _collect(ctx, [gr["x"].name for gr in groups])
            for gr in groups:
                x, readers, k = gr["x"], gr["readers"], gr["k"]
                res = stats.get(x.name)
                if res is None or res.absmax is None or res.absmax.size != k:
                    for r, _, _ in readers:
                        skipped[r.name] = f"no activation statistics of shape [{k}] for '{_short(x.name)}'"
                    continue
                w = _weights_kn(readers)
                wmax = np.abs(w).max(axis=1).astype(np.float64)
                if fixed is None:
                    alpha, scores = search_alpha(res.rows, w, res.absmax, wmax, ALPHA_GRID + (NO_SMOOTHING,),
                                                 **quant)
                    gain = scores[NO_SMOOTHING] / max(scores[alpha], 1e-30) if alpha is not NO_SMOOTHING else 1.0
                    if alpha is NO_SMOOTHING or (gr["target"] is None and gain < MUL_MIN_GAIN):
                        best = min((a for a in scores if a is not None), key=scores.get)
                        # an all-zero weight or activation has MSE 0 with and without smoothing: 0 dB
                        db = 10 * np.log10(max(scores[NO_SMOOTHING], 1e-30) / max(scores[best], 1e-30))
                        for r, _, _ in readers:
                            skipped[r.name] = f"smoothing lowers the layer's quantization MSE by " \
                                              f"{db:.2f} dB " \
                                              f"(alpha {best})" + (", not worth an inserted Mul"
                                                                   if alpha is not NO_SMOOTHING else "")
                        continue
                else:
                    alpha = float(fixed)
                s = smoothing_scale(res.absmax, wmax, alpha)
                how = self._apply_inverse(g, gr, s, st, inserted)
                if how == "mul":
                    unquantized.extend(_keep_unsmoothed_float(ctx, x))
                for r, _, axis in readers:
                    wa = r.inputs[1].const_value()
                    shape = (-1, 1) if axis == 0 else (1, -1)
                    write_constant_input(r, 1, (wa.astype(np.float64) * s.reshape(shape)).astype(wa.dtype))
                    smoothed.append(r.name)
                    folds[r.name] = how
                    alphas[r.name] = alpha
        counts = {m: sum(1 for v in folds.values() if v == m) for m in ("fold", "fold+restore", "mul")}
        ctx.smoothquant = {"alpha": "searched per layer" if fixed is None else fixed,
                           "layers": {n: {"placed": folds[n], "alpha": alphas[n]} for n in smoothed},
                           "counts": counts, "inserted_muls": inserted, "left_unquantized": unquantized,
                           "skipped": skipped}
        if smoothed or skipped:
            al = f"alpha {fixed:g}" if fixed is not None else "alpha searched per layer"
            ctx.notes.append(f"smoothquant ({al}): {len(smoothed)} MatMul/Gemm smoothed (1/s folded: "
                             f"{counts['fold']}, folded with a Mul restoring the other readers: "
                             f"{counts['fold+restore']}, explicit Mul: {counts['mul']}), {len(skipped)} skipped"
                             + (f" (e.g. '{_short(next(iter(skipped)))}': {next(iter(skipped.values()))[:120]})"
                                if skipped else ""))
        return PassResult(bool(smoothed), {"smoothed": len(smoothed), "smoothed_nodes": smoothed,
                                           "folds": folds, "fold_counts": counts, "alphas": alphas,
                                           "inserted_muls": inserted, "left_unquantized": unquantized,
                                           "skipped": len(skipped),
                                           "skipped_reasons": skipped})

    @staticmethod
    def _apply_inverse(g, gr, s, st, inserted) -> str:
        """Make the readers see X / s: fold into the producer (restoring X for the others) or insert a Mul."""
        x, target, others = gr["x"], gr["target"], gr["others"]
        dt = _dtype(x, gr["readers"])
        if target is not None:
            kind, slots = target
            done = False
            if kind == "norm":
                for p, i, a in slots:
                    cur = p.inputs[i].const_value()
                    write_constant_input(p, i, (cur.astype(np.float64) / s.reshape(cur.shape)).astype(cur.dtype))
                done = True
            else:
                plan, _ = plan_producer_fold(x, 1.0 / s, None, -1, protected=st.consts)
                if plan is not None:
                    scaled = apply_plan(plan)
                    if scaled is not x:   # a MatMul without bias got an Add for a shift: none here, but follow it
                        x = scaled
                    done = True
            if done:
                if not others:
                    return "fold"
                uses = [u for u in x.uses() if any(u.user is o.user and u.index == o.index for o in others)]
                node = _insert_mul(g, x, s.astype(dt), uses, f"{_short(x.name)}_smoothquant_restore")
                inserted.append(node.name)
                return "fold+restore"
        uses = [u for u in x.uses() if any(u.user is r for r, _, _ in gr["readers"])]
        node = _insert_mul(g, x, (1.0 / s).astype(dt), uses, f"{_short(x.name)}_smoothquant")
        inserted.append(node.name)
        return "mul"


def _keep_unsmoothed_float(ctx, x) -> list:
    """Leave X (and the data movement before it, up to the op computing it) without a quantizer when the
    inserted Mul is its only reader: a grid on X before the Mul would round the outliers' neighbours away
    before the scale can help (measured on minilm_l6: 0.9862 -> 0.9858 with it, 0.9894 without). A config
    rule `output_quantized: false` per node, added to this run's placement options; returns the node names."""
    opts = getattr(ctx, "options", None)
    if opts is None:
        return []
    names, v = [], x
    while v.producer is not None and v.producer.graph is v.graph and len(v.uses()) == 1 and \
            not v.is_output_of_any_graph():
        p = v.producer
        names.append(p.name)
        if not (_std(p) and p.op_type in DATA_MOVEMENT and p.inputs and p.inputs[0] is not None):
            break
        v = p.inputs[0]
    if not names:
        return []
    start = max([r.index for r in opts.config.rules] + [-1]) + 1 if opts.config is not None else 0
    opts.config = config_with_rules(opts, ctx.profile, [Rule(index=start + i, names=(name,),
                                                             updates={"output_quantized": False})
                                                        for i, name in enumerate(names)])
    return names
