"""QDQ insertion: turn a plan with encodings into QuantizeLinear/DequantizeLinear pairs in the graph.

- Activations: one Q→DQ right after the producer, and every use (graph-output uses included) reads the DQ; a
  graph output keeps its name (the IR's insert_after swaps names) and its position.
- Weights: stored quantized (int8, or int4/int16 at opset 21) with one DequantizeLinear per distinct
  (weight, axis, grid); consumers that agree share it, consumers that differ (a weight read by a Gemm with
  transB=1 and one with transB=0) get their own copy. The float original is dropped when no one reads it
  (Constant nodes included).
- Bias: int32 with scale = s_input * s_weight (per channel when the weight is), zero point 0, as ORT's QDQ
  Conv/Gemm fusions expect; left float when the input or weight is float or the int32 grid would overflow.
- float16/bfloat16 values (fp16 exports, keep_io_types models: a value's own float type decides, not the
  model's): `float_route` picks, once per Q/DQ, how the pair meets the value. float16 at opset >= 19: scales in
  float16, so Q reads and DQ writes float16 (onnxruntime 1.32 CPU runs float16 Q/DQ for every grid, per-axis
  and per-block). Otherwise (opset 13..18, bfloat16 at any opset: onnx allows bfloat16 scales from 19 but
  onnxruntime CPU has no bfloat16 Q/DQ kernel, and scales below float16's smallest normal, e.g. an int32
  bias's s_in*s_w): float32 scales between Casts, Cast(to float32) -> Q -> DQ -> Cast(back), and a weight's or
  bias's DQ is followed by one Cast to the weight's type. Weights stored on their grid keep their float type.
  Every consumer reads the type it read in the float model.
- Data movement after a signed 8-bit per-tensor DQ (opset >= 21): its output gets a Q->DQ of its own on the same
  grid (same scale and zero point tensors), `pin_propagated_grids`. onnxruntime's QDQPropagationTransformer
  would insert that pair itself, and since onnxruntime 1.32 (PR #28144) its Q carries `output_dtype` INT8; then
  QDQS8ToU8Transformer (ORT_ENABLE_EXTENDED and up) turns the pair's zero point into uint8 and leaves the
  attribute, and the session refuses the model ("output_dtype INT8 does not match y_zero_point type UINT8"):
  K^T and V of attention on qnn_htp/aimet (symmetric, placement/dynamic_weights.py; data-movement outputs
  unquantized), or an int8 value read by a Reshape only for its shape on trt. The values are the same either
  way (data movement keeps a value on its grid); the pinned pair is no quantizer of the plan: `remove_qdq`
  takes it out with its source pair, the encodings and the report do not list it.
  The same break without data movement in our graph: onnxruntime's MatMulAddFusion turns a MatMul of a 3-D input
  (static shape) read only by an Add into Reshape -> Gemm -> Reshape and propagation then runs over its Reshape
  (trt: int8 activations, the bias Add left unquantized). A signed 8-bit DQ with zero point 0 read by such a
  MatMul is written without its zero point (0 is the default, the int8 input gives the type): onnxruntime's Q
  then carries none either and QDQS8ToU8 leaves the pair as it is.
"""
from __future__ import annotations

from typing import Dict, NamedTuple, Optional, Tuple

import ml_dtypes
import numpy as np
from onnx import TensorProto
from onnx.helper import tensor_dtype_to_np_dtype

from qcompiler.quant.calibration.observers import weight_range
from qcompiler.quant.core.encoding import (
    Encoding,
    broadcast_qparams,
    compute_encoding,
    dequantize_linear,
    per_tensor,
    quantize_dequantize,
    scalar,
)
from qcompiler.quant.core.plan import FLOAT_ON_GRID, INT, QuantPlan, QuantSpec
from qcompiler.quant.runtime.memory import drop_cached

INT32_MAX = 2 ** 31 - 1
F32 = np.dtype(np.float32)
NATIVE_SCALE_OPSET = {TensorProto.FLOAT: 13, TensorProto.FLOAT16: 19}   # bfloat16: onnxruntime CPU has no kernel
FP16_TINY = float(np.finfo(np.float16).tiny)     # smallest normal float16: below it a scale loses precision


class FloatRoute(NamedTuple):
    """How one Q/DQ pair meets a value of float type `elem` (onnx enum): its scale's numpy dtype, and whether
    Casts to float32 and back surround it (`float_route`)."""
    elem: int
    scale: np.dtype
    cast: bool


def float_route(elem: Optional[int], opset: int, scale=None) -> FloatRoute:
    """The one rule for a value of float type `elem` (None: float32) quantized at `opset` with `scale`:
    its own type as the scale's type when the opset and onnxruntime allow it and every scale is a normal
    number in that type, else float32 scales between Casts (module docstring)."""
    elem = elem or TensorProto.FLOAT
    if elem == TensorProto.FLOAT or elem not in FLOAT_ELEMS:
        return FloatRoute(TensorProto.FLOAT, F32, False)
    if opset >= NATIVE_SCALE_OPSET.get(elem, 10 ** 6):
        s = np.abs(np.asarray(scale, np.float64)) if scale is not None else None
        if s is None or (np.all(s >= FP16_TINY) and np.all(s <= float(np.finfo(np.float16).max))):
            return FloatRoute(elem, np.dtype(np.float16), False)
    return FloatRoute(elem, F32, True)


FLOAT_ELEMS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)


def np_float(elem: int) -> np.dtype:
    """numpy dtype of an onnx float type (bfloat16: ml_dtypes')."""
    return np.dtype(tensor_dtype_to_np_dtype(elem))


def float_elem(v, dtypes: Optional[dict] = None) -> int:
    """The onnx float type of value `v`: its initializer's or declared type, else calibration's runtime dtype
    (`dtypes`, name -> numpy dtype), else float32. Reads no tensor data."""
    if dtypes is not None and v.name in dtypes and v.tensor is None:
        dt = np.dtype(dtypes[v.name])
        elem = {np.dtype(np.float16): TensorProto.FLOAT16, F32: TensorProto.FLOAT}.get(dt)
        if elem is None and dt.name == "bfloat16":
            elem = TensorProto.BFLOAT16
        if elem is not None:
            return elem
    elem = v.dtype
    return elem if elem in FLOAT_ELEMS else TensorProto.FLOAT


def storage_dtype(enc: Encoding) -> np.dtype:
    """numpy storage type of an integer grid (int4/uint4 are stored through onnx's packed types at export)."""
    if enc.bits > 16:
        return np.dtype(np.int32)
    if enc.bits > 8:
        return np.dtype(np.int16 if enc.signed else np.uint16)
    return np.dtype(np.int8 if enc.signed else np.uint8)


def qparam_arrays(enc: Encoding, what: str = "encoding") -> Tuple[np.ndarray, np.ndarray]:
    """(float32 scale, int64 zero point) as Q/DQ want them: 0-d for a per-tensor encoding (whatever shape of
    size 1 it holds: (), (1,), (1, 1)), the scale's shape for per-channel and per-block (zero point broadcast)."""
    if per_tensor(enc):
        return (np.asarray(scalar(enc.scale, f"{what} scale"), np.float32),
                np.asarray(scalar(enc.zero_point, f"{what} zero point"), np.int64))
    scale = np.asarray(enc.scale, np.float32)
    return scale, np.broadcast_to(np.asarray(enc.zero_point, np.int64), scale.shape).copy()


def fit_scale(enc: Encoding, scale_dtype=F32) -> np.ndarray:
    """`enc`'s scale array (qparam_arrays' shape) in `scale_dtype`, float_route's choice. A float16 scale is the
    float16 nearest (at least the smallest normal: float_route checked the range, the safety net's widening did
    not), and the encoding takes that value: the report, an encodings file and the safety net's match then
    hold the scale the model computes with."""
    scale_arr = qparam_arrays(enc)[0]
    if np.dtype(scale_dtype) == F32:
        return scale_arr
    scale_arr = np.clip(scale_arr, FP16_TINY, None).astype(scale_dtype)
    enc.scale = scale_arr.astype(np.float32).reshape(np.shape(enc.scale))
    return scale_arr


def _qparams(g, enc: Encoding, hint: str, scale_dtype=F32):
    """Scale (in `scale_dtype`: fit_scale) and zero point constants of `enc` in graph `g`."""
    scale_arr, zp_arr = qparam_arrays(enc, f"encoding of '{hint[:80]}'")
    scale = g.add_constant(fit_scale(enc, scale_dtype), f"{hint}_scale")
    zp_arr = zp_arr.astype(storage_dtype(enc))
    if enc.bits < 8:
        zp_arr = _as_int4(zp_arr, enc.signed)
    zp = g.add_constant(zp_arr, f"{hint}_zero_point")
    return scale, zp


def _as_int4(arr: np.ndarray, signed: bool):
    """Tensor payload for int4/uint4: onnx's ml_dtypes-backed int4 types (the IR stores numpy)."""
    return arr.astype(ml_dtypes.int4 if signed else ml_dtypes.uint4)


_broadcast_qparams = broadcast_qparams   # float64, for the export-time Q of weights (_quantize_array)


def block_encoding(w: np.ndarray, axis: int, block_size: int, bits: int, symmetric: bool = True,
                   scheme: str = "min_max", range_bits: Optional[int] = None) -> Encoding:
    """Per-block weight encoding: one (scale, zero point) per `block_size` consecutive elements along `axis`.

    The scale has the weight's shape with dim `axis` = ceil(K / block_size), which is what opset-21
    DequantizeLinear's `block_size` attribute expects (MatMul B [K, N]: axis 0, blocks along K). A partial last
    block is padded with zeros for the range search (ranges include 0 anyway). A Conv/ConvTranspose weight
    (rank > 2, blocked along axis 1 or 0) gets one grid per (output channel, block) for the whole kernel window,
    as AIMET quantizes it: its scales are equal across the kernel dims, so the encodings file holds
    AIMET's (Cout, Cin/bs, 1, 1) while the DQ keeps the (Cout, Cin/bs, kh, kw) onnxruntime asks for.
    """
    w = np.asarray(w, np.float64)
    axis = axis % w.ndim
    k = w.shape[axis]
    # NOTE: a block longer than the axis is one block of K: padding it to `block_size` rows allocated
    # block_size - K rows (--block-size 2**30 on a K=64 weight: tens of GB); the DQ keeps the size asked for
    block = max(1, min(block_size, k))
    nb = -(-k // block)
    moved = np.moveaxis(w, axis, 0)                                  # [K, rest...]
    if nb * block != k:
        pad = np.zeros((nb * block - k,) + moved.shape[1:])
        moved = np.concatenate([moved, pad], axis=0)
    rest = moved.shape[1:]
    keep = rest[:1] if w.ndim > 2 and axis in (0, 1) else rest      # the kernel window shares one grid
    window = int(np.prod(rest[len(keep):], dtype=np.int64))
    groups = np.moveaxis(moved.reshape((nb, block) + rest), 1, 1 + len(keep)).reshape(-1, block * window)
    rb = range_bits or bits
    lo, hi = weight_range(groups, 0, scheme, rb, symmetric)
    lo, hi = (np.moveaxis(np.broadcast_to(np.asarray(x).reshape((nb,) + keep + (1,) * (len(rest) - len(keep))),
                                          (nb,) + rest), 0, axis) for x in (lo, hi))
    enc = compute_encoding(lo, hi, bits=rb, symmetric=symmetric, signed=True, axis=axis)
    enc.bits, enc.block_size = bits, int(block_size)
    enc.meta["range_bits"] = rb
    return enc


def assign_block_encodings(plan: QuantPlan, model, scheme: str = "min_max") -> int:
    """Give every per-block weight use (spec.block_size) its block encoding; frozen ones stay. Returns the count."""
    by_name = plan.nodes
    done = 0
    for (node_name, slot), spec in plan.uses.items():
        if spec.kind != "weight" or spec.keep_float or not spec.block_size or spec.axis is None:
            continue
        if spec.frozen and spec.encoding is not None:
            continue
        w = by_name[node_name].inputs[slot].const_value()
        spec.encoding = block_encoding(w, spec.axis, spec.block_size, spec.bits, spec.symmetric, scheme,
                                       spec.range_bits)
        done += 1
    return done


def _dq_attrs(enc: Encoding):
    if enc.block_size:
        return {"axis": int(enc.axis), "block_size": int(enc.block_size)}
    return {"axis": int(enc.axis)} if enc.per_channel else None


def _quantize_array(w: np.ndarray, enc: Encoding) -> np.ndarray:
    scale, zp = _broadcast_qparams(enc, np.shape(w))
    # NOTE: in place: one float64 temporary, not four (a 256 MB float32 weight of a 2 GB model: 0.5 GB, not 2 GB)
    q = np.array(w, np.float64)
    if np.broadcast_shapes(q.shape, np.shape(scale), np.shape(zp)) != q.shape:   # a scalar weight, (1,) scale
        q = np.clip(np.round(q / scale) + zp, enc.qmin, enc.qmax)
        return q.astype(storage_dtype(enc))
    q /= scale
    np.round(q, out=q)
    q += zp
    np.clip(q, enc.qmin, enc.qmax, out=q)
    return q.astype(storage_dtype(enc))


def _on_grid(q: np.ndarray, enc: Encoding) -> np.ndarray:
    """The float32 values ORT's DequantizeLinear computes from the stored grid `q` (8 to 32 bits, no blocks):
    what a FLOAT_ON_GRID parameter holds, bit-identical to the explicit DQ."""
    scale, zp = qparam_arrays(enc)
    return dequantize_linear(q, scale, zp.astype(q.dtype), int(enc.axis) if enc.per_channel else 1)


def constant_dq_value(dq) -> Optional[np.ndarray]:
    """The output of a DequantizeLinear node (IR) that reads only constants, as onnxruntime computes it, in its
    scale's type, or None for a blocked or unusual one: what a reader gets from a weight stored on its grid
    instead (onnxruntime does not constant-fold DQ in QDQ models, so the DQ would run on every call)."""
    if dq.attr("block_size"):
        return None
    arrs = [x.const_value() if x is not None else None for x in dq.inputs]
    if len(arrs) < 2 or any(a is None for a in arrs):
        return None
    try:
        q, scale = np.asarray(arrs[0]), np.asarray(arrs[1])
        zp = np.asarray(arrs[2]) if len(arrs) > 2 else np.zeros((), q.dtype)
        axis = int(dq.attr("axis", 1))
        return np.asarray(dequantize_linear(q, scale, zp.astype(q.dtype), axis if scale.ndim else 1), scale.dtype)
    except Exception:   # noqa: BLE001 - a form this does not know keeps its DQ node
        return None


def _write_on_grid(g, members: list, values: np.ndarray, dq_name: str) -> None:
    """One float32 constant on the grid for the FLOAT_ON_GRID `members` [(node, slot, value, enc, spec)];
    `dq_name` is the name a DQ output would have had: the report lists the parameter under it (without its
    `_dequantized` suffix: the weight's own name unless a second grid of the weight took it)."""
    grid = g.add_constant(values, f"{dq_name}_prefolded")
    shown = dq_name[:-len("_dequantized")] if dq_name.endswith("_dequantized") else dq_name
    for node, slot, _, _, spec in members:
        g.set_input(node, slot, grid)
        spec.param_name = shown


def insert_activation_qdq(g, value, enc: Encoding, elem: Optional[int] = None, opset: int = 13):
    """Q→DQ after `value` (float type `elem`, onnx enum; None: float32) for all its uses; returns the node every
    use now reads: the DQ, or the Cast back to `elem` (float_route).

    A graph input that is also a graph output (a pass-through some exporters write) stays that output: its name
    cannot move to the DQ (it is the input's), and the caller gets back exactly what it fed."""
    route = float_route(elem, opset, enc.scale)
    scale, zp = _qparams(g, enc, value.name, route.scale)
    attrs = {"axis": enc.axis} if enc.per_channel else None
    uses = None
    if value.is_input or value.tensor is not None:
        uses = [u for u in value.uses() if not u.is_graph_output]
    if route.cast:
        x = g.insert_after(value, "Cast", attrs={"to": TensorProto.FLOAT}, uses=uses).outputs[0]
        uses = None
    else:
        x = value
    base = value.name
    q = g.insert_after(x, "QuantizeLinear", [scale, zp], attrs=attrs, uses=uses, name=f"{base}_QuantizeLinear")
    dq = g.insert_after(q.outputs[0], "DequantizeLinear", [scale, zp], attrs=attrs,
                        name=f"{base}_DequantizeLinear")
    # NOTE: names say what a value is: `v_q` (the integers), `v_dq` (what readers read), and, when `v` is a
    # graph output, the output keeps its name on the last node and the float value the pair quantizes becomes
    # `v_float` (insert_after's swaps would leave `v_quantizelinear` on the float value). Short suffixes: a
    # weight's are `_quantized`/`_dequantized` (an initializer and its DQ), so the two never meet.
    _rename(g, q.outputs[0], f"{base}_q")
    if dq.outputs[0].name == base:
        _rename(g, x, f"{base}_float")
    elif not route.cast:
        _rename(g, dq.outputs[0], f"{base}_dq")
    return g.insert_after(dq.outputs[0], "Cast", attrs={"to": route.elem}) if route.cast else dq


def _rename(g, value, hint: str) -> None:
    """Give `value` the free name nearest `hint` (`hint`, else `hint_1`, ...)."""
    if value.name == hint:
        return
    name = g.names.fresh(hint)
    g.names.release(name)
    g.rename_value(value, name)


def cast_ends(q, dq):
    """(value the pair quantizes, value its readers read) of an activation Q→DQ: through the Casts of the Cast
    route (float_route) when they surround it, else (Q's input, DQ's output)."""
    x, out = q.inputs[0], dq.outputs[0]
    uses = out.uses()
    # NOTE: a user's own float16 -> float32 -> float16 Casts matched here are lossless: taking them out with the
    # pair changes no value
    if x is not None and x.producer is not None and x.producer.op_type == "Cast" and len(x.uses()) == 1 \
            and x.producer.attr("to") == TensorProto.FLOAT and x.producer.inputs[0] is not None \
            and len(uses) == 1 and not uses[0].is_graph_output and uses[0].user.op_type == "Cast" \
            and uses[0].user.attr("to") in (TensorProto.FLOAT16, TensorProto.BFLOAT16):
        return x.producer.inputs[0], uses[0].user.outputs[0]
    return x, out


def remove_qdq(g, q, dq) -> None:
    """Take an activation Q→DQ pair out (and the Casts of the Cast route around it, and the pairs pinned after
    data movement on its grid: `pin_propagated_grids`): its readers read the value."""
    for pq, pdq in reversed(pinned_pairs(dq)):
        pdq.graph.substitute(pdq.outputs[0], pq.inputs[0], remove=[pdq, pq])
    x, out = cast_ends(q, dq)
    remove = [dq, q] if out is dq.outputs[0] else [out.producer, dq, q, q.inputs[0].producer]
    g.substitute(out, x, remove=remove)


# onnxruntime's QDQPropagationTransformer carries a per-tensor DQ forward through these ops (input 0 to output
# 0; qdq_propagation.cc CanNodePropagate), inserting Q->DQ after each
PROPAGATED_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice", "MaxPool"})
PIN_FROM_OPSET = 21      # the propagated Q gets `output_dtype` from opset 21 on (onnxruntime PR #28144)
PINNED = "_pinned"       # in the names of the pairs pin_propagated_grids writes


def _signed8_per_tensor(dq) -> bool:
    """Is `dq` a DequantizeLinear with constant per-tensor scale and a signed 8-bit zero point?"""
    if dq.op_type != "DequantizeLinear" or dq.domain not in ("", "ai.onnx") or len(dq.inputs) < 3:
        return False
    s, zp = dq.inputs[1], dq.inputs[2]
    if s is None or zp is None or not s.is_constant() or not zp.is_constant() or dq.attr("block_size"):
        return False
    zv, sv = zp.const_value(), s.const_value()     # scalars (a per-channel one has one entry per channel)
    return zv is not None and sv is not None and np.size(zv) == 1 and np.size(sv) == 1 \
        and np.asarray(zv).dtype == np.int8


def _pin_uses(out) -> list:
    """The uses of data-movement output `out` that onnxruntime would give a propagated Q->DQ: every use in its
    graph (node inputs and graph outputs) but a QuantizeLinear reading it."""
    g = out.graph
    return [u for u in out.uses()
            if (u.is_graph_output and u.user is g) or
            (not u.is_graph_output and u.user.graph is g and not (u.user.op_type == "QuantizeLinear" and u.index == 0))]


def _read_by_matmul_add(dq) -> bool:
    """Does a MatMul read `dq`'s output as input 0 with an Add the only reader of its product (what
    onnxruntime's MatMulAddFusion turns into Reshape -> Gemm -> Reshape for a 3-D input)?"""
    for u in dq.outputs[0].uses():
        if u.is_graph_output or u.index != 0 or u.user.op_type != "MatMul" or not u.user.outputs:
            continue
        out = u.user.outputs[0]
        readers = out.uses() if out is not None else []
        if len(readers) == 1 and not readers[0].is_graph_output and readers[0].user.op_type == "Add":
            return True
    return False


def pin_propagated_grids(g, opset: int) -> int:
    """After each data-movement op (PROPAGATED_OPS) reading a signed 8-bit per-tensor DQ, a Q->DQ on that DQ's
    grid (its own scale and zero point tensors), down chains of them; such a DQ with zero point 0 read by a
    MatMul whose product only an Add reads loses its zero point input. In `g` only (call it per body). Returns
    how many pairs were written plus zero points dropped. Opset < 21: none (module docstring)."""
    if opset < PIN_FROM_OPSET:
        return 0
    work = [n for n in g.nodes if _signed8_per_tensor(n)]
    done = 0
    for dq in list(work):
        if _read_by_matmul_add(dq) and not np.any(np.asarray(dq.inputs[2].const_value())):
            g.set_input(dq, 2, None)
            work.remove(dq)
            done += 1
    while work:
        dq = work.pop()
        for u in list(dq.outputs[0].uses()):
            if u.is_graph_output or u.index != 0 or u.user.graph is not g or u.user.op_type not in PROPAGATED_OPS:
                continue
            out = u.user.outputs[0] if u.user.outputs else None
            uses = _pin_uses(out) if out is not None else []
            if not uses:
                continue
            q = g.insert_after(out, "QuantizeLinear", [dq.inputs[1], dq.inputs[2]], uses=uses,
                               name=f"{out.name}{PINNED}_QuantizeLinear")
            work.append(g.insert_after(q.outputs[0], "DequantizeLinear", [dq.inputs[1], dq.inputs[2]],
                                       name=f"{out.name}{PINNED}_DequantizeLinear"))
            done += 1
    return done


def pinned_pairs(dq) -> list:
    """The (Q, DQ) pairs `pin_propagated_grids` wrote downstream of `dq` (on its scale and zero point tensors,
    through data movement), nearest first."""
    found, work = [], [dq]
    while work:
        d = work.pop(0)
        for u in d.outputs[0].uses():
            if u.is_graph_output or u.index != 0 or u.user.op_type not in PROPAGATED_OPS or not u.user.outputs:
                continue
            out = u.user.outputs[0]
            for w in (out.uses() if out is not None else []):
                q = w.user
                if w.is_graph_output or q.op_type != "QuantizeLinear" or PINNED not in q.name \
                        or q.inputs[1] is not dq.inputs[1]:
                    continue
                qu = q.outputs[0].uses()
                if len(qu) == 1 and not qu[0].is_graph_output and qu[0].user.op_type == "DequantizeLinear":
                    found.append((q, qu[0].user))
                    work.append(qu[0].user)
    return found


def dequantizer_of(tail):
    """(DequantizeLinear, Cast back or None) of the node `insert_activation_qdq` returned."""
    if tail.op_type == "Cast":
        return tail.inputs[0].producer, tail
    return tail, None


def local_dequantizers(tail, enc: Encoding, touched: set) -> int:
    """Give each body that reads the output of `tail` (a value quantized in an outer graph, captured; `tail` as
    `insert_activation_qdq` returned it) its own DequantizeLinear (and Cast back, if the outer pair has one)
    of the captured QuantizeLinear output, with its own scale and zero point; returns how many.

    NOTE: onnxruntime's QDQ fusions look at one graph at a time and want the DQ and its scale in the same graph
    as the consumer: a Conv in an If branch reading the main graph's DQ of `x` stayed a float Conv.
    The int8 tensor crosses the boundary instead of the float one; the outer DQ goes when nothing reads it.
    """
    dq, cast = dequantizer_of(tail)
    out, q_out = tail.outputs[0], dq.inputs[0]
    scale_dtype = np.asarray(dq.inputs[1].const_value()).dtype
    by_graph: Dict[int, tuple] = {}
    for u in out.uses():
        ug = u.user if u.is_graph_output else u.user.graph
        if ug is not tail.graph:
            by_graph.setdefault(id(ug), (ug, []))[1].append(u)
    for ug, uses in by_graph.values():
        scale, zp = _qparams(ug, enc, q_out.name, scale_dtype)
        first = next((u.user for u in uses if not u.is_graph_output), None)
        local = ug.add_node("DequantizeLinear", [q_out, scale, zp], [f"{out.name}_local"],
                            {"axis": enc.axis} if enc.per_channel else None, name=f"{out.name}_DequantizeLinear",
                            before=first if first is not None else None)
        if cast is not None:
            local = ug.add_node("Cast", [local.outputs[0]], [f"{out.name}_local_cast"], {"to": cast.attr("to")},
                                name=f"{out.name}_Cast", before=first if first is not None else None)
        for u in uses:
            if u.is_graph_output:
                ug.set_output(u.index, local.outputs[0])
            else:
                ug.set_input(u.user, u.index, local.outputs[0])
        touched.add(id(ug))
    if by_graph and not out.uses():
        for n in (cast, dq):
            if n is not None and not n.outputs[0].uses():
                n.graph.remove_node(n)
    return len(by_graph)


def insert_use_qdq(g, node, slot: int, enc: Encoding, elem: Optional[int] = None, opset: int = 13):
    """Q→DQ feeding only input `slot` of `node` (its value of float type `elem`: float_route)."""
    v = node.inputs[slot]
    route = float_route(elem, opset, enc.scale)
    scale, zp = _qparams(g, enc, f"{v.name}_{node.name}_in{slot}", route.scale)
    if route.cast:
        g.insert_before(node, slot, "Cast", attrs={"to": TensorProto.FLOAT})
    g.insert_before(node, slot, "QuantizeLinear", [scale, zp])
    dq = g.insert_before(node, slot, "DequantizeLinear", [scale, zp])
    return g.insert_before(node, slot, "Cast", attrs={"to": route.elem}) if route.cast else dq


def _dequantize_const(g, q, enc: Encoding, hint: str, elem: int, opset: int, attrs, name: str, before,
                      zp_dtype=None):
    """DequantizeLinear of the stored integer constant `q` whose float original had type `elem` (its readers
    expect it): float_route's scale type, then a Cast to `elem` on the Cast route. Returns the node read."""
    route = float_route(elem, opset, enc.scale)
    if zp_dtype is None:
        scale, zp = _qparams(g, enc, hint, route.scale)
    else:    # bias: int32 zero point 0
        scale = g.add_constant(fit_scale(enc, route.scale), f"{hint}_scale")
        zp = g.add_constant(np.zeros(np.shape(enc.scale), zp_dtype), f"{hint}_zero_point")
    dq = g.add_node("DequantizeLinear", [q, scale, zp], [f"{hint}_dequantized"], attrs, name=name, before=before)
    if not route.cast:
        return dq
    return g.add_node("Cast", [dq.outputs[0]], [f"{hint}_dequantized_cast"], {"to": route.elem},
                      name=f"{name}_Cast", before=before)


def output_axis(node) -> Optional[int]:
    """The axis of the output channels in the weight (input 1) of a biased op; None for ops not known here."""
    if node.op_type == "Gemm":
        return 0 if node.attr("transB", 0) else 1
    return {"Conv": 0, "ConvTranspose": 1}.get(node.op_type)


def output_channel_scales(node, enc: Encoding, channels: int) -> Optional[np.ndarray]:
    """The weight scale of each of `channels` output channels of `node` (float64, shape (channels,)), or None
    when the weight's grid has no single scale per output channel.

    Per-tensor: the one scale repeated. Per-channel Conv/Gemm/MatMul: one scale per index along the weight's
    output axis. ConvTranspose with group g: its weight is [C_in, C_out/g, kH, kW] and output channel
    o = k·(C_out/g) + j reads W[k·C_in/g : (k+1)·C_in/g, j], so the per-channel axis 1 holds C_out/g scales, each
    shared by the g groups (placement: the max over groups); output channel o gets scale j = o mod C_out/g,
    i.e. the axis-1 scales tiled g times.
    NOTE: why axis 1 and not per-group scales: DequantizeLinear's per-axis form needs one scale per index along
    one axis, and the (group, channel-in-group) pair spans axes 0 and 1; axis 1 is also the axis TensorRT and
    QNN quantize deconvolution weights on. A depthwise ConvTranspose (C_out/g = 1) thus gets one weight scale,
    as per-tensor would.
    """
    if per_tensor(enc):
        return np.full(channels, scalar(enc.scale, "weight scale"), np.float64)
    if enc.block_size:
        return None
    out_axis = output_axis(node)
    if out_axis is not None and enc.axis != out_axis:
        return None     # e.g. a frozen encoding along the input channels: no one scale per output channel
    sw = np.asarray(enc.scale, np.float64).reshape(-1)
    if node.op_type == "ConvTranspose":
        groups = int(node.attr("group", 1) or 1)
        if sw.size * groups == channels:
            return np.tile(sw, groups)
    return sw if sw.size == channels else None


def bias_scale(node, ein: Encoding, ew: Encoding, bias_shape: tuple):
    """(int32 scale of the bias, None) or (None, reason): s_in·s_w per output channel, as ORT's QDQ Conv/Gemm
    fusions and QNN's expect. The scale is 0-d when the weight is per-tensor (or the bias has one channel),
    else one per entry of the bias's last axis (Conv/ConvTranspose (C_out,), Gemm C (N,) or (M, N))."""
    if not per_tensor(ein):
        return None, "the input is quantized per channel"
    s_in = scalar(ein.scale, "input scale")
    if per_tensor(ew):
        return np.asarray(s_in * scalar(ew.scale, "weight scale"), np.float64), ""
    if ew.block_size:
        return None, "the weight is per-block (no single weight scale per output channel)"
    out_axis = output_axis(node)
    if out_axis is not None and ew.axis != out_axis:
        return None, (f"the weight is quantized along axis {ew.axis}, not its output-channel axis {out_axis} "
                      f"(no one weight scale per output channel)")
    channels = int(bias_shape[-1]) if len(bias_shape) else 1
    sw = output_channel_scales(node, ew, channels)
    if sw is None:
        return None, (f"the weight's {np.size(ew.scale)} scales do not map onto the bias's {channels} output "
                      f"channels")
    if channels == 1:
        return np.asarray(s_in * sw[0], np.float64), ""
    return s_in * sw, ""


def apply_plan(model, plan: QuantPlan) -> Tuple[Dict[str, Encoding], Dict[str, Encoding]]:
    """Insert every quantizer of `plan` into `model` (in place). Returns (activation, param) encodings by name."""
    g = model.graph
    opset = model.opset
    dtypes = plan.dtypes or {}
    by_name = plan.nodes      # If/Loop/Scan body nodes too: their weights are quantized inside the body
    acts: Dict[str, Encoding] = {}
    touched = set()                 # bodies that got a DQ (toposorted at the end)
    params: Dict[str, Encoding] = {}

    # encodings seen by each use before the graph changes (for bias scales)
    def input_encoding(node, slot):
        us = plan.uses.get((node.name, slot))
        if us is not None:
            return None if us.keep_float else us.encoding
        v = node.inputs[slot]
        s = plan.values.get(v.name) if v is not None else None
        return None if s is None or s.keep_float else s.encoding

    bias_inputs = {}
    for (node_name, slot), spec in plan.uses.items():
        if spec.kind == "bias" and not spec.keep_float:
            node = by_name[node_name]
            wspec = plan.uses.get((node_name, 1))
            bias_inputs[(node_name, slot)] = (input_encoding(node, 0),
                                              None if wspec is None or wspec.keep_float else wspec.encoding)

    # 1. weights: group uses by (value, graph of the reader, grid). A weight read inside an If/Loop/Scan body
    # gets its int8 copy and DQ inside that body (field notes §1), also when the float original lives in an
    # outer graph (a captured weight): each body stays self-contained, so the DQ sits next to its reader as in
    # the main graph; the price is one int8 copy per body reading it. Each use is written as the plan's
    # `storage` says: the int tensor through one shared DQ, or float32 on the grid (placement/storage.py).
    groups: Dict[tuple, list] = {}
    for (node_name, slot), spec in plan.uses.items():
        if spec.kind != "weight" or spec.keep_float or spec.encoding is None:
            continue
        node = by_name[node_name]
        v = node.inputs[slot]
        enc = spec.encoding
        key = (id(v), id(node.graph), enc.axis, enc.bits, tuple(np.asarray(enc.scale).ravel().tolist()),
               tuple(np.asarray(enc.zero_point).ravel().tolist()), id(spec.rounded))
        groups.setdefault(key, []).append((node, slot, v, enc, spec))
    for k, members in groups.items():
        node0, _, v, enc, spec0 = members[0]
        wg = node0.graph
        if wg is not g:
            touched.add(id(wg))
        welem = float_elem(v)
        fit_scale(enc, float_route(welem, opset, enc.scale).scale)   # the integers for the scale the DQ holds
        if spec0.rounded is not None:      # learned rounding (adaround): the integers as the plan holds them
            qarr = np.asarray(spec0.rounded).astype(storage_dtype(enc))
        else:
            w = v.const_value()
            qarr = _quantize_array(w, enc)
            del w
        drop_cached(v)   # the float copy of an external weight: one held at a time (memory.py)
        on_int = [m for m in members if m[4].storage == INT]
        on_grid = [m for m in members if m[4].storage == FLOAT_ON_GRID]
        if on_int:
            if enc.bits < 8:
                qarr = _as_int4(qarr, enc.signed)
            wq = wg.add_constant(qarr, f"{v.name}_quantized")
            dq = _dequantize_const(wg, wq, enc, v.name, welem, opset, _dq_attrs(enc), f"{v.name}_DequantizeLinear",
                                   node0)
            for node, slot, _, _, _ in on_int:
                wg.set_input(node, slot, dq.outputs[0])
            pname = dq.outputs[0].name
        else:
            pname = wg.names.fresh(f"{v.name}_dequantized")   # the name its DQ would have had
        if on_grid:
            _write_on_grid(wg, on_grid, _on_grid(qarr, enc).astype(np_float(welem)), pname)
        params[v.name if v.name not in params else pname] = enc
        v.graph.drop_if_unused([v])

    # 2. biases (int32, scale = s_in * s_w)
    for (node_name, slot), (ein, ew) in bias_inputs.items():
        spec = plan.uses[(node_name, slot)]
        node = by_name[node_name]
        v = node.inputs[slot]
        if ein is None or ew is None:
            spec.float_("bias left float: input or weight is float")
            continue
        b = np.asarray(v.const_value(), np.float64)
        s, why = bias_scale(node, ein, ew, b.shape)
        if s is None:
            spec.float_(f"bias left float: {why}")
            continue
        q = np.round(b / s)
        if not np.all(np.isfinite(q)) or np.abs(q).max(initial=0) > INT32_MAX:
            spec.float_("bias left float: int32 grid s_in*s_w would overflow")
            continue
        per_channel = s.ndim > 0
        bias_axis = b.ndim - 1 if per_channel else None
        enc = Encoding(scale=s.astype(np.float32), zero_point=np.zeros(s.shape, np.int64), bits=32, symmetric=True,
                       signed=True, axis=bias_axis)
        spec.encoding = enc
        bg = node.graph
        belem = float_elem(v)
        if spec.storage == FLOAT_ON_GRID:
            pname = bg.names.fresh(f"{v.name}_dequantized")
            _write_on_grid(bg, [(node, slot, v, enc, spec)],
                           _on_grid(q.astype(np.int32), enc).astype(np_float(belem)), pname)
        else:
            bq = bg.add_constant(q.astype(np.int32), f"{v.name}_quantized")
            dq = _dequantize_const(bg, bq, enc, v.name, belem, opset, {"axis": bias_axis} if per_channel else None,
                                   f"{v.name}_{node_name}_DequantizeLinear", node, zp_dtype=np.int32)
            bg.set_input(node, slot, dq.outputs[0])
            pname = dq.outputs[0].name
        params[v.name if v.name not in params else pname] = enc
        v.graph.drop_if_unused([v])

    # 3. activations at producers (one Q/DQ per value, every use reads the DQ), in the graph defining the value:
    # a body value's Q/DQ sits inside its body; a value captured by a body is quantized where it is defined and
    # the body reads the DQ output, a valid outer-scope name
    local = {}
    for sub in g.subgraphs(recursive=True):
        for v in sub.local_values():
            local.setdefault(v.name, v)
    for name, spec in list(plan.values.items()):
        if spec.kind != "activation" or spec.keep_float or spec.encoding is None:
            continue
        v = g.value(name) or local.get(name)
        if v is None or not v.uses():
            continue
        if (v.is_input or v.tensor is not None) and all(u.is_graph_output for u in v.uses()):
            continue   # an input only passed through to the outputs: nothing reads a quantized copy
        if v.graph is not g:
            touched.add(id(v.graph))
        tail = insert_activation_qdq(v.graph, v, spec.encoding, float_elem(v, dtypes), opset)
        local_dequantizers(tail, spec.encoding, touched)
        acts[name] = spec.encoding

    # 4. per-use activation quantizers (Concat input whose producer is not quantizable)
    for (node_name, slot), spec in plan.uses.items():
        if spec.kind == "activation" and not spec.keep_float and spec.encoding is not None:
            node = by_name[node_name]
            if node.graph is not g:
                touched.add(id(node.graph))
            insert_use_qdq(node.graph, node, slot, spec.encoding, float_elem(node.inputs[slot], dtypes), opset)
            acts[f"{node.inputs[slot].name}"] = spec.encoding
    # 5. data movement after a signed 8-bit DQ: its own pair on the same grid (module docstring)
    for sub in [g] + list(g.subgraphs(recursive=True)):
        if pin_propagated_grids(sub, opset) and sub is not g:
            touched.add(id(sub))
    g.toposort()
    for body in g.subgraphs(recursive=True):
        if id(body) in touched:
            body.toposort()
    return acts, params


# --------------------------------------------------------------------------- bias correction

def learned_values(spec: QuantSpec, shape: tuple) -> np.ndarray:
    """The float64 values of a weight use's learned integers (`spec.rounded`, adaround) on its grid."""
    scale, zp = broadcast_qparams(spec.encoding, shape)
    return (np.asarray(spec.rounded, np.float64) - zp) * scale


def correct_biases(model, plan: QuantPlan, channel_mean, corrected: Optional[list] = None) -> int:
    """Empirical bias correction (Nagel et al. 2019, DFQ §4.2): b' = b - (W_q - W)·E[x].

    Weight rounding shifts each output channel's mean by (W_q - W)·E[x]; subtracting it from the bias
    removes that shift (padding borders aside). Depthwise convolutions with few taps per channel gain most.
    Biases are written copy-on-write; a Conv/Gemm without bias gets one (int32-quantized like the others).
    Returns how many nodes were corrected (their names appended to `corrected` when given). Nodes inside
    If/Loop/Scan bodies too, when `channel_mean` knows their input (passes/quantize/bias_correction.py).
    """
    bias_slot = plan.profile.bias
    done = 0
    for (node_name, slot), spec in list(plan.uses.items()):
        node = plan.nodes.get(node_name)
        # body nodes too: calibration observes their inputs' channel means through body_probe
        if spec.kind != "weight" or spec.keep_float or spec.encoding is None or slot != 1 or node is None:
            continue
        g = node.graph
        if node.op_type not in ("Conv", "Gemm"):
            continue
        mu = channel_mean(node.inputs[0].name) if node.inputs[0] is not None else None
        if mu is None:
            continue
        w = np.asarray(node.inputs[1].const_value(), np.float64)
        enc = spec.encoding
        # what onnxruntime will compute from the exported Q/DQ (the learned integers when adaround ran)
        dq = quantize_dequantize(w, enc) if spec.rounded is None else learned_values(spec, w.shape)
        dw = dq - w
        if node.op_type == "Conv":
            groups = int(node.attr("group", 1))
            cout, cg = w.shape[0], w.shape[1]
            if mu.shape[0] != cg * groups:
                continue
            mu_g = mu.reshape(groups, cg)                       # [groups, cin/g]
            per_out = dw.reshape(groups, cout // groups, cg, -1).sum(-1)   # [groups, cout/g, cin/g]
            delta = np.einsum("goc,gc->go", per_out, mu_g).reshape(cout)
        else:
            if node.attr("transA", 0) or node.attr("alpha", 1.0) != 1.0:
                continue
            delta = (dw @ mu) if node.attr("transB", 0) else (mu @ dw)
        if not np.all(np.isfinite(delta)) or not np.any(delta):
            continue
        bslot = 2
        b = node.inputs[bslot] if len(node.inputs) > bslot else None
        if b is not None:
            barr = b.const_value()
            if barr is None or barr.shape != delta.shape:
                continue
            if b.tensor is None:     # a Constant node's output: give this node its own initializer
                nb = g.add_constant((barr - delta).astype(barr.dtype), b.name)
                g.set_input(node, bslot, nb)
            else:
                g.set_constant(b, (barr - delta).astype(barr.dtype), writer=node)
        else:
            if node.op_type == "Gemm":
                continue   # Gemm's C broadcasts; adding one would change shapes it may rely on
            while len(node.inputs) < bslot:
                g.append_input(node, None)
            nb = g.add_constant((-delta).astype(np_float(float_elem(node.inputs[1]))), f"{node.name}_bias")
            g.append_input(node, nb)
            if node.op_type in bias_slot and (node_name, bslot) not in plan.uses:
                plan.set_use(node_name, bslot, QuantSpec(kind="bias", bits=32, symmetric=True, signed=True,
                                                         source="bias correction"))
        done += 1
        if corrected is not None:
            corrected.append(node_name)
    return done
