"""Weights and biases, per use: grid, per-channel or per-block axis, narrowed range (main graph and bodies)."""
from __future__ import annotations

from typing import Optional

import numpy as np

from qcompiler.quant.core.plan import QuantPlan, QuantSpec
from qcompiler.quant.placement.lookup import _const, _const_kind, weight_nodes
from qcompiler.quant.placement.options import PlacementOptions, node_settings
from qcompiler.quant.targets.profiles import Profile, weight_axis


def block_axis(node, slot: int, rank: int) -> Optional[int]:
    """Axis along which per-block weight scales run: the weight's reduction (input-channel) axis.

    MatMul B [.., K, N]: rank-2 (blocks along K, as ORT's MatMulNBits wants); Gemm B: 0, or 1 with transB;
    Conv W [Cout, Cin/g, ..]: 1; ConvTranspose W [Cin, Cout/g, ..]: 0; LSTM/GRU/RNN W, R [dirs, gates*H, in]: 2.
    None: no per-block rule for this op or slot.
    """
    if slot not in (1, 2) or rank < 2:
        return None
    op = node.op_type
    if op == "MatMul" and slot == 1:
        return rank - 2
    if op == "Gemm" and slot == 1 and rank == 2:
        return 1 if node.attr("transB", 0) else 0
    if op == "Conv" and slot == 1:
        return 1
    if op == "ConvTranspose" and slot == 1:
        return 0
    if op in ("LSTM", "GRU", "RNN") and rank == 3:
        return 2
    return None


def place_weights(plan: QuantPlan, g, profile: Profile, opts: PlacementOptions) -> None:
    """A per-use spec for every float weight slot of the profile, and an int32 spec for its bias slot."""
    # per use, in the main graph and inside If/Loop/Scan bodies (field notes §1)
    pc_ops = set(profile.per_channel_ops)
    tables = set(profile.table_ops)
    for n in weight_nodes(g):
        slots = profile.weights.get(n.op_type, {})
        if not slots:
            continue
        s = node_settings(opts, profile, n)
        for slot in slots:
            v = n.inputs[slot] if slot < len(n.inputs) else None
            arr = _const_kind(v)
            if arr is None or not np.issubdtype(arr.dtype, np.floating):
                continue
            if s["keep_float"] or not s["weight_quantized"]:
                plan.set_use(n.name, slot, QuantSpec(kind="weight", source="config").float_(
                    f"weights kept float by {s['by']}"))
                continue
            dims = v.tensor.dims if getattr(v, "tensor", None) is not None else getattr(arr, "shape", ())
            if 0 in dims:   # a zero dim (MatMul B of shape (4, 0)): no range to take, nothing to gain
                plan.set_use(n.name, slot, QuantSpec(kind="weight", source="model").float_(
                    f"weight of shape {tuple(dims)} holds no values"))
                continue
            # NOTE: a grouped ConvTranspose's axis 1 holds C_out/g channels, each shared by the g groups: its
            # scale is the max over them and the bias tiles it over groups (qdq.output_channel_scales)
            axis = weight_axis(profile, n, slot, arr.ndim) if (s["weight_per_channel"] and n.op_type in pc_ops) \
                else None
            if axis is not None and arr.ndim < 2 and n.op_type != "MatMul":
                axis = None
            if n.op_type == "MatMul" and arr.ndim < 2:
                axis = None
            bits = int(s["weight_bits"])
            block, fallback = s["weight_block"], ""
            if block:
                baxis = block_axis(n, slot, arr.ndim)
                if baxis is None:
                    fallback = f"; per-block asked but {n.op_type} input {slot} has no block axis"
                elif bits not in profile.per_block_weight_bits:
                    fallback = f"; per-block {bits}-bit weights not supported on {profile.name}"
                else:
                    axis = baxis
                if fallback:
                    block = None   # the per-channel/per-tensor grid above
                    if axis is not None:
                        fallback += ", per-channel instead"
            rb = profile.weight.range_bits
            range_bits = min(bits, rb) if (rb and bits == 8) else bits
            # a table the target quantizes as an activation (profile `table_ops`) takes the activations' symmetry
            symmetric = s["act_symmetric"] if n.op_type in tables and not s["weights_ruled"] else \
                s["weight_symmetric"]
            plan.set_use(n.name, slot, QuantSpec(kind="weight", bits=bits, symmetric=bool(symmetric),
                                                 signed=True, axis=axis, block_size=block,
                                                 range_bits=range_bits, asked=bool(s["weights_ruled"]),
                                                 source=f"profile weights {n.op_type}{fallback}"))
        bslot = profile.bias.get(n.op_type)
        if bslot is not None and bslot < len(n.inputs) and _const(n.inputs[bslot]) is not None \
                and s["bias_quantized"] and not s["keep_float"]:
            plan.set_use(n.name, bslot, QuantSpec(kind="bias", bits=32, symmetric=True, signed=True,
                                                  source="profile bias"))
