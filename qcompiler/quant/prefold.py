"""Store weights that the runtime cannot fuse into an integer kernel fake-quantized: no DequantizeLinear per run.

onnxruntime's CPU QDQ selectors absorb DQ(weight) only into an integer kernel (QLinearConv, QLinearMatMul,
MatMulIntegerToFloat, QGemm: anchors B). Where they cannot (16-bit or float activation input, Conv without an
8-bit output Q, LSTM/GRU/RNN which have no QDQ kernel), ORT keeps the DequantizeLinear and runs it on every
inference: its constant folding skips DQ in QDQ models. That DQ cost 38 of minilm's 41 ms, and a float
Conv/LSTM fed by a DQ output cannot prepack its weights either (NCHWc Conv, LSTM's packed gates).

Such a weight (and the int32 bias of such a node) is stored as float32 values exactly on its integer grid,
`float32(q - zp) * float32(scale)` as ORT's DequantizeLinear computes it, so the model is numerically the
explicit-DQ one (bit-identical at ORT_DISABLE_ALL) and the encodings still list the weight's grid.

Which kernels fuse is profile data (`integer_weight_kernels`, `output_q_through`), read from the exported graph:
an 8-bit DQ on the activation input, an 8-bit DQ on the weight, and for kernels that need it an 8-bit Q on the
output, possibly behind a Relu/Clip that ORT folds into the Q. Blocked (`block_size`) and 4-bit weights keep
their DQ: there the point is the size, and ORT fuses blocked int4 MatMul into MatMulNBits.
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from .encoding import dequantize_linear

EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))
PREFOLDABLE = EIGHT_BIT + (np.dtype(np.int16), np.dtype(np.uint16), np.dtype(np.int32))


def _zp_dtype(dq) -> np.dtype:
    zp = dq.inputs[2] if len(dq.inputs) > 2 else None
    arr = zp.const_value() if zp is not None else None
    return np.dtype(np.uint8) if arr is None else np.asarray(arr).dtype


def _is_8bit_dq(v) -> bool:
    p = v.producer if v is not None else None
    return p is not None and p.op_type == "DequantizeLinear" and _zp_dtype(p) in EIGHT_BIT


def _feeds_8bit_q(node, through) -> bool:
    """The node's output is read only by an 8-bit QuantizeLinear, possibly behind a chain of `through` ops."""
    v = node.outputs[0] if node.outputs else None
    while v is not None:
        users = v.uses()
        if len(users) != 1 or users[0].is_graph_output:
            return False
        user = users[0].user
        if user.op_type == "QuantizeLinear":
            return _zp_dtype(user) in EIGHT_BIT
        if user.op_type not in through or users[0].index != 0:
            return False
        v = user.outputs[0]
    return False


def unfused_reason(node, profile: dict) -> Optional[str]:
    """Why `node` runs as a float kernel under `profile` (None: its weight DQ fuses into an integer kernel)."""
    rule = profile.get("integer_weight_kernels", {}).get(node.op_type)
    if rule is None:
        return f"{node.op_type} has no integer kernel on this target"
    bits = rule.get("act_bits", 8)
    if not _is_8bit_dq(node.inputs[0]):
        return f"{node.op_type} activation input is not {bits}-bit quantized"
    w = node.inputs[1] if len(node.inputs) > 1 else None
    if not _is_8bit_dq(w):
        return f"{node.op_type} weight is not {bits}-bit"
    if rule.get("output_q") and not _feeds_8bit_q(node, set(profile.get("output_q_through", ()))):
        return f"{node.op_type} output is not {bits}-bit quantized"
    return None


def _runtime_requantizes(node, profile: dict) -> bool:
    """The runtime would re-quantize a float weight of `node` itself (coarser grid, DQ back every run).

    ORT's WeightBiasQuantization (qdq_transformer/weight_bias_quantization.cc) gives a float Conv/ConvTranspose/
    Gemm weight a per-tensor int8 Q->DQ when input 0 is DQ'd per tensor; on ORT 1.31 seen only when the output
    feeds a Q (an int16 Conv lost 1.1 dB that way), so such weights keep their own explicit DQ.
    """
    if node.op_type not in profile.get("requantizes_float_weights", ()):
        return False
    p = node.inputs[0].producer if node.inputs[0] is not None else None
    if p is None or p.op_type != "DequantizeLinear" or np.size(p.inputs[1].const_value()) != 1:
        return False
    users = node.outputs[0].uses() if node.outputs else ()
    return any(getattr(u.user, "op_type", None) == "QuantizeLinear" for u in users)


def prefold_unfused_param_dq(model, profile: dict) -> Dict[str, str]:
    """Replace each constant-input DequantizeLinear read by an unfused node with its float32 result (in place).

    Returns {parameter name: reason} (the name the encodings list it under). A DQ read by fused and unfused nodes alike keeps its DQ for the
    fused ones. Does nothing unless the profile sets `prefold_unfused_weight_dq`. If/Loop/Scan bodies are
    visited too: a body's weight DQ is folded inside the body, like the main graph's (field notes §1).
    """
    if not profile.get("prefold_unfused_weight_dq"):
        return {}
    done: Dict[str, str] = {}
    for g in model.graph.all_graphs():
        _prefold_graph(g, profile, done)
    return done


def _prefold_graph(g, profile: dict, done: Dict[str, str]) -> None:
    """`prefold_unfused_param_dq` for the DequantizeLinear nodes of one graph (main graph or body)."""
    for dq in list(g.nodes_by_op("DequantizeLinear")):
        q, scale = dq.inputs[0], dq.inputs[1]
        zp = dq.inputs[2] if len(dq.inputs) > 2 else None
        qarr = q.const_value()
        if qarr is None or dq.attr("block_size", 0) or scale.const_value() is None \
                or (zp is not None and zp.const_value() is None) or np.asarray(qarr).dtype not in PREFOLDABLE:
            continue
        out = dq.outputs[0]
        unfused = []
        for use in out.uses():
            if use.is_graph_output:
                continue            # a graph output keeps its DQ
            reason = unfused_reason(use.user, profile)
            if reason is not None and not _runtime_requantizes(use.user, profile):
                unfused.append((use.user, use.index, reason))
        if not unfused:
            continue
        arr = dequantize_linear(qarr, scale.const_value(), None if zp is None else zp.const_value(),
                                  int(dq.attr("axis", 1)))
        folded = g.add_constant(arr, f"{out.name}_prefolded")
        for node, slot, _ in unfused:
            g.set_input(node, slot, folded)
        name = out.name[:-len("_dequantized")] if out.name.endswith("_dequantized") else out.name
        done[name] = unfused[0][2]
        if not out.uses():
            g.remove_node(dq)
            g.drop_if_unused([q, scale, zp])
