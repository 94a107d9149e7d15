"""Shared by the layer-wise weight optimisers (`seq-mse`, `adaround`): which MatMul/Gemm layers have a weight
the plan quantizes, the order they are optimised in, their inputs captured from the calibration data with the
already-optimised layers before them quantized, and a vectorised fake-quant of candidate grids.

Capture (`SequentialCapture`): ONE onnxruntime session of the float model in which every layer's weight is also
a graph input (an initializer listed among the inputs is an overridable default) and every layer's data input is
an extra output. Feeding a layer's fake-quantized weight (Q then DQ, as onnxruntime will compute it) in place of
the float one runs the partially quantized model without building a second model or session per layer. Layers
are grouped by level: a layer's level is the number of optimised layers on its longest path from the inputs, so
all layers of one level (Q, K and V reading one LayerNorm) see the same partially quantized model and are
captured by one pass over the samples. minilm: 36 layers in 24 levels.

Streaming (`stream_values`): the one path every layer-wise pass uses to see values of the float model (adaround's
Grams, cle's per-channel statistics, seq-mse's rows through `SequentialCapture`): one session with the wanted
values as extra outputs, one `run` per sample, and the sample's arrays handed to the caller, who reduces them
before the next sample is run. Memory: one sample's wanted values at a time (never samples x layer input size);
what a caller keeps is its own, bounded by its own cap (adaround: `max_kept_rows`; seq-mse: `max_rows`). A graph
input among the wanted names comes from the feed. smoothquant (passes/quantize/smoothquant.py) can do the same:
`for i, feed, arrays in stream_values(model, samples, names, where="smoothquant sample"): ...` in place of its
own `calibrate.make_session` loop.

Only weights are quantized in the captured model (activations stay float, as in AIMET's SequentialMse): with
8- or 16-bit activations the weight grid is what the optimisers can change. Memory is bounded: each captured
input keeps at most `max_rows` rows (the leading dims flattened; a fixed-seed subsample spread evenly over at
most `max_samples` samples).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np
import onnx

from qcompiler.onnx_io.exporter import model_to_proto
from qcompiler.ort_session import create_session
from qcompiler.quant.runtime.memory import prepack_weights, release
from qcompiler.quant.calibration.calibrate import extra_output_names, make_session

LAYER_OPS = ("MatMul", "Gemm")
MAX_ROWS = 4096        # rows kept per captured input (x K floats: 64 MB at K = 4096)
MAX_SAMPLES = 128      # calibration samples the capture runs
FLOAT_CACHE_BYTES = 512 << 20   # the float model's layer inputs kept from one pass (minilm: 264 MB of them)


def value_session(model, names, role: str = ""):
    """The session `stream_values` runs: `model` with `names` (those that are not graph inputs) as extra outputs,
    prepacked weights only for a small model (memory.prepack_weights). One session can serve several
    `stream_values` calls over subsets of `names`."""
    graph_inputs = {v.name for v in model.graph.inputs}
    run = [n for n in dict.fromkeys(names) if n not in graph_inputs]
    return make_session(model, extra_outputs=extra_output_names(model, run), role=role,
                        prepack=prepack_weights(model)) if run else None


def stream_values(model, samples, names, where: str = "calibration sample", max_samples: Optional[int] = None,
                  role: str = "", session=None):
    """Yield `(i, feed, {name: array})` per sample for the values `names` of `model` (an IR model), each
    computed by ONE onnxruntime session (`value_session`: built here unless `session` is one made for a superset
    of `names`; the wanted values are extra graph outputs; graph inputs come from the feed; an unknown name is a
    KeyError in the caller). The arrays are the session's own; nothing is kept between samples. A failed run is
    a DataError naming `where` and the sample index. `max_samples`: stop after that many samples. A session
    built here is dropped and its memory handed back when the stream ends."""
    names = list(dict.fromkeys(names))
    graph_inputs = {v.name for v in model.graph.inputs}
    run = [n for n in names if n not in graph_inputs]
    own = session is None
    sess = value_session(model, run, role=role) if own and run else session
    try:
        for i, feed in enumerate(samples):
            if max_samples is not None and i >= max_samples:
                break
            arrays = dict(zip(run, sess.run(run, feed, where=f"{where} {i}"))) if run else {}
            for n in names:
                if n in graph_inputs and n in feed:
                    arrays[n] = feed[n]
            yield i, feed, arrays
    finally:
        if own:
            del sess
            release(collect=True)


@dataclass
class Layer:
    """One MatMul/Gemm whose constant weight (slot 1) the plan quantizes. `kn()` is the weight as [K, N]
    (K the reduction axis, N the output channels): Gemm with transB is transposed."""

    node: object
    spec: object                        # the plan's QuantSpec of (node, 1)
    level: int = 0
    transposed: bool = False            # Gemm transB: the stored weight is [N, K]
    notes: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def weight(self):
        return self.node.inputs[1]

    @property
    def input_name(self) -> str:
        return self.node.inputs[0].name

    def kn(self) -> np.ndarray:
        w = np.asarray(self.weight.const_value(), np.float32)
        return w.T if self.transposed else w

    def stored(self, w_kn: np.ndarray) -> np.ndarray:
        """A [K, N] array back in the weight's own layout."""
        return np.ascontiguousarray(w_kn.T if self.transposed else w_kn)


def weight_layers(model, plan, ops=LAYER_OPS) -> Tuple[List[Layer], Dict[str, str]]:
    """The layers to optimise, in graph order, each with its level; and {node name: why skipped} for the other
    MatMul/Gemm nodes with a quantized weight (main graph only)."""
    g = model.graph
    layers: List[Layer] = []
    skipped: Dict[str, str] = {}
    readers: Dict[str, int] = {}
    for n in g.nodes:
        for v in n.inputs:
            if v is not None:
                readers[v.name] = readers.get(v.name, 0) + 1
    for n in g.nodes:
        if n.op_type not in ops or n.domain not in ("", "ai.onnx"):
            continue
        spec = plan.uses.get((n.name, 1))
        if spec is None or spec.kind != "weight" or spec.keep_float or spec.encoding is None:
            continue
        why = _unsupported(n, spec, readers)
        if why:
            skipped[n.name] = why
            continue
        layers.append(Layer(n, spec, transposed=n.op_type == "Gemm" and bool(n.attr("transB", 0))))
    _levels(g, layers)
    return layers, skipped


def _unsupported(n, spec, readers) -> str:
    if spec.frozen:
        return "frozen encoding (loaded)"
    if len(n.inputs) < 2 or n.inputs[0] is None or n.inputs[1] is None:
        return "no data input"
    w = n.inputs[1]
    arr = w.const_value()
    if arr is None or arr.ndim != 2:
        return "weight is not a 2-D constant"
    if arr.dtype != np.float32:
        return f"weight is {arr.dtype}, not float32"
    if w.tensor is None:
        return "weight is a Constant node's output (not an initializer)"
    if readers.get(w.name, 0) != 1:
        return "weight shared with other nodes"
    if n.op_type == "Gemm" and n.attr("transA", 0):
        return "Gemm with transA"
    enc = spec.encoding
    k_axis = 1 if n.op_type == "Gemm" and n.attr("transB", 0) else 0
    if enc.block_size and (enc.axis is None or enc.axis % 2 != k_axis):
        return "per-block grid not along the reduction axis"
    if not enc.block_size and enc.per_channel and enc.axis % 2 != 1 - k_axis:
        return "per-channel grid not along the output channels"
    return ""


def _levels(g, layers: List[Layer]) -> None:
    """level = how many layers lie on the longest path from the graph inputs to this layer's input."""
    by_node = {id(layer.node): layer for layer in layers}
    depth: Dict[str, int] = {}
    for n in g.nodes:
        d = max((depth.get(v.name, 0) for v in n.inputs if v is not None), default=0)
        layer = by_node.get(id(n))
        if layer is not None:
            layer.level = d
            d += 1
        for v in n.outputs:
            if v is not None:
                depth[v.name] = d


class SequentialCapture:
    """Layer inputs from the calibration samples, with a chosen set of weights fake-quantized (see the module
    docstring). `capture(layers, quantized)` returns {input value name: [rows, K] float32}."""

    def __init__(self, model, layers: List[Layer], samples, max_rows: int = MAX_ROWS,
                 max_samples: int = MAX_SAMPLES, seed: int = 0):

        proto = model_to_proto(model)
        present = {i.name for i in proto.graph.input}
        for layer in layers:
            w = layer.weight
            if w.name in present:
                continue
            arr = w.const_value()
            proto.graph.input.append(onnx.helper.make_tensor_value_info(w.name, onnx.TensorProto.FLOAT,
                                                                        list(arr.shape)))
            present.add(w.name)
        outs = {o.name for o in proto.graph.output}
        self.inputs = []
        for layer in layers:
            if layer.input_name not in self.inputs:
                self.inputs.append(layer.input_name)
        self.graph_inputs = {i.name for i in proto.graph.input}
        for name in self.inputs:
            if name not in outs and name not in present:
                proto.graph.output.append(onnx.ValueInfoProto(name=name))
        self.session = create_session(proto, role="layer-input capture")
        del proto
        self.samples = samples
        self.max_rows, self.max_samples, self.seed = max_rows, max_samples, seed
        total = getattr(samples, "length", None)
        self.expected = min(total, max_samples) if total else max_samples
        self.runs = 0
        self.float_cache: Dict[str, np.ndarray] = {}

    def capture(self, layers: List[Layer], quantized: Dict[str, np.ndarray], float_too: bool = False) \
            -> Dict[str, Tuple[np.ndarray, Optional[np.ndarray]]]:
        """One pass over the samples with `quantized` ({weight name: array in its stored layout}) fed in place
        of the float weights: {input name: (rows [R, K], the same rows from the float model or None)} for the
        data inputs of `layers`, at most max_rows rows each. `float_too`: the float rows as well, from the
        float cache (`cache_float`) when it holds them, else from a second run per sample."""
        names = []
        for layer in layers:
            if layer.input_name not in names:
                names.append(layer.input_name)
        cached = {n: self.float_cache[n] for n in names if n in self.float_cache}
        twice = float_too and bool(quantized) and len(cached) < len(names)
        got, ref = self._run(names, quantized, twice)
        out = {}
        for k in names:
            xf = None
            if float_too:
                xf = cached.get(k) if k in cached else ref[k] if twice else got[k]
            out[k] = (got[k], xf)
        return out

    def cache_float(self, layers: List[Layer], max_bytes: int = FLOAT_CACHE_BYTES) -> int:
        """Keep the float model's rows of every layer input (one pass over the samples), in graph order while
        they fit in `max_bytes`; the rest come from a second run per sample in `capture`. Returns bytes kept."""
        names, total = [], 0
        for layer in layers:
            k = int(layer.kn().shape[0])
            if layer.input_name in names:
                continue
            need = 4 * k * self.max_rows
            if total + need > max_bytes:
                break
            names.append(layer.input_name)
            total += need
        if names:
            got, _ = self._run(names, {}, False)
            self.float_cache.update(got)
        return sum(a.nbytes for a in self.float_cache.values())

    def _run(self, names, quantized, twice):
        per_sample = max(1, -(-self.max_rows // max(self.expected, 1)))
        got: Dict[str, list] = {n: [] for n in names}
        ref: Dict[str, list] = {n: [] for n in names}
        rows: Dict[str, int] = {n: 0 for n in names}
        for i, feed in enumerate(self.samples):
            if i >= self.max_samples:
                break
            fq = dict(feed)
            fq.update(quantized)
            run = [nm for nm in names if nm not in self.graph_inputs]   # graph inputs: from the feed
            got_q = dict(zip(run, self.session.run(run, fq, where=f"calibration sample {i}"))) if run else {}
            got_f = dict(zip(run, self.session.run(run, dict(feed), where=f"calibration sample {i}"))) \
                if twice and run else got_q
            picks: dict = {}
            for name in names:
                a = _rows(got_q[name] if name in got_q else feed[name])
                af = _rows(got_f[name] if name in got_f else feed[name]) if twice else a
                take = min(per_sample, self.max_rows - rows[name], a.shape[0])
                if take <= 0:
                    continue
                if take < a.shape[0]:   # the same rows for every input of this many rows (fixed seed per sample)
                    if (a.shape[0], take) not in picks:
                        rng = np.random.default_rng([self.seed, i])
                        picks[a.shape[0], take] = np.sort(rng.choice(a.shape[0], take, replace=False))
                    pick = picks[a.shape[0], take]
                    a, af = a[pick], af[pick]
                got[name].append(np.ascontiguousarray(a))
                ref[name].append(np.ascontiguousarray(af))
                rows[name] += take
        self.runs += 1

        def cat(d):
            return {k: np.concatenate(v, 0) if v else np.zeros((0, 0), np.float32) for k, v in d.items()}
        return cat(got), (cat(ref) if twice else None)


def _rows(a) -> np.ndarray:
    a = np.asarray(a, np.float32)
    return a.reshape(-1, a.shape[-1]) if a.ndim > 1 else a.reshape(1, -1)


# --------------------------------------------------------------------------- candidate grids

def kn_qparams(layer: Layer, enc) -> Tuple[np.ndarray, np.ndarray]:
    """(scale, zero point) of `enc` in the [K, N] layout, shaped [nb, N] (nb = 1 per channel or per tensor, else
    the number of blocks along K), float32 and int64."""
    scale = np.asarray(enc.scale, np.float32)
    zp = np.broadcast_to(np.asarray(enc.zero_point, np.int64), scale.shape)
    if enc.block_size:
        if layer.transposed:
            scale, zp = scale.T, zp.T
        return np.ascontiguousarray(scale), np.ascontiguousarray(zp)
    if scale.ndim == 0 or scale.size == 1:
        return scale.reshape(1, 1), zp.reshape(1, 1)
    return scale.reshape(1, -1), zp.reshape(1, -1)


def stored_qparams(layer: Layer, scale_kn: np.ndarray, zp_kn: np.ndarray, enc):
    """The inverse of kn_qparams: [nb, N] arrays back into the encoding's own shapes."""
    if enc.block_size and layer.transposed:
        scale_kn, zp_kn = scale_kn.T, zp_kn.T
    scale = np.ascontiguousarray(scale_kn, np.float32).reshape(np.shape(enc.scale))
    zp = np.ascontiguousarray(zp_kn, np.int64)
    zp = zp.reshape(np.shape(enc.zero_point)) if zp.size == np.size(enc.zero_point) else zp.reshape(scale.shape)
    return scale, zp


def fake_quant_kn(w: np.ndarray, scale: np.ndarray, zp: np.ndarray, qmin: int, qmax: int,
                  block: Optional[int]) -> np.ndarray:
    """Q then DQ of a [K, n] weight in float32 as onnxruntime computes it, for any number of candidate grids at
    once: `scale`/`zp` [..., nb, n] give [..., K, n]. nb = 1 (per channel / per tensor) or ceil(K / block)."""
    k, n = w.shape[0], w.shape[-1]
    nb = scale.shape[-2]
    whole = nb > 1 and nb * block == k     # whole blocks: broadcast the scales over each block's rows, no copy
    if whole:
        s = scale.astype(np.float32, copy=False)[..., :, None, :]
        z = zp.astype(np.float32)[..., :, None, :]
        x = w.reshape(nb, block, n)
    else:
        if nb > 1:
            scale = np.repeat(scale, block, axis=-2)[..., :k, :]
            zp = np.repeat(zp, block, axis=-2)[..., :k, :]
        s = scale.astype(np.float32, copy=False)
        z = zp.astype(np.float32)
        x = w
    q = np.rint(x / s)
    q += z
    np.clip(q, qmin, qmax, out=q)
    q -= z
    q *= s
    return q.reshape(q.shape[:-3] + (k, n)) if whole else q
