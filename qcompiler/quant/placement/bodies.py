"""If/Loop/Scan bodies: what calibration observes inside them, their activations placed by the main graph's
rules, the ties across each body boundary, and one record per body for the report (issue 14 items 2-4).

- **Observed**: `observed_body_names` applies `observed_names`' rules to each body (no supergroup interiors, no
  data-movement copies); body_probe.py probes those values (float ones only: integer tensors never quantized).
- **Placed**: each body graph goes through the same steps as the main graph (supergroups, activations,
  needless quantizers, ties, Concat spread), with the same plan: keys are value names (unique model-wide) and
  (body node name, slot). A value calibration never reached (a branch never taken, a loop that never ran) has
  no dtype and gets no quantizer: it stays float, counted on its body's record.
- **Across the boundary** (`tie_boundaries`): one encoding for a value on both sides, as one tie group:
  Loop: initial value, body state input, body state output (the state is one tensor over every iteration);
  Scan: the same for its state, and each scan input with the body's slice of it; If: the outputs of both
  branches that become one If output. The outer side is float where its producer is (the If/Loop/Scan node
  itself is not quantizable): then the body carries the group alone. A group that 8 bits cannot carry is
  widened as a whole (calibrate.assign_encodings: the widest member decides), or floats with its reason.
- Q/DQ of a value captured from an outer graph sits in the graph that defines it (qdq.apply_plan): the body
  keeps reading the captured name's DQ output, a valid outer-scope name.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from ..plan import Body, QuantPlan
from ..profiles import Profile
from .options import PlacementOptions


def body_graphs(g) -> List:
    """Every If/Loop/Scan body under `g`, outermost first."""
    return g.subgraphs(recursive=True)


def observed_body_names(model, profile: Profile, opts: Optional[PlacementOptions] = None) -> List[str]:
    """Body values worth observing: body inputs and node outputs of every body, minus what `observed_names`
    leaves out in the main graph (supergroup interiors, data-movement copies other than Gather)."""
    from .supergroups import mark_supergroups
    opts = opts or PlacementOptions()
    share = set(profile.shares_input_encoding)
    out: List[str] = []
    for body in body_graphs(model.graph):
        plan = QuantPlan(profile)
        mark_supergroups(plan, body, profile, opts)
        skip = set(plan.interior)
        for n in body.nodes:
            if n.op_type in share and n.op_type != "Gather":
                skip.update(v.name for v in n.outputs if v is not None and not v.is_output_of_any_graph())
        names = [v.name for v in body.inputs if not v.is_initializer]
        for n in body.nodes:
            if n.op_type != "Constant":
                names.extend(v.name for v in n.outputs if v is not None)
        out.extend(x for x in names if x and x not in skip)
    return out


def place_bodies(plan: QuantPlan, g, profile: Profile, opts: PlacementOptions) -> None:
    """The main graph's placement steps on every body (the plan's dtypes already hold the body values seen)."""
    from .activations import drop_needless_quantizers, place_activations
    from .observe import propagate_dtypes
    from .supergroups import mark_supergroups
    for body in body_graphs(g):
        plan.dtypes = propagate_dtypes(body, profile, plan.dtypes)
        mark_supergroups(plan, body, profile, opts)
        place_activations(plan, body, profile, opts)
        drop_needless_quantizers(plan, body, profile)


def tie_bodies(plan: QuantPlan, g, profile: Profile, stats: Dict[str, dict]) -> None:
    """Ties inside each body (data movement, Concat) and across each body boundary."""
    from .ties import check_tie_spread, tie_values
    for body in body_graphs(g):
        tie_values(plan, body, profile)
    tie_boundaries(plan, g)
    for body in body_graphs(g):
        check_tie_spread(plan, stats, body)


def _quantized(plan: QuantPlan, v) -> bool:
    spec = plan.spec(v.name) if v is not None else None
    return spec is not None and spec.kind == "activation" and not spec.keep_float


def _tie_all(plan: QuantPlan, values) -> None:
    vals = [v for v in values if _quantized(plan, v)]
    for v in vals[1:]:
        plan.tie(vals[0].name, v.name)


def boundary_groups(n) -> List[list]:
    """The values of one If/Loop/Scan node `n` that are one tensor seen from both sides of its bodies."""
    groups: List[list] = []
    bodies = n.subgraphs()
    if n.op_type == "If" and len(bodies) == 2:
        a, b = bodies
        for i, o in enumerate(n.outputs):
            groups.append([o] + [body.outputs[i] for body in (a, b) if i < len(body.outputs)])
    elif n.op_type == "Loop" and bodies:
        body = bodies[0]
        carried = max(len(n.inputs) - 2, 0)
        for k in range(carried):
            grp = [n.inputs[2 + k]]
            if 2 + k < len(body.inputs):
                grp.append(body.inputs[2 + k])
            if 1 + k < len(body.outputs):
                grp.append(body.outputs[1 + k])
            if k < len(n.outputs):
                grp.append(n.outputs[k])
            groups.append(grp)
    elif n.op_type == "Scan" and bodies:
        body = bodies[0]
        m = int(n.attr("num_scan_inputs", 0) or 0)
        states = len(n.inputs) - m
        for k in range(max(states, 0)):
            grp = [n.inputs[k]]
            if k < len(body.inputs):
                grp.append(body.inputs[k])
            if k < len(body.outputs):
                grp.append(body.outputs[k])
            if k < len(n.outputs):
                grp.append(n.outputs[k])
            groups.append(grp)
        for j in range(m):
            if states + j < len(n.inputs) and states + j < len(body.inputs):
                groups.append([n.inputs[states + j], body.inputs[states + j]])
        for j in range(len(body.outputs) - states):
            if states + j < len(n.outputs):
                groups.append([body.outputs[states + j], n.outputs[states + j]])
    return [[v for v in grp if v is not None] for grp in groups]


def tie_boundaries(plan: QuantPlan, g) -> None:
    """One encoding per boundary group (`boundary_groups`) among its quantized members."""
    for owner in [g] + body_graphs(g):
        for n in owner.nodes:
            if n.op_type in ("If", "Loop", "Scan"):
                for grp in boundary_groups(n):
                    _tie_all(plan, grp)


def _float_body_values(plan: QuantPlan, body) -> int:
    """Float-typed values of `body` that calibration never reached (no dtype: no quantizer)."""
    from onnx import TensorProto
    floats = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
    vals = [v for v in body.inputs if not v.is_initializer]
    vals += [v for n in body.nodes if n.op_type != "Constant" for v in n.outputs if v is not None]
    return sum(1 for v in vals if v.name not in plan.dtypes and v.dtype in floats)


def record_bodies(plan: QuantPlan, g) -> None:
    """A `Body` record per If/Loop/Scan body: weight uses and activations quantized inside it, and how many of
    its float values calibration never reached (they stay float)."""
    for owner in [g] + body_graphs(g):
        for n in owner.nodes:
            for i, body in enumerate(n.subgraphs()):
                names = {m.name for m in body.nodes}
                w = sum(1 for (node, _), spec in plan.uses.items()
                        if node in names and spec.kind == "weight" and not spec.keep_float)
                local = {v.name for v in body.local_values()}
                acts = sum(1 for name in local if _quantized_name(plan, name))
                plan.bodies.append(Body(n.name, n.op_type, i, len(body), w, acts, _float_body_values(plan, body)))


def _quantized_name(plan: QuantPlan, name: str) -> bool:
    spec = plan.values.get(name)
    return spec is not None and spec.kind == "activation" and not spec.keep_float and \
        np.issubdtype(plan.dtypes.get(name, np.float32), np.floating)
