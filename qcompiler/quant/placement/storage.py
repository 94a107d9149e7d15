"""How each quantized weight and bias is stored: int with a DequantizeLinear, or float32 on its int grid.

onnxruntime's CPU QDQ selectors absorb DQ(weight) only into an integer kernel (QLinearConv, QLinearMatMul,
MatMulIntegerToFloat, QGemm: anchors B). Where they cannot (16-bit or float activation input, Conv without an
8-bit output Q, LSTM/GRU/RNN which have no QDQ kernel), ORT keeps the DequantizeLinear and runs it on every
inference: its constant folding skips DQ in QDQ models. That DQ cost 38 of minilm's 41 ms, and a float
Conv/LSTM fed by a DQ output cannot prepack its weights either (NCHWc Conv, LSTM's packed gates).

Such a weight (and the int32 bias of such a node) is stored as float32 values exactly on its integer grid,
`float32(q - zp) * float32(scale)` as ORT's DequantizeLinear computes it (qdq.apply_plan writes it), so the
model is numerically the explicit-DQ one (bit-identical at ORT_DISABLE_ALL) and the encodings still list the
weight's grid.

Which kernels fuse is profile data (`integer_weight_kernels`, `output_q_through`), read here from the plan with
its encodings: what qdq.apply_plan will put in front of and after each node. Blocked (`block_size`) and 4-bit
weights keep their DQ: there the point is the size, and ORT fuses blocked int4 MatMul into MatMulNBits.
`decide_storage` runs after encodings are final (frozen, widened, bias correction's new biases) and before
QDQ insertion (tests/quant/test_weight_storage.py checks it against the rule read from a lowered graph).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from qcompiler.quant.core.plan import FLOAT_ON_GRID, INT, QuantPlan

EIGHT_BIT = 8


def _applied(spec) -> bool:
    """Does qdq.apply_plan write a quantizer for this activation spec?"""
    return spec is not None and spec.kind == "activation" and not spec.keep_float and spec.encoding is not None


def _input_encoding(plan: QuantPlan, node, slot: int):
    """The encoding of the DequantizeLinear that will feed input `slot` of `node`, or None (a float input).

    apply_plan writes producer quantizers first (every use, captured uses in bodies included, reads their DQ),
    then per-use quantizers in front of that; a weight slot reads its own DQ unless it is stored on its grid.
    """
    us = plan.uses.get((node.name, slot))
    if us is not None and us.kind in ("weight", "bias"):
        return us.encoding if not us.keep_float and us.storage == INT else None
    if _applied(us):
        return us.encoding
    v = node.inputs[slot] if slot < len(node.inputs) else None
    spec = plan.values.get(v.name) if v is not None else None
    return spec.encoding if _applied(spec) else None


def _output_quantizer(plan: QuantPlan, v, through: set):
    """The encoding of the QuantizeLinear that will be the only reader of `v` (possibly behind a chain of
    `through` ops read at input 0), or None."""
    while v is not None:
        users = v.uses()
        spec = plan.values.get(v.name)
        if _applied(spec) and users:
            return spec.encoding            # every use of v moves to its Q
        if len(users) != 1 or users[0].is_graph_output:
            return None
        user, slot = users[0].user, users[0].index
        us = plan.uses.get((user.name, slot))
        if _applied(us):
            return us.encoding              # a per-use Q in front of that input
        if user.op_type not in through or slot != 0:
            return None
        v = user.outputs[0] if user.outputs else None
    return None


def _is_8bit(enc) -> bool:
    return enc is not None and enc.bits == EIGHT_BIT


def unfused_reason(plan: QuantPlan, node) -> Optional[str]:
    """Why `node` will run as a float kernel on the plan's target (None: its weight DQ fuses into an integer
    kernel). The profile's `integer_weight_kernels` rule, read from the plan: what apply_plan will put in front
    of the node and after it."""
    profile = plan.profile
    rule = profile.integer_weight_kernels.get(node.op_type)
    if rule is None:
        return f"{node.op_type} has no integer kernel on this target"
    bits = rule.act_bits
    if not _is_8bit(_input_encoding(plan, node, 0)):
        return f"{node.op_type} activation input is not {bits}-bit quantized"
    if not _is_8bit(_input_encoding(plan, node, 1)):
        return f"{node.op_type} weight is not {bits}-bit"
    if rule.output_q and not _is_8bit(_output_quantizer(plan, node.outputs[0] if node.outputs else None,
                                                                 set(profile.output_q_through))):
        return f"{node.op_type} output is not {bits}-bit quantized"
    return None


def _runtime_requantizes(plan: QuantPlan, node) -> bool:
    """The runtime would re-quantize a float weight of `node` itself (coarser grid, DQ back every run).

    ORT's WeightBiasQuantization (qdq_transformer/weight_bias_quantization.cc) gives a float Conv/ConvTranspose/
    Gemm weight a per-tensor int8 Q->DQ when input 0 is DQ'd per tensor; on ORT 1.31 seen only when the output
    feeds a Q (an int16 Conv lost 1.1 dB that way), so such weights keep their own explicit DQ.
    """
    if node.op_type not in plan.profile.requantizes_float_weights:
        return False
    ein = _input_encoding(plan, node, 0) if node.inputs and node.inputs[0] is not None else None
    if ein is None or np.size(ein.scale) != 1:
        return False
    v = node.outputs[0] if node.outputs else None
    if v is None:
        return False
    if _applied(plan.values.get(v.name)):
        return True
    return any(_applied(plan.uses.get((u.user.name, u.index))) for u in v.uses() if not u.is_graph_output)


def requantized_if_float(plan: QuantPlan, node) -> bool:
    """Would the runtime re-quantize `node`'s weight itself were it left exact float (`requantizes_float_weights`:
    a DQ'd activation input and a quantized output), judged from the plan's specs before encodings exist? Such a
    weight keeps its own grid: the runtime's would be per tensor and coarser."""
    if node.op_type not in plan.profile.requantizes_float_weights or not node.inputs or node.inputs[0] is None:
        return False

    def quantized(spec) -> bool:
        return spec is not None and spec.kind == "activation" and not spec.keep_float
    if not (quantized(plan.uses.get((node.name, 0))) or quantized(plan.values.get(node.inputs[0].name))):
        return False
    v = node.outputs[0] if node.outputs else None
    return v is not None and (quantized(plan.values.get(v.name)) or any(
        quantized(plan.uses.get((u.user.name, u.index))) for u in v.uses() if not u.is_graph_output))


def _storable_on_grid(spec) -> bool:
    """A grid stored in 8 to 32 bits without blocks (a bias is int32; its encoding comes at QDQ insertion)."""
    if spec.kind == "bias":
        return True
    enc = spec.encoding
    return enc is not None and not enc.block_size and enc.bits >= 8


def decide_storage(plan: QuantPlan, model) -> int:
    """Set `storage` on every quantized weight and bias use of the plan; returns how many are stored on their
    grid. A use is stored on its grid when the profile asks for it (`prefold_unfused_weight_dq`), its node
    runs a float kernel that the runtime would not re-quantize itself and the objective does not store such
    weights narrow (`float_kernel_weights`: int8 + DQ under `size`); a weight read by fused and unfused nodes
    alike keeps its DQ for the fused ones. Uses are visited weights first, then biases, as the lowered graph
    orders their DQs: a bias of a node whose weight is on its grid reads "weight is not 8-bit"."""
    for spec in plan.uses.values():
        if spec.kind in ("weight", "bias"):
            spec.storage, spec.storage_reason, spec.param_name = INT, "", ""
    if not plan.profile.prefold_unfused_weight_dq:
        return 0
    int_for = {op for op in plan.profile.weights     # the objective stores float kernels' weights narrow (size)
               if plan.profile.float_kernel_weight_form(plan.optimize, op, weight_only=False) == "int"}
    by_name = plan.nodes
    done = 0
    for kind in ("weight", "bias"):
        for (node_name, slot), spec in plan.uses.items():
            if spec.kind != kind or spec.keep_float or not _storable_on_grid(spec):
                continue
            node = by_name.get(node_name)
            if node is None or node.op_type in int_for:
                continue
            reason = unfused_reason(plan, node)
            if reason is not None and not _runtime_requantizes(plan, node):
                spec.storage, spec.storage_reason = FLOAT_ON_GRID, reason
                done += 1
    return done
