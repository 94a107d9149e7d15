"""`adaround` (optional, `--recipe adaround`): learned weight rounding (AdaRound, Nagel et al. 2020) for Conv,
ConvTranspose, Gemm and MatMul weights, at each layer's own bit width from the plan (so a mixed-precision plan
works as it is: a 4-bit Conv learns its 4-bit rounding, an 8-bit one its 8-bit rounding).

It runs after `assign-encodings` (it needs the weight grids) and before `insert-qdq`, which writes the learned
integers (`QuantSpec.rounded`) instead of round-to-nearest; the weight encodings are frozen. The layer inputs
come from one float run over the calibration samples; each layer's result is never worse than round-to-nearest
on its own loss ||W X - W~ X||^2. The algorithm, its schedule, early stopping and what it skips (with reasons)
are described below.

    qcompiler quantize m.onnx --calib c.npz --recipe adaround --weight-bits 4 -o m_w4a8.onnx

The report's notes give the layer count, the total iterations and the summed layer loss against round-to-nearest;
each skipped layer is named with its reason. Off by default: it costs seconds per layer on a 2-core CPU.

AdaRound (Nagel et al. 2020, "Up or Down? Adaptive Rounding for Post-Training Quantization"), in numpy.

For every quantized weight of a Conv, ConvTranspose, Gemm or MatMul, learn whether each weight rounds down or up
on its grid (the plan's encoding, at that layer's own bit width: a mixed-precision plan works as it stands) so
that the layer's output on calibration data changes least:

    min_V  ||W X - W~(V) X||_F^2 / P  +  lambda * sum(1 - |2 h(V) - 1|^beta)
    W~(V) = s * (clip(floor(W / s) + h(V) + zp, qmin, qmax) - zp),   h(V) = clip(sigmoid(V) * 1.2 - 0.1, 0, 1)

(rectified sigmoid, zeta = 1.1, gamma = -0.1; lambda = 0.01 after a 20 % warm-up without it; beta annealed from
20 to 2 by a cosine, as AIMET does). Adam (numpy) updates V. At the end h is 0 or 1 and the weight is
floor + h: the integers are stored on the plan (`QuantSpec.rounded`) and insert-qdq writes them instead of
round-to-nearest; the encoding is frozen.

How it is made fast (AIMET-ONNX: 10,000 iterations per layer over minibatches of its input):
- The reconstruction loss is a quadratic form in D = W~ - W: ||D X^T||^2 / P = tr(D H D^T) with H = X^T X / P,
  the Gram matrix of the layer's input patches (Conv: im2col rows; Gemm/MatMul: input rows), accumulated once
  over every calibration sample. One iteration costs O(out · K^2) whatever the number of samples, and uses all
  of them (full batch, no sampling noise). Above K = 2048 (a large MatMul) the Gram matrix is not formed: the
  first `max_kept_rows` rows themselves are kept instead (O(out · K · rows) per iteration, bounded memory).
- Early stopping: every `check_every` iterations the hard rounding (h >= 0.5) is scored on the layer loss; the
  best seen is kept, starting from round-to-nearest (so the result is never worse than round-to-nearest on the
  layer loss). Once past the warm-up, when (almost) every h sits at 0 or 1 and the best hard loss gained less
  than `min_gain` over the last `patience` checks, the layer stops; `max_iterations` (1,000, against AIMET's
  10,000) sets the length of the beta schedule and is the cap. On digits_cnn W4A8 the summed layer loss is
  0.887 after 1,000-iteration schedules, 0.862 after 2,000 and 0.861 after 4,000 (round-to-nearest: 3.06).
- Rows per sample are subsampled to `max_rows` (a fixed seed) to bound the time spent building H.

Layer inputs come from the float model, captured in one onnxruntime run over the calibration samples (every
target layer's input as an extra output). Why not the outputs of the already-rounded predecessors (AIMET's
choice): that needs one run of the model per layer (N runs, N sessions), while the float inputs need one, and
each layer's problem is then independent; on digits_cnn W4A8 the float inputs already keep top-1 within the
target (benchmarks/bench_adaround.py).

Each layer's linear form is checked against onnxruntime's own output on the first sample (patches · W^T + b):
a layer whose form does not reproduce it (an attribute not modelled here) is skipped with that reason, never
optimised against a wrong loss. Skipped too, each with its reason: weights shared by several nodes, per-block
grids along the output axis, Conv with auto_pad other than NOTSET/VALID/SAME_*, ConvTranspose with output_shape
or auto_pad, Convs of more than 2 spatial dims, batched MatMul weights, weights inside If/Loop/Scan bodies.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
from threadpoolctl import threadpool_limits

from qcompiler.errors import DataError
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.progress import bar
from qcompiler.quant.calibration.layer_inputs import stream_values
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.core.encoding import broadcast_qparams
from qcompiler.quant.core.qdq import _quantize_array

ZETA, GAMMA = 1.1, -0.1
OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


@dataclass
class AdaRoundOptions:
    max_iterations: int = 1000        # the annealing schedule's length; early stopping usually ends sooner
    lr: float = 2e-2                  # Adam step (AIMET: 1e-3 over 10,000 minibatch steps)
    reg: float = 0.01                 # lambda, AIMET's value (its loss is scaled as ours: sum over outputs)
    warm_up: float = 0.2              # share of the schedule without the regulariser
    beta: Tuple[float, float] = (20.0, 2.0)
    check_every: int = 25
    patience: int = 3                 # checks without a gain of min_gain before a layer stops (after warm-up)
    min_gain: float = 1e-3            # relative gain of the best hard rounding's layer loss over `patience` checks
    settle_tol: float = 0.005         # share of weights whose h is still strictly between 0 and 1
    max_rows: int = 2048              # input rows (patches) per sample used for H
    gram_max_k: int = 2048            # widest K for which H (K x K) is formed
    max_kept_rows: int = 4096         # rows kept in all for a layer wider than gram_max_k
    seed: int = 0


@dataclass
class LayerResult:
    node: str
    op_type: str
    bits: int
    weights: int
    loss_nearest: float = 0.0         # layer loss of round-to-nearest
    loss: float = 0.0                 # layer loss of the learned rounding
    iterations: int = 0
    changed: int = 0                  # weights whose integer differs from round-to-nearest
    seconds: float = 0.0
    skipped: str = ""


# --------------------------------------------------------------------------- linear forms of the layers

def _conv_pads(node, spatial: Tuple[int, ...], kernel, strides, dil) -> Optional[List[int]]:
    auto = node.attr("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    nd = len(spatial)
    if auto in ("NOTSET", "", None):
        p = list(node.attr("pads", None) or [0] * (2 * nd))
        return p
    if auto == "VALID":
        return [0] * (2 * nd)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i in range(nd):
            out = -(-spatial[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - spatial[i])
            small, big = total // 2, total - total // 2
            b, e = (small, big) if auto == "SAME_UPPER" else (big, small)
            begin.append(b)
            end.append(e)
        return begin + end
    return None


def _im2col(x: np.ndarray, kernel, strides, dil, pads, groups: int) -> np.ndarray:
    """x [N, C, H, W] -> patches [G, N·Ho·Wo, C/G·kh·kw] (the rows a Conv multiplies its weight with).
    Negative pads crop."""
    n, c, h, w = x.shape
    kh, kw = kernel
    pt, pl, pb, pr = pads
    x = np.pad(x, ((0, 0), (0, 0), (max(pt, 0), max(pb, 0)), (max(pl, 0), max(pr, 0))))
    x = x[:, :, max(-pt, 0): x.shape[2] - max(-pb, 0), max(-pl, 0): x.shape[3] - max(-pr, 0)]
    hp, wp = x.shape[2], x.shape[3]
    ho = (hp - dil[0] * (kh - 1) - 1) // strides[0] + 1
    wo = (wp - dil[1] * (kw - 1) - 1) // strides[1] + 1
    cols = np.empty((n, c, kh, kw, ho, wo), x.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, :, i, j] = x[:, :, i * dil[0]: i * dil[0] + strides[0] * (ho - 1) + 1: strides[0],
                                 j * dil[1]: j * dil[1] + strides[1] * (wo - 1) + 1: strides[1]]
    cols = cols.reshape(n, groups, c // groups, kh, kw, ho, wo).transpose(1, 0, 5, 6, 2, 3, 4)
    return cols.reshape(groups, n * ho * wo, (c // groups) * kh * kw)


@dataclass
class Layer:
    """One weight use as a linear map: out[g] = rows[g] @ lin(W)[g]^T (+ bias)."""

    node: object
    weight: np.ndarray                       # the weight as stored (original layout)
    to_lin: Callable                         # array of the weight's shape -> [G, O, K]
    from_lin: Callable                       # [G, O, K] -> the weight's shape
    rows: Callable                           # the node's input 0 (one sample) -> [G, P, K]
    out_to_rows: Callable                    # the node's output (one sample) -> [G, P, O] (minus nothing)
    bias: Optional[np.ndarray] = None        # added to every row of out ([G, 1, O] broadcast) or None


def linear_form(node) -> Tuple[Optional[Layer], str]:
    """The layer's linear form, or (None, why not)."""
    op = node.op_type
    w = node.inputs[1].const_value() if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if w is None:
        return None, "weight is not a constant"
    w = np.asarray(w, np.float32)
    bias = None
    if op in ("Conv", "ConvTranspose"):
        if w.ndim not in (3, 4):
            return None, f"{w.ndim - 2}-d {op} (1-d and 2-d only)"
        one_d = w.ndim == 3
        w4 = w[:, :, None, :] if one_d else w
        kernel = w4.shape[2:]
        nd = 1 if one_d else 2
        lift = (lambda a: [1] + list(a)) if one_d else list
        strides = lift(node.attr("strides", None) or [1] * nd)
        dil = lift(node.attr("dilations", None) or [1] * nd)
        groups = int(node.attr("group", 1) or 1)
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            b = node.inputs[2].const_value()
            if b is None:
                return None, "bias is not a constant"
            bias = np.asarray(b, np.float32)
        if op == "Conv":
            co, cg = w4.shape[:2]
            if co % groups:
                return None, "output channels not divisible by group"

            def to_lin(a, co=co, groups=groups):
                return np.asarray(a).reshape(groups, co // groups, -1)

            def from_lin(a, shape=w.shape):
                return np.asarray(a).reshape(shape)

            def rows(x):
                x4 = x[:, :, None, :] if one_d else x
                pads = _conv_pads(node, x4.shape[2:], kernel, strides, dil) if not one_d else None
                if one_d:
                    p1 = _conv_pads(node, x.shape[2:], kernel[1:], strides[1:], dil[1:])
                    pads = None if p1 is None else [0, p1[0], 0, p1[1]]
                if pads is None:
                    raise ValueError("auto_pad")
                return _im2col(x4, kernel, strides, dil, pads, groups)
        else:
            if node.attr("output_shape", None) is not None:
                return None, "ConvTranspose with output_shape"
            auto = node.attr("auto_pad", "NOTSET")
            auto = auto.decode() if isinstance(auto, bytes) else auto
            if auto not in ("NOTSET", "", None):
                return None, f"ConvTranspose with auto_pad {auto}"
            ci, cog = w4.shape[:2]
            if ci % groups:
                return None, "input channels not divisible by group"
            shape5 = (groups, ci // groups, cog) + tuple(kernel)

            def to_lin(a, shape5=shape5, one_d=one_d):
                a = np.asarray(a)
                a = a[:, :, None, :] if one_d else a
                a = a.reshape(shape5).transpose(0, 2, 1, 3, 4)[:, :, :, ::-1, ::-1]
                return np.ascontiguousarray(a).reshape(shape5[0], shape5[2], -1)

            def from_lin(a, shape5=shape5, shape=w.shape):
                g, cin, co_, kh, kw = shape5
                a = np.asarray(a).reshape(g, co_, cin, kh, kw)[:, :, :, ::-1, ::-1].transpose(0, 2, 1, 3, 4)
                return np.ascontiguousarray(a).reshape(shape)

            pads_attr = node.attr("pads", None) or [0] * (2 * nd)
            outpad = node.attr("output_padding", None) or [0] * nd
            pads2 = ([0, pads_attr[0], 0, pads_attr[1]] if one_d else list(pads_attr))
            outpad2 = [0] + list(outpad) if one_d else list(outpad)

            def rows(x):
                x4 = x[:, :, None, :] if one_d else x
                n, c, h, wd = x4.shape
                z = np.zeros((n, c, (h - 1) * strides[0] + 1, (wd - 1) * strides[1] + 1), x.dtype)
                z[:, :, ::strides[0], ::strides[1]] = x4
                ext = [dil[i] * (kernel[i] - 1) for i in range(2)]
                pads = [ext[0] - pads2[0], ext[1] - pads2[1], ext[0] - pads2[2] + outpad2[0],
                        ext[1] - pads2[3] + outpad2[1]]
                return _im2col(z, kernel, (1, 1), dil, pads, groups)

        def out_to_rows(y, groups=groups):
            y4 = y[:, :, None, :] if y.ndim == 3 else y
            n, c = y4.shape[:2]
            return y4.reshape(n, groups, c // groups, -1).transpose(1, 0, 3, 2).reshape(groups, -1, c // groups)

        if bias is not None:
            bias = bias.reshape(groups, 1, -1)
        return Layer(node, w, to_lin, from_lin, rows, out_to_rows, bias), ""
    if op == "Gemm":
        if w.ndim != 2:
            return None, "Gemm weight is not 2-d"
        trans_a, trans_b = int(node.attr("transA", 0) or 0), int(node.attr("transB", 0) or 0)
        alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
        if len(node.inputs) > 2 and node.inputs[2] is not None:
            c = node.inputs[2].const_value()
            if c is None:
                return None, "C is not a constant"
            n_out = w.shape[0] if trans_b else w.shape[1]
            bias = np.broadcast_to(np.asarray(c, np.float32) * beta, (1, n_out)).reshape(1, 1, n_out) \
                if np.size(c) in (1, n_out) else None
            if bias is None:
                return None, "C is not a per-output bias"

        def to_lin(a, t=trans_b):
            a = np.asarray(a)
            return (a if t else a.T)[None]

        def from_lin(a, t=trans_b):
            a = np.asarray(a)[0]
            return np.ascontiguousarray(a if t else a.T)

        def rows(x):
            return ((x.T if trans_a else x) * np.float32(alpha))[None]

        return Layer(node, w, to_lin, from_lin, rows, lambda y: y[None], bias), ""
    if op == "MatMul":
        if w.ndim != 2:
            return None, "MatMul weight is not 2-d (batched weights are not rounded)"

        def rows(x, k=w.shape[0]):
            return x.reshape(-1, k)[None]

        return Layer(node, w, lambda a: np.asarray(a).T[None], lambda a: np.ascontiguousarray(np.asarray(a)[0].T),
                     rows, lambda y: y.reshape(-1, y.shape[-1])[None], None), ""
    return None, f"op {op} is not rounded"


# --------------------------------------------------------------------------- the optimisation

class _Quadratic:
    """The layer loss L(D) = sum_g tr(D_g H_g D_g^T) and its gradient 2 D_g H_g (H = X^T X / P), or the same from
    kept rows X (layers too wide for H)."""

    def __init__(self, gram: np.ndarray = None, rows: np.ndarray = None, count: int = 1):
        self.count = max(count, 1)
        self.gram = None if gram is None else np.ascontiguousarray(gram, np.float32)
        self.rows = None if rows is None else np.ascontiguousarray(rows, np.float32)

    @staticmethod
    def _mm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        # NOTE: one 2-d product per group: numpy's stacked float32 matmul was 10x slower here than a plain 2-d
        # BLAS call; depthwise layers (many groups of one output) go through one einsum instead
        if a.shape[0] == 1:
            return (a[0] @ b[0])[None]
        if a.shape[1] <= 4:
            return np.einsum("gok,gkl->gol", a, b)
        return np.stack([a[i] @ b[i] for i in range(a.shape[0])])

    def loss_grad(self, d: np.ndarray, grad: bool = True):
        d = d.astype(np.float32, copy=False)
        if self.gram is not None:
            dh = self._mm(d, self.gram)
            return float(np.einsum("gok,gok->", dh, d, dtype=np.float64)), (2.0 * dh if grad else None)
        e = self._mm(d, self.rows.transpose(0, 2, 1))           # [G, O, P]
        loss = float(np.einsum("gop,gop->", e, e, dtype=np.float64)) / self.count
        return loss, ((2.0 / self.count) * self._mm(e, self.rows) if grad else None)


def _beta(t: int, t_max: int, warm: int, beta: Tuple[float, float]) -> float:
    rel = (t - warm) / max(t_max - warm, 1)
    start, end = beta
    return end + 0.5 * (start - end) * (1 + np.cos(min(rel, 1.0) * np.pi))


def optimise_rounding(w_lin: np.ndarray, scale: np.ndarray, zp: np.ndarray, qlo: float, qhi: float,
                      nearest: np.ndarray, quad: _Quadratic, opts: AdaRoundOptions,
                      trace: Optional[list] = None) -> Tuple[np.ndarray, dict]:
    """Learn the rounding of `w_lin` [G, O, K] on the grid (`scale`, `zp` broadcast to it, integers clipped to
    [qlo, qhi]); `nearest`: the round-to-nearest integers (the start and the floor of the result). Returns
    (integers [G, O, K] as float32, info)."""
    f = np.float32      # float32 throughout: half the memory traffic of float64, and the loss needs no more
    w32 = w_lin.astype(f)
    s, z = scale.astype(f), zp.astype(f)
    x = w_lin.astype(np.float64) / scale
    fl = np.floor(x).astype(f)
    rest = np.clip(x - np.floor(x), 1e-4, 1 - 1e-4)
    v = (-np.log((ZETA - GAMMA) / (rest - GAMMA) - 1.0)).astype(f)    # h(V) = rest: starts at the float weight

    def hard_loss(q):
        return quad.loss_grad(s * (q - z) - w32, grad=False)[0]

    best_q, best = nearest.astype(f), hard_loss(nearest.astype(f))
    start = best
    m = np.zeros_like(v)
    u = np.zeros_like(v)
    qlo, qhi = f(qlo), f(qhi)
    b1, b2, eps = 0.9, 0.999, 1e-8
    t_max = opts.max_iterations
    warm = int(opts.warm_up * t_max)
    history: List[float] = []
    t = 0
    for t in range(1, t_max + 1):
        sig = 1.0 / (1.0 + np.exp(-v))
        hr = sig * f(ZETA - GAMMA) + f(GAMMA)
        h = np.clip(hr, 0.0, 1.0)
        q = fl + h + z
        inside = (q >= qlo) & (q <= qhi)
        d = s * (np.clip(q, qlo, qhi) - z) - w32
        _, gd = quad.loss_grad(d)
        gh = gd * s * inside
        if t > warm:
            beta = _beta(t, t_max, warm, opts.beta)
            a = 2.0 * h - 1.0
            gh += f(opts.reg * -2.0 * beta) * np.sign(a) * np.abs(a) ** f(beta - 1.0)
        gv = gh * ((hr > 0) & (hr < 1)) * sig * (1.0 - sig) * f(ZETA - GAMMA)
        m = b1 * m + (1 - b1) * gv
        u = b2 * u + (1 - b2) * gv * gv
        v -= (opts.lr * (m / (1 - b1 ** t)) / (np.sqrt(u / (1 - b2 ** t)) + eps)).astype(f)
        if t % opts.check_every == 0 or t == t_max:
            qh = np.clip(fl + (v >= 0) + z, qlo, qhi)
            lh = hard_loss(qh)
            unsettled = float(np.mean((h > 0) & (h < 1)))
            if trace is not None:
                trace.append((t, lh, unsettled))
            if lh < best:
                best, best_q = lh, qh
            history.append(best)
            # stop once past the warm-up when (almost) every h sits at 0 or 1 and the best hard rounding gained
            # less than min_gain (relative) over the last `patience` checks: nothing is left to decide
            if t > warm and unsettled <= opts.settle_tol and len(history) > opts.patience and \
                    history[-opts.patience - 1] - best <= opts.min_gain * history[-opts.patience - 1]:
                break
    return best_q, {"iterations": t, "loss_nearest": start, "loss": best}


# --------------------------------------------------------------------------- the whole plan

def _targets(model, plan) -> Tuple[List[Tuple[object, object, Layer]], List[LayerResult]]:
    g = model.graph
    readers: Dict[str, int] = {}
    for (node_name, slot), spec in plan.uses.items():
        node = plan.nodes.get(node_name)
        if node is not None and spec.kind == "weight" and node.inputs[slot] is not None:
            readers[node.inputs[slot].name] = readers.get(node.inputs[slot].name, 0) + 1
    out, skipped = [], []
    for (node_name, slot), spec in plan.uses.items():
        node = plan.nodes.get(node_name)
        if node is None or spec.kind != "weight" or slot != 1 or node.op_type not in OPS:
            continue
        if spec.keep_float or spec.encoding is None:
            continue
        enc = spec.encoding
        r = LayerResult(node_name, node.op_type, int(enc.bits), 0)
        v = node.inputs[1]
        why = ""
        if node.graph is not g:
            why = "inside an If/Loop/Scan body"
        elif readers.get(v.name, 0) > 1 or len([u for u in v.uses()]) > 1:
            why = "weight shared by several nodes"
        elif enc.dtype != "int":
            why = "not an integer grid"
        elif node.inputs[0] is None or node.inputs[0].const_value() is not None:
            why = "input 0 is a constant"
        layer = None
        if not why:
            layer, why = linear_form(node)
        if layer is not None and enc.block_size:
            lin_axis_ok = True
            try:   # a block grid is elementwise like any other, but must hold in the linear layout too
                broadcast_qparams(enc, layer.weight.shape)
            except Exception:
                lin_axis_ok = False
            if not lin_axis_ok:
                layer, why = None, "per-block grid does not fit the weight"
        if layer is None:
            r.skipped = why
            skipped.append(r)
            continue
        r.weights = int(layer.weight.size)
        out.append((node, spec, layer, r))
    return out, skipped


def _capture(model, samples, targets, opts: AdaRoundOptions):
    """One run over `samples`: per target its quadratic (Gram of its input rows) and whether its linear form
    reproduces onnxruntime's output on the first sample (a message when not)."""
    inputs = [layer.node.inputs[0].name for _, _, layer, _ in targets]
    outputs = [layer.node.outputs[0].name for _, _, layer, _ in targets]
    rng = np.random.default_rng(opts.seed)
    grams: List[Optional[np.ndarray]] = [None] * len(targets)
    kept: List[list] = [[] for _ in targets]
    counts = [0] * len(targets)
    mismatch: List[str] = [""] * len(targets)
    # one sample's inputs and outputs at a time (layer_inputs.stream_values); what is kept is a K x K Gram per
    # target, or at most max_kept_rows rows when K > gram_max_k
    for i, feed, arrays in stream_values(model, samples, inputs + outputs):
        for k, (node, spec, layer, r) in enumerate(targets):
            if mismatch[k]:
                continue
            x = np.asarray(arrays[layer.node.inputs[0].name], np.float32)
            try:
                rows = layer.rows(x)
            except Exception as e:   # an attribute or shape not modelled
                mismatch[k] = f"input rows not formed ({type(e).__name__})"
                continue
            if i == 0:
                y = np.asarray(arrays[layer.node.outputs[0].name], np.float32)
                err, tol = np.inf, 0.0
                try:
                    want = layer.out_to_rows(y)
                    got = np.matmul(rows, layer.to_lin(layer.weight).transpose(0, 2, 1))
                    if layer.bias is not None:
                        got = got + layer.bias
                    if got.shape == want.shape:
                        err = float(np.max(np.abs(got - want), initial=0.0))
                        tol = 1e-3 * (1.0 + float(np.max(np.abs(want), initial=0.0)))
                except Exception:   # shapes that do not line up: the form is wrong for this node
                    pass
                if not err <= tol:
                    mismatch[k] = "its linear form does not reproduce onnxruntime's output"
                    continue
            p = rows.shape[1]
            if p > opts.max_rows:
                rows = rows[:, np.sort(rng.choice(p, opts.max_rows, replace=False))]
            if rows.shape[2] <= opts.gram_max_k:
                counts[k] += rows.shape[1]
                rows64 = rows.astype(np.float64)
                gm = np.matmul(rows64.transpose(0, 2, 1), rows64)
                grams[k] = gm if grams[k] is None else grams[k] + gm
            elif counts[k] < opts.max_kept_rows:
                rows = rows[:, :opts.max_kept_rows - counts[k]]
                counts[k] += rows.shape[1]
                kept[k].append(rows)
    quads = []
    for k, (node, spec, layer, r) in enumerate(targets):
        if grams[k] is not None:
            quads.append(_Quadratic(gram=grams[k] / max(counts[k], 1), count=counts[k]))   # count: the rows seen
        elif kept[k]:
            allrows = np.concatenate(kept[k], axis=1).astype(np.float64)
            quads.append(_Quadratic(rows=allrows, count=counts[k]))
        else:
            quads.append(None)
    return quads, mismatch


def qrange(enc) -> Tuple[int, int]:
    """The integers a rounded weight may take: the encoding's grid, narrowed to its range bits (a 7-bit weight
    range stored in int8 must stay 7-bit: the reason it is narrower is an integer kernel that saturates)."""
    rb = int(enc.meta.get("range_bits", enc.bits) or enc.bits)
    if rb >= enc.bits:
        return enc.qmin, enc.qmax
    zp = np.asarray(enc.zero_point, np.int64)
    if enc.signed:
        return max(enc.qmin, -(2 ** (rb - 1))), min(enc.qmax, 2 ** (rb - 1) - 1)
    lo = int(np.min(zp)) - 2 ** (rb - 1)
    return max(enc.qmin, lo), min(enc.qmax, lo + 2 ** rb - 1)


def adaround(model, plan, samples, opts: Optional[AdaRoundOptions] = None,
             progress: Optional[Callable[[LayerResult], None]] = None) -> List[LayerResult]:
    """Learn the rounding of every eligible weight use of `plan` (after assign-encodings) and store it on the plan
    (`spec.rounded`, the integers insert-qdq writes; `spec.frozen`). Returns one LayerResult per weight use
    looked at (skipped ones carry their reason)."""
    opts = opts or AdaRoundOptions()
    targets, results = _targets(model, plan)
    if not targets:
        return results
    with _one_blas_thread():
        quads, mismatch = _capture(model, samples, targets, opts)
        _optimise_all(targets, quads, mismatch, results, opts, progress)
    return results


def _one_blas_thread():
    """OpenBLAS on one thread while we optimise: its threads spin against onnxruntime's and every other process
    on a loaded machine (a 64x576 by 576x576 product: 51 ms with two threads under load, 1.4 ms with one)."""
    return threadpool_limits(1, "blas")


def _optimise_all(targets, quads, mismatch, results, opts, progress) -> None:
    for (node, spec, layer, r), quad, why in zip(targets, quads, mismatch):
        if why or quad is None:
            r.skipped = why or "no calibration rows"
            results.append(r)
            continue
        t0 = time.perf_counter()
        enc = spec.encoding
        scale, zp = broadcast_qparams(enc, layer.weight.shape)
        full = layer.weight.shape
        s_lin = layer.to_lin(np.broadcast_to(scale, full))
        z_lin = layer.to_lin(np.broadcast_to(zp, full))
        near = _quantize_array(layer.weight, enc)
        near_lin = layer.to_lin(near.astype(np.float64))
        w_lin = layer.to_lin(layer.weight)
        qlo, qhi = qrange(enc)
        q, info = optimise_rounding(w_lin, s_lin, z_lin, qlo, qhi, near_lin, quad, opts)
        ints = layer.from_lin(q)
        r.iterations, r.loss_nearest, r.loss = info["iterations"], info["loss_nearest"], info["loss"]
        r.changed = int(np.count_nonzero(ints != near))
        spec.rounded = ints.astype(near.dtype)
        spec.frozen = True
        enc.frozen = True
        enc.meta["adaround"] = True
        r.seconds = time.perf_counter() - t0
        results.append(r)
        if progress is not None:
            progress(r)


@register_pass
class AdaRound(QuantPass):
    name = "adaround"
    description = "learned weight rounding (AdaRound) of Conv/ConvTranspose/Gemm/MatMul at each layer's bits"
    preserves_semantics = False
    requires = ("quant-context", "plan", "encodings")
    after = "assign-encodings"

    def run(self, ctx) -> PassResult:
        try:
            with bar("adaround", None, ctx.settings.progress, unit="layer") as shown:
                results = adaround(ctx.model, ctx.plan, ctx.samples, progress=lambda r: shown.update(1))
        except DataError as e:
            if "already read once" not in str(e):
                raise
            raise DataError(f"pass 'adaround' reads the calibration samples a second time (after calibrate): "
                            f"{e}") from None
        done = [r for r in results if not r.skipped]
        if done:
            near = sum(r.loss_nearest for r in done)
            loss = sum(r.loss for r in done)
            layers = f"{len(done)} layer{'s' if len(done) != 1 else ''}"
            ctx.notes.append(f"adaround on {layers} ({sum(r.iterations for r in done)} iterations, "
                             f"{sum(r.seconds for r in done):.1f} s): summed layer loss {loss:.4g} against "
                             f"{near:.4g} for round-to-nearest, {sum(r.changed for r in done)} weights rounded "
                             f"the other way")
        for r in results:
            if r.skipped:
                ctx.notes.append(f"adaround skipped {r.op_type} '{r.node[:80]}': {r.skipped}")
        return PassResult(False, {"layers": len(done), "skipped": len(results) - len(done),
                                       "iterations": sum(r.iterations for r in done),
                                       "per_layer": {r.node: {"bits": r.bits, "iterations": r.iterations,
                                                              "loss_nearest": r.loss_nearest, "loss": r.loss,
                                                              "seconds": round(r.seconds, 3)} for r in done}})
