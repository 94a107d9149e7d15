"""Ties: data-movement outputs share input 0's encoding, Concat inputs share the output's (anchors B); a Concat
joining very different ranges is untied (field notes §6)."""
from __future__ import annotations

from typing import Dict

from qcompiler.quant.core.plan import QuantPlan, QuantSpec
from qcompiler.quant.placement.lookup import float_check
from qcompiler.quant.targets.profiles import Profile

CONCAT_RANGE_RATIO_LIMIT = 64.0


def tie_values(plan: QuantPlan, g, profile: Profile) -> None:
    """Data movement shares input 0's encoding; Concat inputs share the output's (a float producer's input gets
    a per-use quantizer with the group's encoding instead)."""
    float_ok = float_check(plan.dtypes)
    share = set(profile.shares_input_encoding)
    ties = set(profile.tie_inputs_and_output)
    for n in g.nodes:
        if n.op_type in share and n.inputs and float_ok(n.inputs[0]):
            src = plan.spec(n.inputs[0].name)
            for v in n.outputs:
                spec = plan.spec(v.name) if v is not None else None
                if spec is None or spec.keep_float:
                    continue
                if src is None or src.keep_float:
                    # NOTE: the input carries no encoding to share (float producer): the output quantizes on
                    # its own; tying must never push an encoding up through a float producer (§2).
                    continue
                plan.tie(n.inputs[0].name, v.name)
        elif n.op_type in ties and float_ok(n.outputs[0]):
            out = n.outputs[0]
            ospec = plan.spec(out.name)
            if ospec is None or ospec.keep_float:
                continue
            for slot, u in enumerate(n.inputs):
                if not float_ok(u):
                    continue
                uspec = plan.spec(u.name)
                if uspec is not None and not uspec.keep_float:
                    plan.tie(out.name, u.name)
                else:
                    # producer not quantizable: quantize at this use, with the group's encoding
                    plan.set_use(n.name, slot, QuantSpec(kind="activation", bits=ospec.bits,
                                                         symmetric=ospec.symmetric, source="Concat tie",
                                                         tie_root=out.name))


def check_tie_spread(plan: QuantPlan, stats: Dict[str, dict], g) -> None:
    """§6: a Concat joining very different ranges (pixel boxes with 0-1 scores) keeps its output float."""
    ties = set(plan.profile.tie_inputs_and_output)
    for n in g.nodes:
        if n.op_type not in ties or n.outputs[0] is None:
            continue
        out = n.outputs[0]
        spans = []
        for u in n.inputs:
            st = stats.get(u.name) if u is not None else None
            if st:
                spans.append(max(abs(st["min"]), abs(st["max"]), 1e-12))
        if len(spans) >= 2 and max(spans) / min(spans) >= CONCAT_RANGE_RATIO_LIMIT:
            plan.untie([out.name])
            spec = plan.spec(out.name)
            if spec is not None:
                spec.float_(f"Concat '{n.name}' joins ranges {max(spans) / min(spans):.0f}x apart: one 8-bit "
                            f"grid would erase the small ones; inputs keep their own encodings")
            for slot in range(len(n.inputs)):
                us = plan.uses.get((n.name, slot))
                if us is not None and us.tie_root is not None:
                    del plan.uses[(n.name, slot)]
