"""cle: cross-layer equalisation of Conv -> (Relu) -> Conv pairs (Nagel et al. 2019, "Data-Free Quantization", §4.1).

Relu is positively scale-equivariant: Relu(x / s) = Relu(x) / s for s > 0. So output channel i of the first Conv
can be divided by s_i (weight row i and bias i) if input channel i of the second Conv is multiplied by s_i; the
float model computes the same. With r1_i = max|W1[i]| and r2_i = max|W2[:, i]|, s_i = sqrt(r1_i * r2_i) / r2_i
makes both ranges sqrt(r1_i * r2_i): a first Conv whose channels differ 100x in range becomes one a per-tensor
weight grid resolves. Chains of three or more Convs are iterated a few rounds (ROUNDS).

Equalised: Conv -> Relu -> Conv and Conv -> Conv, standard domain, in one graph; the first Conv's output read only
by the Relu (or the second Conv) and not a graph output, the Relu's output read only by the second Conv (as its
data input) and not a graph output. Grouped and depthwise Convs are included on either side: output channel i of
the first Conv is its weight row i whatever its groups, and input channel i of the second Conv is column
i mod (C/g) of the rows of group i // (C/g), so the mapping stays 1:1. Skipped, with a reason in the stats:
activations that are not scale-equivariant (Relu6/Clip with bounds, LeakyRelu, PRelu, ...), weights that are
not float constants of this graph, a weight read by another node (never written: copying it would change
nothing for the reader but double the bytes), protected constants or supergroup members, mismatched channels.
The first Conv's bias is written copy-on-write (`scale_folding.write_constant_input`); scale math is float64.

Where it runs, and what data it has: after fuse-hardswish, before calibrate. fold-batchnorm has already folded
every BatchNorm into its Conv, so the paper's beta/gamma are gone. Inside `qcompiler quantize` the pass sees the
QuantContext: it reads ctx.samples once (one onnxruntime pass, the first Convs' outputs as extra outputs; the
SampleSet rewinds for `calibrate`) and keeps per-channel min, max, mean and std of each pair's pre-activation x
(and E[a], E[a^2] of the activation after it, E[u^2] of the first Conv's input u), updated exactly as it
rescales (x / s) and shifts (x - c). Run on its own (`qcompiler run --pipeline cle`) it has
no data: equalisation as in §4.1, no absorption (stats `not_absorbed` says why).

High-bias absorption (§4.2), before equalisation (the same result as after: c scales with s, and the noise
estimate below then sees the narrowed activation): c_i = max(0, min(mean_i - 3 std_i, min_i)) of x on the
calibration data (the paper's beta - 3 gamma, with mean/std measured instead of read from the folded BN, and
never above the observed minimum): b1 -= c, b2 += sum of W2's window times c. Relu(x) - c = Relu(x - c) holds
exactly where x >= c, i.e. on every calibration sample by construction (other data: where the channel stays
above c, as the paper assumes under its Gaussian model); without an activation it is exact everywhere. Only where
the second Conv does not pad (a padded border sees 0, not c, so the shift would not be a constant), and its
bias is absent (created) or a float [C] constant. It narrows the quantized activation between the pair.
(digits_cnn and ppocr_cls absorb nothing: every pair into an unpadded 1x1 Conv has no channel that stays
positive on all calibration samples; the pairs into padded 3x3/depthwise Convs are skipped for the padding.)

When it equalises (the rule that keeps cle from hurting). Equalising every pair as in §4.1
lowered ppocr_cls agreement, per-channel W8A8 0.9925 -> 0.9825 and per-tensor W8A8 0.965 -> 0.9525:
- with per-channel weights the first Conv's row scaling is free already (its grid is per row): equalising
  buys nothing there, yet channels with s_i < 1 grow in the per-tensor activation between the pair and set a
  wider grid for every other channel (pw -> dw pairs most);
- with per-tensor weights the weights gain and that 8-bit activation loses: on the calibration samples output
  SQNR even rose (15.8 -> 18.1 dB) while on eval.npz it fell (15.4 -> 12.9 dB): channels pushed up to the
  per-tensor max by the rescale have no room left, and clip on data beyond the calibration range.
The rule:
 (1) weights per-channel on the target (the default) -> no equalisation, only absorption (stats `not_equalized`
     gives the reason per pair);
 (2) per-tensor weights with calibration statistics -> per pair, among s_full^t (t = 1/4 .. 1) and, below
     WIDE_ACT_BITS activations, the same with the loudest activation channel held, the s with the least
     estimated output noise at the second Conv (`noise`: both per-tensor weight steps and the activation step,
     weighted by the calibration statistics); below WIDE_ACT_BITS a candidate must keep every channel's headroom
     (`_headroom_kept`: no channel ends nearer the per-tensor max than it was, unless below HEADROOM of it); the
     pair is rescaled only if that noise is MARGIN_DB (6 dB) lower than without, else left alone (the estimate
     ignores clipping and what follows the pair, so it acts only on a clear win);
 (3) per-tensor weights and no statistics (a subgraph, inside quantize) -> not equalised;
 (4) no QuantContext at all (`qcompiler run --pipeline cle`) -> plain §4.1 equalisation, float-exact.
ReLU6/Clip, HardSwish and the other non-equivariant activations are never equalised across (a decomposed
HardSwish is an Add, so no pair), which leaves 6 pairs in ppocr_cls.

"""
from __future__ import annotations

from typing import Optional

import numpy as np
from qcompiler.passes.scale_folding import is_protected, write_constant_input

from qcompiler.errors import DataError
from qcompiler.ir import Graph, Node, Value
from qcompiler.ir.annotations import annotation
from qcompiler.passmanager import Pass, PassResult, register_pass

ROUNDS = 4
SIGMAS = 3.0   # high-bias absorption: c = max(0, min(mean - SIGMAS * std, observed min)) of the pre-activation
EQUIVARIANT = ("Relu",)
NOT_EQUIVARIANT = ("Clip", "Relu6", "LeakyRelu", "PRelu", "Elu", "Selu", "Sigmoid", "Tanh", "HardSigmoid",
                   "HardSwish", "Softplus", "Gelu", "Mish", "ThresholdedRelu", "Celu")
_FLOATS = (np.float16, np.float32, np.float64)


def _std(node: Node) -> bool:
    return node.domain in ("", "ai.onnx")


def _only_reader(v: Value, g: Graph) -> Optional[Node]:
    """The one node of `g` that reads `v` (once), or None."""
    if v is None or v.is_output_of_any_graph():
        return None
    uses = v.uses()
    if len(uses) != 1:
        return None
    user = uses[0].user
    return user if isinstance(user, Node) and user.graph is g else None


def _weight(conv: Node, protected_ok: bool = False):
    """(weight value, float array) or (None, reason)."""
    w = conv.inputs[1] if len(conv.inputs) > 1 else None
    arr = None if w is None else w.const_value()
    if arr is None or arr.dtype not in _FLOATS or arr.ndim < 3:
        return None, f"Conv '{conv.name[:80]}' weight is not a float constant"
    if w.graph is not conv.graph:
        return None, f"Conv '{conv.name[:80]}' weight '{w.name[:80]}' is an outer-scope value"
    if len(w.uses()) != 1:
        return None, f"Conv '{conv.name[:80]}' weight '{w.name[:80]}' is shared ({len(w.uses())} readers)"
    if is_protected(w):
        return None, f"Conv '{conv.name[:80]}' weight '{w.name[:80]}' is protected"
    return (w, arr), None


def _pair(g: Graph, c1: Node):
    """(c1, act or None, c2) if c1 starts an equalisable pair, (None, reason) if it starts a pair that must be
    skipped, (None, "") if it starts no pair at all."""
    x = c1.outputs[0]
    r = _only_reader(x, g)
    if r is None or not _std(r):
        return None, ""
    act = None
    if r.op_type in EQUIVARIANT or r.op_type in NOT_EQUIVARIANT:
        act = r
        r = _only_reader(act.outputs[0], g) if act.outputs else None
        if r is None or r.op_type != "Conv" or not _std(r):
            return None, ""
        if act.op_type not in EQUIVARIANT:
            return None, f"{act.op_type} '{act.name[:80]}' is not scale-equivariant"
        if act.inputs[0] is not x:
            return None, ""
    elif r.op_type != "Conv":
        return None, ""
    c2 = r
    data = act.outputs[0] if act is not None else x
    if not c2.inputs or c2.inputs[0] is not data or any(v is data for v in c2.inputs[1:]):
        return None, f"Conv '{c2.name[:80]}' reads '{data.name[:80]}' other than as its data input"
    for n in (c1, act, c2):
        if n is not None and (annotation(n, "supergroup") or annotation(n, "protected")):
            return None, f"{n.op_type} '{n.name[:80]}' is part of a recognised structure"
    return (c1, act, c2), None


def _check(c1: Node, c2: Node) -> Optional[str]:
    """Reason the weights of a pair cannot be equalised, or None."""
    a, why = _weight(c1)
    if why:
        return why
    b, why = _weight(c2)
    if why:
        return why
    w1, w2 = a[1], b[1]
    g2 = int(c2.attr("group", 1))
    if g2 < 1 or w1.shape[0] != g2 * w2.shape[1] or w2.shape[0] % g2:
        return f"channels do not line up: '{c1.name[:80]}' has {w1.shape[0]} outputs, '{c2.name[:80]}' " \
               f"reads {g2} x {w2.shape[1]}"
    bias = c1.inputs[2] if len(c1.inputs) > 2 else None
    if bias is not None:
        arr = bias.const_value()
        if arr is None or arr.dtype not in _FLOATS or arr.shape != (w1.shape[0],):
            return f"Conv '{c1.name[:80]}' bias is not a float [{w1.shape[0]}] constant"
        if is_protected(bias):
            return f"Conv '{c1.name[:80]}' bias '{bias.name[:80]}' is protected"
    return None


def _in_ranges(w2: np.ndarray, g2: int) -> np.ndarray:
    """max |W2[:, i]| per input channel i of a Conv with `g2` groups (input channel i = column i % cpg of the
    output rows of group i // cpg)."""
    cpg = w2.shape[1]
    a = np.abs(w2.astype(np.float64)).reshape(g2, w2.shape[0] // g2, cpg, -1)
    return a.max(axis=(1, 3)).reshape(-1)


def _scale(c1: Node, c2: Node) -> np.ndarray:
    """s of one full equalisation step: sqrt(r1 r2) / r2 per channel (1 where a range is 0)."""
    w1 = c1.inputs[1].const_value()
    w2 = c2.inputs[1].const_value()
    r1 = np.abs(w1.astype(np.float64)).reshape(w1.shape[0], -1).max(axis=1)
    r2 = _in_ranges(w2, int(c2.attr("group", 1)))
    with np.errstate(divide="ignore", invalid="ignore"):
        s = np.sqrt(r1 * r2) / r2
    s = np.where(np.isfinite(s) & (s > 0) & (r1 > 0) & (r2 > 0), s, 1.0)
    return s


def rescale(c1: Node, c2: Node, s: np.ndarray) -> float:
    """Divide output channel i of c1 (weight row, bias) by s_i and multiply input channel i of c2 by s_i (float64
    math, written back in the weights' dtype); returns max |log s| (0 and nothing written when s is all 1)."""
    if np.all(np.abs(s - 1.0) < 1e-7):
        return 0.0
    w1 = c1.inputs[1].const_value()
    w2 = c2.inputs[1].const_value()
    g2 = int(c2.attr("group", 1))
    shape1 = (-1,) + (1,) * (w1.ndim - 1)
    new1 = (w1.astype(np.float64) / s.reshape(shape1)).astype(w1.dtype)
    cpg = w2.shape[1]
    s2 = s.reshape(g2, 1, cpg, 1)
    new2 = (w2.astype(np.float64).reshape(g2, w2.shape[0] // g2, cpg, -1) * s2).reshape(w2.shape).astype(w2.dtype)
    write_constant_input(c1, 1, new1)
    write_constant_input(c2, 1, new2)
    bias = c1.inputs[2] if len(c1.inputs) > 2 else None
    if bias is not None:
        b = bias.const_value()
        write_constant_input(c1, 2, (b.astype(np.float64) / s).astype(b.dtype))
    return float(np.max(np.abs(np.log(s))))


def equalize(c1: Node, c2: Node) -> float:
    """One full equalisation step of a checked pair; returns max |log s| (0 when already balanced)."""
    return rescale(c1, c2, _scale(c1, c2))


def _absorb_check(c2: Node) -> Optional[str]:
    """Reason c2 cannot take a constant shift of its input into its bias exactly, or None."""
    pads = [int(p) for p in (c2.attr("pads", None) or [])]
    auto = c2.attr("auto_pad", "NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else str(auto)
    w2 = c2.inputs[1].const_value()
    if any(pads) or auto not in ("NOTSET", "VALID") and any(k != 1 for k in w2.shape[2:]):
        return f"Conv '{c2.name[:80]}' pads its input (a shift is not constant at the borders)"
    bias = c2.inputs[2] if len(c2.inputs) > 2 else None
    if bias is not None:
        arr = bias.const_value()
        if arr is None or arr.dtype not in _FLOATS or arr.shape != (w2.shape[0],):
            return f"Conv '{c2.name[:80]}' bias is not a float [{w2.shape[0]}] constant"
        if is_protected(bias):
            return f"Conv '{c2.name[:80]}' bias '{bias.name[:80]}' is protected"
    return None


def absorb(c1: Node, c2: Node, c: np.ndarray) -> None:
    """b1 -= c, b2 += sum over W2's window of W2 * c (per group): exact where the pre-activation x >= c."""
    w1 = c1.inputs[1].const_value()
    w2 = c2.inputs[1].const_value()
    g2 = int(c2.attr("group", 1))
    cpg = w2.shape[1]
    b1 = c1.inputs[2].const_value() if len(c1.inputs) > 2 and c1.inputs[2] is not None else None
    b2 = c2.inputs[2].const_value() if len(c2.inputs) > 2 and c2.inputs[2] is not None else None
    old1 = np.zeros(w1.shape[0]) if b1 is None else b1.astype(np.float64)
    old2 = np.zeros(w2.shape[0]) if b2 is None else b2.astype(np.float64)
    k = w2.astype(np.float64).reshape(g2, w2.shape[0] // g2, cpg, -1).sum(axis=3)
    shift = (k * c.reshape(g2, 1, cpg)).sum(axis=2).reshape(-1)
    write_constant_input(c1, 2, (old1 - c).astype(w1.dtype if b1 is None else b1.dtype), f"{c1.name}.bias")
    write_constant_input(c2, 2, (old2 + shift).astype(w2.dtype if b2 is None else b2.dtype), f"{c2.name}.bias")


class _Stats:
    """Per-channel statistics of a pair on the calibration samples, kept in the current units as the pass rescales
    (x / s) and shifts (x - c) the pre-activation x (c1's output): lo/hi/mean/std of x, E[a] and E[a^2] of the
    activation a the second Conv reads (Relu(x) or x), and E[u^2] per channel of c1's input u."""

    def __init__(self, lo, hi, mean, std, amean, asq, usq, relu):
        self.lo, self.hi, self.mean, self.std = lo, hi, mean, std
        self.amean, self.asq, self.usq, self.relu = amean, asq, usq, relu

    def act_range(self):
        """(lo, hi) per channel of a."""
        return (np.maximum(self.lo, 0.0), np.maximum(self.hi, 0.0)) if self.relu else (self.lo, self.hi)

    def act_max(self) -> np.ndarray:
        lo, hi = self.act_range()
        return np.maximum(np.abs(lo), np.abs(hi))

    def scale(self, s):
        self.lo, self.hi, self.mean, self.std = self.lo / s, self.hi / s, self.mean / s, self.std / s
        self.amean, self.asq = self.amean / s, self.asq / (s * s)

    def shift(self, c):
        """x -= c with c <= lo where c > 0 (there Relu is the identity on the data: a shifts by c too)."""
        self.asq = self.asq - 2 * c * self.amean + c * c
        self.amean = self.amean - c
        self.lo, self.hi, self.mean = self.lo - c, self.hi - c, self.mean - c


def _collect(ctx, model, pairs) -> dict:
    """{c1 name: _Stats} of the main-graph pairs, from one onnxruntime pass over ctx.samples."""
    g = model.graph
    main = [p for p in pairs if p[0].graph is g]
    inputs = {v.name for v in g.inputs}
    names = []
    for c1, _, _ in main:
        for v in (c1.outputs[0], c1.inputs[0]):
            if v.name not in names and v.name not in inputs:
                names.append(v.name)
    if not main:
        return {}
    acc, n = {}, 0

    def add(key, parts):
        if key not in acc:
            acc[key] = list(parts)
        elif all(np.shape(o) == np.shape(q) for o, q in zip(acc[key], parts)):
            o = acc[key]
            acc[key] = [np.minimum(o[0], parts[0]), np.maximum(o[1], parts[1])] + [u + w for u, w in
                                                                                   zip(o[2:], parts[2:])]

    # one sample's values at a time, reduced at once (layer_inputs.stream_values: the shared capture path)
    # NOTE: imported here: the capture path is the calibration stack and onnxruntime, which `qcompiler run` would
    # otherwise import for every pipeline, since registering the graph passes imports this module
    from qcompiler.quant.calibration.layer_inputs import stream_values
    wanted = names + [v.name for c1, _, _ in main for v in (c1.outputs[0], c1.inputs[0]) if v.name in inputs]
    for i, feed, arrays in stream_values(model, ctx.samples, wanted, where="cle sample"):
        for c1, act, _ in main:
            for v, is_out in ((c1.outputs[0], True), (c1.inputs[0], False)):
                a = arrays.get(v.name)
                a = None if a is None else np.asarray(a, np.float64)
                if a is None or a.ndim < 2 or not a.size:
                    continue
                x = np.moveaxis(a, 1, 0).reshape(a.shape[1], -1)
                if is_out:
                    r = np.maximum(x, 0.0) if act is not None else x
                    add(("x", c1.name), (x.min(axis=1), x.max(axis=1), x.sum(axis=1), (x * x).sum(axis=1),
                                         r.sum(axis=1), (r * r).sum(axis=1), x.shape[1]))
                else:
                    add(("u", c1.name), (x.min(axis=1), x.max(axis=1), (x * x).sum(axis=1), x.shape[1]))
        n += 1
    if n == 0:
        raise DataError("empty sample set (0 samples)")
    out = {}
    for c1, act, _ in main:
        a, u = acc.get(("x", c1.name)), acc.get(("u", c1.name))
        w1 = c1.inputs[1].const_value()
        if a is None or u is None or a[0].shape != (w1.shape[0],) or \
                u[0].shape[0] != int(c1.attr("group", 1)) * w1.shape[1]:
            continue
        mean = a[2] / a[6]
        std = np.sqrt(np.maximum(a[3] / a[6] - mean * mean, 0.0))
        out[c1.name] = _Stats(a[0], a[1], mean, std, a[4] / a[6], a[5] / a[6], u[2] / u[3], act is not None)
    return out


def noise(c1: Node, c2: Node, st: "_Stats", s: np.ndarray, wbits: int, abits: int) -> float:
    """Estimated quantization noise power at c2's output after rescaling the pair by `s`, with per-tensor
    symmetric weights (wbits) and a per-tensor activation grid (abits) between them (common 1/12 dropped):
        sum_i (F1_i D1^2 + Da^2) s_i^2 |W2[:, i]|^2  +  D2^2 K2 (C2/g2) sum_i E[a_i^2] / s_i^2
    D1, D2: the weight steps (max range / (2^(wbits-1) - 1)) after the rescale; Da: the activation step; F1_i:
    the energy of c1's input patch feeding channel i (K1 * sum of E[u^2] over its group)."""
    w1 = c1.inputs[1].const_value()
    w2 = c2.inputs[1].const_value().astype(np.float64)
    g1, g2 = int(c1.attr("group", 1)), int(c2.attr("group", 1))
    qw, qa = 2.0 ** (wbits - 1) - 1, 2.0 ** abits - 1
    r1 = np.abs(w1.astype(np.float64)).reshape(w1.shape[0], -1).max(axis=1)
    r2 = _in_ranges(w2, g2)
    d1 = float(np.max(r1 / s)) / qw
    d2 = float(np.max(r2 * s)) / qw
    lo, hi = st.act_range()
    da = (max(float(np.max(hi / s)), 0.0) - min(float(np.min(lo / s)), 0.0)) / qa
    k1 = int(np.prod(w1.shape[2:])) if w1.ndim > 2 else 1
    f1 = k1 * st.usq.reshape(g1, -1).sum(axis=1).repeat(w1.shape[0] // g1)
    cpg = w2.shape[1]
    col = (w2.reshape(g2, w2.shape[0] // g2, cpg, -1) ** 2).sum(axis=(1, 3)).reshape(-1)
    k2 = int(np.prod(w2.shape[2:])) if w2.ndim > 2 else 1
    first = float(np.sum((f1 * d1 * d1 + da * da) * s * s * col))
    second = d2 * d2 * k2 * (w2.shape[0] // g2) * float(np.sum(st.asq / (s * s)))
    return first + second


WIDE_ACT_BITS = 16   # activations this wide have levels to spare: channels between a pair may grow
HEADROOM = 0.5   # below WIDE_ACT_BITS a channel may rise to at most this fraction of the per-tensor max
MARGIN_DB = 6.0   # a pair is equalised only when its estimated output noise falls by at least this much
TRIES = (0.0, 0.25, 0.5, 0.75, 1.0)   # fractions (in log s) of the full equalisation step that `choose` compares


def _headroom_kept(m: np.ndarray, s: np.ndarray) -> bool:
    """True if no channel of the activation (per-channel max m) ends nearer the per-tensor max than it was, unless
    it stays within HEADROOM of it: channels that never reached the calibration range's top keep room to grow on
    other data."""
    top, new = float(m.max(initial=0.0)), m / s
    if top <= 0:
        return True
    return bool(np.all(new / float(new.max()) <= np.maximum(m / top, HEADROOM) + 1e-9))


def choose(c1: Node, c2: Node, st: "_Stats", wbits: int, abits: int) -> np.ndarray:
    """The s among s_full^t (t in TRIES; t = 0 is no change) and, below WIDE_ACT_BITS, the same with the loudest
    activation channel held (no channel grows), that keeps the headroom (`_headroom_kept`, below WIDE_ACT_BITS)
    and has the least estimated output noise (`noise`); no change unless that noise is MARGIN_DB lower."""
    full = _scale(c1, c2)
    m = st.act_max()
    bases = [full]
    if abits < WIDE_ACT_BITS:
        bases.append(np.maximum(full / full[int(np.argmax(m))], 1.0))
    none = noise(c1, c2, st, np.ones_like(full), wbits, abits)
    best, best_n = np.ones_like(full), none
    for base in bases:
        for t in TRIES[1:]:
            s = np.power(base, t)
            if abits < WIDE_ACT_BITS and not _headroom_kept(m, s):
                continue
            n = noise(c1, c2, st, s, wbits, abits)
            if n < best_n * (1 - 1e-6):
                best, best_n = s, n
    return best if best_n <= none * 10 ** (-MARGIN_DB / 10) else np.ones_like(full)


def _per_channel_weights(ctx) -> bool:
    """True when Conv weights get per-channel (or per-block) grids on this run's target."""
    st = ctx.settings
    if not st.per_channel and not st.weight_block:
        return False
    ops = getattr(ctx.profile, "per_channel_ops", None)
    if ops is None and isinstance(ctx.profile, dict):
        ops = ctx.profile.get("per_channel_ops")
    return ops is None or "Conv" in ops


@register_pass
class CrossLayerEqualization(Pass):
    """Equalise the weight ranges of Conv -> Relu -> Conv pairs (bodies too); outputs unchanged."""

    name = "cle"
    description = "cross-layer equalisation: rescale Conv -> Relu -> Conv channel pairs so per-tensor weight " \
                  "grids fit (Nagel et al. 2019)"
    preserves_semantics = True
    after = "fuse-hardswish"

    def apply(self, model, context=None) -> PassResult:
        quant = context if hasattr(context, "settings") and hasattr(context, "samples") else None
        return self.run(model, quant)

    def run(self, model, ctx=None) -> PassResult:
        pairs, skipped = [], {}
        for g in model.graphs():
            for c1 in g.nodes_by_op("Conv"):
                if not _std(c1) or c1.graph is not g:
                    continue
                found, why = _pair(g, c1)
                if found is None:
                    if why:
                        skipped[c1.name] = why
                    continue
                why = _check(found[0], found[2])
                if why:
                    skipped[c1.name] = why
                    continue
                pairs.append(found)
        stats = _collect(ctx, model, pairs) if ctx is not None and ctx.samples is not None and pairs else {}
        per_channel = ctx is not None and _per_channel_weights(ctx)
        to_equalize, not_equalized = [], {}
        for pair in pairs:
            c1 = pair[0]
            if per_channel:
                not_equalized[c1.name] = "weights are per-channel: equalising gains them nothing and can widen " \
                                         "the activation between the pair"
            elif ctx is not None and c1.name not in stats:
                not_equalized[c1.name] = "no calibration statistics here (subgraph): the activation's range " \
                                         "cannot be checked"
            else:
                to_equalize.append(pair)
        absorbed, not_absorbed = {}, {}
        for c1, act, c2 in pairs:
            st = stats.get(c1.name)
            if st is None:
                not_absorbed[c1.name] = "no calibration statistics of the pre-activation at this position"
                continue
            why = _absorb_check(c2)
            if why:
                not_absorbed[c1.name] = why
                continue
            c = np.maximum(0.0, np.minimum(st.mean - SIGMAS * st.std, st.lo))
            if not np.any(c > 0):
                continue
            absorb(c1, c2, c)
            st.shift(np.where(c > 0, c, 0.0))
            absorbed[c1.name] = int(np.count_nonzero(c > 0))
        wbits = int(ctx.settings.weight_bits) if ctx is not None else 8
        abits = int(ctx.settings.act_bits) if ctx is not None else 8
        rounds, changed = 0, set()
        for rounds in range(1, ROUNDS + 1):
            moved = 0.0
            for c1, act, c2 in to_equalize:
                st = stats.get(c1.name)
                s = choose(c1, c2, st, wbits, abits) if st is not None else _scale(c1, c2)
                step = rescale(c1, c2, s)
                if step > 0:
                    changed.add(c1.name)
                    if st is not None:
                        st.scale(s)
                moved = max(moved, step)
            if moved < 1e-3:
                break
        for c1, _, _ in to_equalize:
            if c1.name not in changed and c1.name in stats:
                not_equalized[c1.name] = f"no scale lowers the estimated output noise by {MARGIN_DB:g} dB while " \
                                         f"keeping the activation's headroom"
        if ctx is not None and pairs:
            ctx.notes.append(f"cle: {len(pairs)} Conv pairs, {len(changed)} equalised, {len(absorbed)} with high "
                             f"biases absorbed" + (f"; not equalised: {next(iter(not_equalized.values()))}"
                                                   if not_equalized else ""))
        return PassResult(bool(changed or absorbed),
                          {"equalized": len(changed), "pairs": len(pairs), "rounds": rounds if to_equalize else 0,
                           "skipped": len(skipped), "skipped_reasons": skipped, "not_equalized": not_equalized,
                           "absorbed": absorbed, "not_absorbed": not_absorbed,
                           "statistics": "calibration" if stats else "none (data-free)"})
