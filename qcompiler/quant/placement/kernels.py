"""Which weighted nodes will run an integer kernel on the target, estimated from the plan before encodings
exist, and the full weight grid for those that will not (storage.py reads the same rule once encodings exist)."""
from __future__ import annotations

from typing import Dict, Optional

from qcompiler.quant.core.plan import QuantPlan


def group_bits_table(plan: QuantPlan) -> Dict[str, int]:
    """tie-group root -> bits its activations will carry (a widened member widens its group, calibrate.py)."""
    table: Dict[str, int] = {}
    for name, s in plan.values.items():
        if s.kind == "activation" and not s.keep_float:
            root = plan.find(name)
            table[root] = max(table.get(root, 0), s.bits)
    return table


def _act_bits(plan: QuantPlan, table: Dict[str, int], v) -> Optional[int]:
    """Bits the activation `v` will carry, None when float (or not an activation)."""
    spec = plan.spec(v.name) if v is not None else None
    if spec is None or spec.keep_float or spec.kind != "activation":
        return None
    return table.get(plan.find(v.name), spec.bits)


def integer_kernel(plan: QuantPlan, table: Dict[str, int], node) -> bool:
    """Will the runtime run `node` as an integer kernel (profile `integer_weight_kernels`, read from the plan
    before encodings exist, as storage.unfused_reason reads it once they do: its input, its weight and, where
    the rule asks, its output at the rule's bits)? Unsure cases answer True."""
    rule = plan.profile.integer_weight_kernels.get(node.op_type)
    if rule is None:
        return False
    bits = rule.act_bits
    if not node.inputs or _act_bits(plan, table, node.inputs[0]) != bits:
        return False
    # its weight too, where the plan has one (storage.unfused_reason's rule): a float, 4-bit or 16-bit weight is
    # read by a float kernel (a MatMul of two activations has none: its second input is judged as an activation)
    for slot in plan.profile.weights.get(node.op_type) or ():
        w = plan.uses.get((node.name, slot))
        if w is not None and w.kind == "weight" and (w.keep_float or w.bits != bits):
            return False
    if rule.output_q:
        through = set(plan.profile.output_q_through)
        v = node.outputs[0]
        while v is not None and v.name in plan.interior:
            cons = v.consumers()
            if len(cons) != 1 or cons[0].op_type not in through:
                return True
            v = cons[0].outputs[0]
        return v is None or _act_bits(plan, table, v) == bits
    return True


def full_range_for_float_kernels(plan: QuantPlan, g) -> None:
    """Weights whose node runs a float kernel use their whole grid: `range_bits` (ORT's reduce_range) exists
    only because u8 x s8 pairs summed into int16 saturate inside integer kernels (anchors F).

    NOTE: such weights are stored on their int8 grid (storage.py) and multiplied in float. On minilm_l6 the FFN
    down projection of layer 0 (16-bit input, so a float MatMul) has one output channel whose largest weight is
    39x its rms; on the 7-bit grid that channel's small weights rounded so coarsely that padding tokens, which
    do not fire the large weight's neuron, lost their last_hidden_state (3.3 dB; 17.2 dB with the full grid).
    """
    by_name = plan.nodes
    table = group_bits_table(plan)
    for (node_name, slot), spec in plan.uses.items():
        if spec.kind != "weight" or spec.keep_float or not spec.range_bits or spec.range_bits >= spec.bits:
            continue
        node = by_name.get(node_name)
        if node is not None and not integer_kernel(plan, table, node):
            spec.range_bits = spec.bits
            spec.source += "; full range (float kernel)"


def float_macs(plan: QuantPlan) -> float:
    """Multiply-accumulates per call of the sized nodes (plan.macs) that will run a float kernel by
    `integer_kernel`: the cost model's latency estimate of a plan, before any session exists (a value widened to
    16 bits turns its 8-bit-only readers float, and so does a node kept float)."""
    table = group_bits_table(plan)
    total = 0.0
    for name, m in (getattr(plan, "macs", None) or {}).items():
        node = plan.nodes.get(name)
        if node is None or not integer_kernel(plan, table, node):
            total += m
    return total
