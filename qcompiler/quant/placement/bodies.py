"""If/Loop/Scan bodies: what calibration observes inside them, their activations placed by the main graph's
rules, the ties across each body boundary, and one record per body for the report.

- **Observed**: `observed_body_names` applies `observed_names`' rules to each body (no supergroup interiors, no
  data-movement copies); body_probe.py probes those values (float ones only: integer tensors never quantized).
- **Placed**: each body graph goes through the same steps as the main graph (supergroups, activations,
  needless quantizers, ties, Concat spread), with the same plan: keys are value names (unique model-wide) and
  (body node name, slot). A value calibration never reached (a branch never taken, a loop that never ran) has
  no dtype and gets no quantizer: it stays float, counted on its body's record.
- **Across the boundary** (`tie_boundaries`): one encoding for a value on both sides, as one tie group:
  Loop: initial value, body state input, body state output (the state is one tensor over every iteration);
  Scan: the same for its state, and each scan input with the body's slice of it; If: the outputs of both
  branches that become one If output, and a body's scan output with the stacked output, when that outer side
  is quantized. The If/Loop/Scan node is not quantizable on the built-in targets, so its outputs are float and
  If branches keep their own grids (each branch's DQ gives the float output); the Loop/Scan state stays one
  group whatever the outer side is. A group that 8 bits cannot carry is
  widened as a whole (calibrate.assign_encodings: the widest member decides), or floats with its reason.
- Q/DQ of a value captured from an outer graph sits in the graph that defines it (qdq.apply_plan): the body
  keeps reading the captured name's DQ output, a valid outer-scope name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
from onnx import TensorProto

from qcompiler.quant.core.plan import Body, QuantPlan
from qcompiler.quant.placement.activations import (
    drop_needless_quantizers,
    place_activations,
)
from qcompiler.quant.placement.observe import propagate_dtypes
from qcompiler.quant.placement.options import PlacementOptions
from qcompiler.quant.placement.supergroups import mark_supergroups
from qcompiler.quant.placement.ties import check_tie_spread, tie_values
from qcompiler.quant.placement.widening import MIN_SQNR8_DB
from qcompiler.quant.targets.profiles import Profile


def body_graphs(g) -> List:
    """Every If/Loop/Scan body under `g`, outermost first."""
    return g.subgraphs(recursive=True)


def observed_body_names(model, profile: Profile, opts: Optional[PlacementOptions] = None) -> List[str]:
    """Body values worth observing: body inputs and node outputs of every body, minus what `observed_names`
    leaves out in the main graph (supergroup interiors, data-movement copies other than Gather)."""
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
    for body in body_graphs(g):
        try:
            plan.dtypes = propagate_dtypes(body, profile, plan.dtypes)
            mark_supergroups(plan, body, profile, opts)
            place_activations(plan, body, profile, opts)
            drop_needless_quantizers(plan, body, profile)
        except Exception as e:   # noqa: BLE001 - a body placement cannot handle stays float
            why = (f"left float: placement inside the body of {body.parent.op_type} '{body.parent.name[:60]}' "
                   f"failed ({type(e).__name__}: {str(e)[:80]})")
            for v in body.local_values():
                spec = plan.values.get(v.name)
                if spec is not None and spec.kind == "activation":
                    spec.float_(why)


def tie_bodies(plan: QuantPlan, g, profile: Profile, stats: Dict[str, dict]) -> None:
    """Ties inside each body (data movement, Concat) and across each body boundary."""
    for body in body_graphs(g):
        tie_values(plan, body, profile)
    tie_boundaries(plan, g, stats)
    for body in body_graphs(g):
        check_tie_spread(plan, stats, body)


def _quantized(plan: QuantPlan, v) -> bool:
    spec = plan.spec(v.name) if v is not None else None
    return spec is not None and spec.kind == "activation" and not spec.keep_float


def _tie_all(plan: QuantPlan, values) -> None:
    """Tie the quantized members. A fixed output range (Tanh's [-1, 1]) holds for its own member only: the
    group's range comes from every member's statistics instead (a Loop state starting from an unbounded input
    and carried through a Tanh would otherwise be clipped to [-1, 1] at the loop's entry)."""
    vals = [v for v in values if _quantized(plan, v)]
    if len(vals) < 2:
        return
    specs = [plan.spec(v.name) for v in vals]
    if len({s.fixed_range for s in specs}) > 1:
        for s in specs:
            if s.fixed_range is not None:
                s.source += f"; fixed range {s.fixed_range} dropped: tied across a body boundary"
                s.fixed_range = None
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


# Loop-carried state: the rounding error of one iteration is carried into the next, so the state's grid needs
# this much more headroom than widening.MIN_SQNR8_DB asks of a value computed once (the LSTM cell state gets the
# wide grid unconditionally for the same reason: activations.CELL_STATE)
CARRY_MARGIN_DB = 10.0


def carried_groups(n) -> List[list]:
    """The loop-carried states among `boundary_groups(n)` (Loop: every carried value; Scan: its states)."""
    groups = boundary_groups(n)
    if n.op_type == "Loop":
        return groups
    if n.op_type == "Scan":
        m = int(n.attr("num_scan_inputs", 0) or 0)
        return groups[:max(len(n.inputs) - m, 0)]
    return []


def _sqnr_on(st: dict, span: float) -> float:
    """Estimated SQNR (dB) of a value with statistics `st` on an 8-bit grid spanning `span`."""
    own = max(st.get("max", 0.0), 0.0) - min(st.get("min", 0.0), 0.0)
    if "mean_sq" in st:
        power = st["mean_sq"]
    elif "sqnr8_db" in st and np.isfinite(st["sqnr8_db"]) and own > 0:
        power = 10 ** (st["sqnr8_db"] / 10) * (own / 255) ** 2 / 12
    else:
        return float("inf")
    step = span / 255
    return float("inf") if step <= 0 or power <= 0 else float(10 * np.log10(power * 12 / step ** 2))


def check_carried_state(plan: QuantPlan, n, stats: Dict[str, dict], profile: Profile) -> None:
    """Loop-carried state 8 bits cannot carry: estimated on the group's one grid, each member
    needs widening.MIN_SQNR8_DB + CARRY_MARGIN_DB; else the group goes to the wide grid, or float without one."""
    wide = profile.wide_activation_bits
    for grp in carried_groups(n):
        vals = [v for v in grp if _quantized(plan, v)]
        specs = [plan.spec(v.name) for v in vals]
        if not specs or max(s.bits for s in specs) > 8:
            continue
        seen = [stats[v.name] for v in vals if stats.get(v.name)]
        if not seen:
            continue
        span = max(max(st.get("max", 0.0), 0.0) for st in seen) - min(min(st.get("min", 0.0), 0.0) for st in seen)
        worst = min(_sqnr_on(st, span) for st in seen)
        if worst >= MIN_SQNR8_DB + CARRY_MARGIN_DB:
            continue
        why = (f"state carried by {n.op_type} '{n.name}' across iterations: an 8-bit grid gives ~{worst:.0f} dB per "
               f"iteration and the error is carried into the next")
        for sp in specs:
            if wide:
                sp.bits, sp.widened = int(wide), why
            else:
                sp.float_(why + "; no wide grid on this target")


def tie_boundaries(plan: QuantPlan, g, stats: Optional[Dict[str, dict]] = None) -> None:
    """One encoding per boundary group (`boundary_groups`) among its quantized members; loop-carried state
    8 bits cannot carry widened or float (`check_carried_state`)."""
    for owner in [g] + body_graphs(g):
        for n in owner.nodes:
            if n.op_type in ("If", "Loop", "Scan"):
                if stats is not None:
                    check_carried_state(plan, n, stats, plan.profile)
                outs = {id(v) for v in n.outputs if v is not None}
                for grp in boundary_groups(n):
                    if grp and id(grp[0]) in outs and n.op_type == "If" and not _quantized(plan, grp[0]):
                        # NOTE: the If output is float (the If node is not quantizable): each branch's DQ already
                        # gives it float values, and one grid over both branches would only coarsen the branch
                        # with the smaller range (Relu(x²) in one, -x² in the other: 36 -> 21 dB)
                        continue
                    if len(grp) == 2 and id(grp[1]) in outs and not _quantized(plan, grp[1]):
                        continue   # a scan output: stacked outside as float, nothing to agree with
                    _tie_all(plan, grp)


def _float_body_values(plan: QuantPlan, body) -> int:
    """Float-typed values of `body` that calibration never reached (no dtype: no quantizer)."""
    floats = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}
    vals = [v for v in body.inputs if not v.is_initializer]
    vals += [v for n in body.nodes if n.op_type != "Constant" for v in n.outputs if v is not None]
    return sum(1 for v in vals if v.name not in plan.dtypes and v.dtype in floats)


@dataclass
class FloatBody(Body):
    """A body record whose activations --optimize left float on purpose (body_float_regions.py), with why."""

    why_float: str = ""

    @property
    def reason(self) -> str:
        base = super().reason
        if self.activations or not self.why_float:
            return base
        return base.split(": activations float")[0] + ": " + self.why_float


def record_bodies(plan: QuantPlan, g) -> None:
    """A `Body` record per If/Loop/Scan body: weight uses and activations quantized inside it, and how many of
    its float values calibration never reached (they stay float); a body --optimize left float says why."""
    why = plan.__dict__.get("float_bodies", {})
    for owner in [g] + body_graphs(g):
        for n in owner.nodes:
            for i, body in enumerate(n.subgraphs()):
                names = {m.name for m in body.nodes}
                w = sum(1 for (node, _), spec in plan.uses.items()
                        if node in names and spec.kind == "weight" and not spec.keep_float)
                local = {v.name for v in body.local_values()}
                acts = sum(1 for name in local if _quantized_name(plan, name))
                rec = (n.name, n.op_type, i, len(body), w, acts, _float_body_values(plan, body))
                plan.bodies.append(FloatBody(*rec, why_float=why[(n.name, i)]) if (n.name, i) in why else Body(*rec))


def _quantized_name(plan: QuantPlan, name: str) -> bool:
    spec = plan.values.get(name)
    return spec is not None and spec.kind == "activation" and not spec.keep_float and \
        np.issubdtype(plan.dtypes.get(name, np.float32), np.floating)
