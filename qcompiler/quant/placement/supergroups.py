"""Supergroups on the plan: decomposed norms/activations, fused op+activation pairs and linear op + bias Add;
quantizers only at their boundary, interiors stay float (field notes §2)."""
from __future__ import annotations

from typing import Iterable, List

from qcompiler.patterns.supergroups import (
    FLOAT_INTERIOR_KINDS,
    annotate_graph,
    supergroups_in,
)
from qcompiler.quant.core.plan import QuantPlan
from qcompiler.quant.placement.cost import macs_per_call
from qcompiler.quant.placement.options import PlacementOptions
from qcompiler.quant.targets.profiles import Profile

# norms and decomposed activations: no quantizer inside (Conv/MatMul + activation pairs come from the profile).
# The kinds and which of them stay float are listed once, in passes/supergroups.py.
SUPERGROUP_KINDS = FLOAT_INTERIOR_KINDS


def find_supergroups(g, kinds: Iterable[str] = SUPERGROUP_KINDS) -> List[tuple]:
    """[(kind, [nodes in order])] for each supergroup of `kinds` in `g`, read from the IR's annotations.

    The pattern library finds the structures; `annotate-supergroups` records them on the nodes (and protects
    their structural constants). Annotating here too makes placement independent of which passes ran before
    (an opset conversion rebuilds the IR and drops annotations); annotation is idempotent.
    """
    kinds = tuple(kinds)
    annotate_graph(g, kinds, recurse=False)
    return [(sg.split(":")[0], nodes) for sg, nodes in supergroups_in(g).items() if sg.split(":")[0] in kinds]


def _interior_values(nodes: list) -> List:
    """Outputs of the group's nodes read only inside the group (the boundary outputs are the rest)."""
    members = {id(n) for n in nodes}
    interior = []
    for n in nodes:
        for v in n.outputs:
            if v is None or v.is_output_of_any_graph():
                continue
            if all(id(c) in members for c in v.consumers()):
                interior.append(v)
    return interior


def mark_supergroups(plan: QuantPlan, g, profile: Profile, opts: PlacementOptions, stats=None) -> None:
    """Supergroups (decomposed norms/activations, fused op+activation pairs): their interiors stay float.

    A pair whose producer is big enough for its integer kernel to pay (profile `split_fused_above_macs`, measured
    from `stats`) is not one unit: the activation gets its own quantizers."""
    if opts.supergroups:
        kinds = SUPERGROUP_KINDS
        if isinstance(opts.supergroups, (list, tuple)):
            kinds = tuple(opts.supergroups)
        for kind, nodes in find_supergroups(g, kinds):
            plan.add_supergroup(kind, [n.name for n in nodes], [v.name for v in _interior_values(nodes)])
    fused = {tuple(p) for p in profile.fused_activations}
    _mark_bias_adds(plan, g, profile)
    # a decomposed activation supergroup (HardSwish) fuses with its producer like the op would (AIMET's
    # Conv+HardSwish supergroup): its input is then interior too
    entry = {}
    for sg in plan.supergroups:
        if sg.kind in _DECOMPOSED:
            for name in sg.nodes:
                entry[name] = sg.kind
    for n in g.nodes:
        for v in n.outputs:
            if v is None or v.is_output_of_any_graph():
                continue
            cons = v.consumers()
            if not cons:
                continue
            if len(cons) == 1 and (n.op_type, cons[0].op_type) in fused:
                act, kind, members = cons[0].op_type, cons[0].op_type, [cons[0].name]
            elif all(c.name in entry for c in cons) and (n.op_type, _DECOMPOSED[entry[cons[0].name]]) in fused:
                kind = entry[cons[0].name]
                act, members = _DECOMPOSED[kind], [c.name for c in cons]
            else:
                continue
            if not _split(n, act, profile, stats):
                plan.add_supergroup(f"{n.op_type}+{kind}", [n.name] + members, [v.name])


_DECOMPOSED = {"hardswish": "HardSwish", "gelu": "Gelu"}   # decomposed supergroup kind -> the op it computes


def _split(producer, act_op, profile: Profile, stats) -> bool:
    """Whether the (producer, activation) pair is two units: the producer's MACs per call reach the profile's
    `split_fused_above_macs` for that activation."""
    limit = profile.split_fused_above_macs.get(act_op) if act_op else None
    if limit is None or not stats:
        return False
    macs = macs_per_call(producer, stats)
    return macs is not None and macs >= limit


def _mark_bias_adds(plan: QuantPlan, g, profile: Profile) -> None:
    """A linear op whose only reader is an Add of a constant (a bias the exporter split off, torch Linear ->
    MatMul + Add) forms one unit with it: no quantizer between them (profile `bias_add_ops`).

    NOTE: the product goes on to the Add in float (ORT's MatMulIntegerToFloat takes the bias in; TensorRT fuses
    it), so a quantizer there only rounds twice: on minilm_l6 removing it raised last_hidden_state from 17.2 to
    18.7 dB (valid tokens 19.1 -> 20.9) and saved 24 Q/DQ pairs.
    """
    ops = set(profile.bias_add_ops)
    if not ops:
        return
    for n in g.nodes:
        if n.op_type not in ops or not n.outputs or n.outputs[0] is None:
            continue
        v = n.outputs[0]
        users = v.uses()
        if len(users) != 1 or v.is_output_of_any_graph():
            continue
        add = users[0].user
        if add.op_type != "Add" or len(add.inputs) != 2:
            continue
        other = add.inputs[1 - users[0].index]
        if other is None or other.const_value() is None:
            continue
        plan.add_supergroup(f"{n.op_type}+bias", [n.name, add.name], [v.name])
