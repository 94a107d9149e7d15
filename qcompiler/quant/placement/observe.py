"""Which values calibration observes, and the dtypes of those it skips (placement reads both)."""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from qcompiler.quant.calibration.calibrate import candidate_names
from qcompiler.quant.core.plan import QuantPlan
from qcompiler.quant.placement.options import PlacementOptions
from qcompiler.quant.placement.supergroups import mark_supergroups
from qcompiler.quant.targets.profiles import Profile


def observed_names(model, profile: Profile, opts: Optional[PlacementOptions] = None) -> List[str]:
    """Values worth observing during calibration: every candidate activation except those the plan keeps
    float for structural reasons (supergroup interiors, outputs of ops that are not quantizable)."""
    opts = opts or PlacementOptions()
    g = model.graph
    plan = QuantPlan(profile)
    mark_supergroups(plan, g, profile, opts)
    share = set(profile.shares_input_encoding)
    skip = set(plan.interior)
    # a pair the sizes may split (profile split_fused_above_macs: known only after calibration) keeps its
    # producer's output observed, so it can get its quantizer then
    splits = {op.lower() for op in profile.split_fused_above_macs}
    for sg in plan.supergroups:
        if "+" in sg.kind and sg.kind.split("+", 1)[1].lower() in splits:
            skip.difference_update(sg.interior)
    for n in g.nodes:
        # NOTE: outputs of ops that are not quantizable are still observed: their dtype decides whether a
        # Concat reading them needs a per-use quantizer, and the report lists integer tensors by name
        if n.op_type in share and n.op_type != "Gather":
            # NOTE: data movement keeps its input's dtype and (tied) encoding; observing it again only costs
            skip.update(v.name for v in n.outputs if v is not None and not v.is_output_of_any_graph())
    return [name for name in candidate_names(model) if name not in skip]


def propagate_dtypes(g, profile: Profile, dtypes: Dict[str, np.dtype]) -> Dict[str, np.dtype]:
    """Unobserved data-movement outputs carry their input 0's dtype (see `observed_names`)."""
    share = set(profile.shares_input_encoding)
    out = dict(dtypes)
    for n in g.nodes:
        if n.op_type in share and n.inputs and n.inputs[0] is not None and n.inputs[0].name in out:
            for v in n.outputs:
                if v is not None and v.name not in out:
                    out[v.name] = out[n.inputs[0].name]
    return out
