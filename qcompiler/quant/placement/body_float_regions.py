"""`--optimize balanced|latency` inside If/Loop/Scan bodies: float_regions.py's rule, body by body,
one body at a time, and the values crossing each body boundary agreeing afterwards.

Called by placement right after `float_regions.drop_float_region_quantizers` for the main graph, once the main graph's
quantizers are decided; the kernels are judged on the plan before this step, like the main graph's.

1. **A body without an integer kernel goes float** (`balanced` and `latency`): when no node of the body runs an
   integer kernel on the target (the profile's fusion table: QLinearConv, QLinearMatMul, QLinearAdd, ... with
   every input and output a kernel needs quantized), every activation quantizer defined in the body is float,
   with one reason naming the body. Such a body would only round its values to the grid and back, on every
   run of an If branch and on every iteration of a Loop/Scan, and each Q/DQ is one more kernel launch per
   iteration: measured on the CPU clock (benchmarks/bench_bodies.py), a body of 8-element tensors costs about
   0.4 us per kernel whatever the kernel does, so the quantized If(LSTM | GRU) ran 1.13x float with no
   integer kernel at all. Values read by a nested body keep their quantizer (the nested body decides), and
   weights keep the storage the target gives them (on ort_cpu the LSTM/GRU W/R are float on their grid
   already). `--optimize accuracy` keeps every quantizer.
2. **The main graph's rule inside each body**: a 16-bit quantizer no integer kernel reads or writes goes float
   (`balanced`), every quantizer without an integer-kernel neighbour and the weights of float kernels
   (`latency`), exactly as float_regions.py does for the main graph, with `g` the body.
3. **Captured values judged again**: float_regions keeps a value some body reads ("that body decides"); once the
   bodies are decided, a candidate (as in 2) whose readers, in its own graph and in the bodies that capture it,
   include no integer kernel goes float too (If(LSTM | GRU) under `latency`: the captured input's Q/DQ fed
   two float kernels).
4. **One encoding across each boundary, or float on both sides**: the values that are one tensor seen from both
   sides of a body (bodies.boundary_groups: a Loop's initial state, the body's state input and output, its
   final value; a Scan's state and each scan input with its slice) are one tie group. After 1 and 2 a group can
   be split: the main graph judged a Loop's initial value by its main-graph readers only (the Loop node, no
   integer kernel) while the body's MatMul reads the state on the int8 grid. When any member of the group
   still has an integer-kernel neighbour in its own graph, the members float_regions left float get their
   quantizer back (the group's one encoding on both sides); otherwise every member is float. An If's
   branch outputs are not grouped with the (float) If output, as in bodies.tie_boundaries.

Members left float for any other reason (a target without a wide grid, a config, a failed body placement)
are never given a quantizer back.
"""
from __future__ import annotations

from typing import Dict, Optional

from qcompiler.quant.core.plan import QuantPlan
from qcompiler.quant.placement.bodies import body_graphs, boundary_groups
from qcompiler.quant.placement.float_regions import (
    _Kernels,
    drop_float_region_quantizers,
)
from qcompiler.quant.placement.kernels import group_bits_table

# reasons this step and float_regions.py give: the specs `agree_across_boundaries` may give a quantizer back
FLOAT_REGIONS_PREFIX = "no integer kernel on "
NO_KERNEL_BODY = "no op inside runs an integer kernel on "
BOUNDARY = "tied across the boundary of "


def body_label(body) -> str:
    """"If 'branch' else_branch", "Loop 'cell_loop' body": how the report names a body."""
    n = body.parent
    if n is None:
        return "main graph"
    attr = "body"
    if n.op_type == "If":
        attr = "then_branch" if n.attr("then_branch") is body else "else_branch"
    return f"{n.op_type} '{n.name[:60]}' {attr}"


def drop_body_float_regions(plan: QuantPlan, g, table, everywhere: bool = False) -> int:
    """Steps 1-4 of the module docstring on every body under `g`; returns how many specs changed."""
    bodies = body_graphs(g)
    if not bodies:
        return 0
    k = _Kernels(plan, table)
    idle = [b for b in bodies if not has_integer_kernel(k, plan, b)]   # judged before anything below changes
    idle_ids = {id(b) for b in idle}
    changed = 0
    for body in idle:
        n = float_body(plan, body, f"{body_label(body)}: {NO_KERNEL_BODY}{plan.profile.name}: its Q/DQ "
                                   f"would cost kernels on every run or iteration and buy nothing "
                                   f"(--optimize accuracy keeps them)")
        changed += n
        if n:   # a body with nothing quantized (never reached by calibration) says so, not this
            float_bodies(plan)[body_key(body)] = (f"no op inside runs an integer kernel on {plan.profile.name}: "
                                                  f"activations left float (--optimize accuracy keeps them)")
    for body in bodies:
        if id(body) not in idle_ids:
            changed += drop_float_region_quantizers(plan, body, table, everywhere=everywhere)
    changed += drop_captured(plan, g, k, everywhere)
    changed += agree_across_boundaries(plan, g, k)
    return changed


def drop_captured(plan: QuantPlan, g, k, everywhere: bool) -> int:
    """A value read inside a body (a captured value) was kept by its own graph's rule whatever the body does
    ("that body decides"): judged again now that the bodies are decided, it goes float when no reader in any
    graph runs an integer kernel (If(LSTM | GRU) on ort_cpu under latency: the captured input's Q/DQ fed only
    float kernels). Candidates as in float_regions: every quantizer (`latency`), widened ones (`balanced`)."""
    bits = group_bits_table(plan)
    n = 0
    for owner in [g] + body_graphs(g):
        for v in [x for x in owner.inputs] + [o for m in owner.nodes for o in m.outputs if o is not None]:
            spec = plan.spec(v.name)
            if spec is None or spec.kind != "activation" or spec.keep_float:
                continue
            if not (everywhere or (spec.widened and bits.get(plan.find(v.name), spec.bits) > 8)):
                continue
            if not any(not u.is_graph_output and u.user.graph is not owner and
                       u.user.op_type not in ("If", "Loop", "Scan") for u in v.uses()):
                continue
            if not useful(k, plan, v, nested_decides=False):
                spec.float_(f"{FLOAT_REGIONS_PREFIX}{plan.profile.name} reads or writes it, inside the bodies that "
                            f"capture it or out: a Q/DQ pair here would only cost time (--optimize accuracy keeps it)")
                n += 1
    return n


def body_key(body) -> tuple:
    """(owner node name, index among the owner's bodies): how plan.Body records name a body."""
    n = body.parent
    return (n.name, next((i for i, b in enumerate(n.subgraphs()) if b is body), 0))


def float_bodies(plan: QuantPlan) -> Dict[tuple, str]:
    """{body_key: why its activations are float} for the bodies step 1 left float (record_bodies reports it)."""
    return plan.__dict__.setdefault("float_bodies", {})


def has_integer_kernel(k, plan: QuantPlan, body) -> bool:
    """Whether a node of `body` itself (not of a nested body) runs an integer kernel, or a weight-only one."""
    for n in body.nodes:
        if k.integer(n):
            return True
        for slot in range(1, len(n.inputs)):
            spec = plan.uses.get((n.name, slot))
            if spec is not None and not spec.keep_float and k.weight_only(n, slot, spec):
                return True
    return False


def _defined(body) -> list:
    vals = [v for v in body.inputs if not v.is_initializer]
    return vals + [o for n in body.nodes for o in n.outputs if o is not None]


def float_body(plan: QuantPlan, body, reason: str) -> int:
    """Every activation quantizer defined in `body` (and every per-use one at its nodes) float with `reason`,
    except values a nested body reads (that body decides)."""
    n = 0
    for v in _defined(body):
        spec = plan.spec(v.name)
        if spec is None or spec.kind != "activation" or spec.keep_float:
            continue
        if any(u.user is not None and not u.is_graph_output and u.user.graph is not body for u in v.uses()):
            continue
        spec.float_(reason)
        n += 1
    names = {m.name for m in body.nodes}
    for (node, _slot), spec in plan.uses.items():
        if node in names and spec.kind == "activation" and not spec.keep_float:
            spec.float_(reason)
            n += 1
    return n


def _by_float_regions(spec) -> bool:
    return spec.keep_float and (spec.reason.startswith(FLOAT_REGIONS_PREFIX) or NO_KERNEL_BODY in spec.reason
                                or spec.reason.startswith(BOUNDARY))


def useful(k, plan: QuantPlan, v, seen: Optional[Dict[str, bool]] = None, nested_decides: bool = True) -> bool:
    """Whether `v` has an integer-kernel neighbour in its own graph (float_regions.py's test: the producer is an
    integer kernel needing its output Q, directly or behind a Relu/Clip it absorbs; or a reader is one, directly
    or behind ops whose Q/DQ the runtime drops); a reader inside a nested body counts (that body decides), or,
    `nested_decides=False`, is judged like a reader of the same graph."""
    seen = {} if seen is None else seen
    if v.name in seen:
        return seen[v.name]
    seen[v.name] = False
    g = v.graph
    ok = False
    p = v.producer
    if p is not None:
        r = k.rule(p, "replace")
        if r is not None and r.output_q == "required" and k.integer(p):
            ok = True
        elif p.op_type in k.through and p.inputs and p.inputs[0] is not None and p.inputs[0].producer is not None:
            q = p.inputs[0].producer
            rq = k.rule(q, "replace")
            ok = rq is not None and p.op_type in rq.absorbs and k.integer(q)
    if not ok:
        for u in v.uses():
            if u.is_graph_output:
                continue
            reader = u.user
            if reader.op_type in ("If", "Loop", "Scan"):
                continue               # the control-flow node itself runs no integer kernel
            if reader.graph is not g and nested_decides:
                ok = True              # read inside a nested body (a captured value): that body decides
                break
            if k.integer(reader):
                ok = True
            elif k.rule(reader, "drop_qdq") is not None and u.index == 0 and reader.outputs \
                    and reader.outputs[0] is not None and useful(k, plan, reader.outputs[0], seen, nested_decides):
                ok = True
            if ok:
                break
    seen[v.name] = ok
    return ok


def agree_across_boundaries(plan: QuantPlan, g, k) -> int:
    """Step 4 of the module docstring: each boundary group quantized on both sides or float on both."""
    changed = 0
    for owner in [g] + body_graphs(g):
        for n in owner.nodes:
            if n.op_type not in ("Loop", "Scan"):
                continue   # an If's output is float: its branches keep their own grids (bodies.tie_boundaries)
            outs = {id(v) for v in n.outputs if v is not None}
            for grp in boundary_groups(n):
                members = [(v, plan.spec(v.name)) for v in grp]
                # the Loop/Scan outputs are float (the node is not quantizable on the built-in targets): the final
                # state and the stacked scan outputs are read outside as float, nothing to agree with
                members = [(v, s) for v, s in members if s is not None and s.kind == "activation"
                           and not (id(v) in outs and s.keep_float and not _by_float_regions(s))]
                if len(members) < 2 or any(s.keep_float and not _by_float_regions(s) for _, s in members):
                    continue
                floated = [s for _, s in members if s.keep_float]
                if not floated or len(floated) == len(members):
                    continue
                if any(useful(k, plan, v) for v, s in members):
                    for s in floated:
                        s.keep_float, s.reason = False, ""
                        s.source += f"; quantized again: {n.op_type} '{n.name[:60]}' carries it into or out of " \
                                    f"a body where an integer kernel reads it (one encoding on both sides)"
                        changed += 1
                else:
                    why = (f"{BOUNDARY}{n.op_type} '{n.name[:60]}' with values no integer kernel reads: float on "
                           f"both sides (--optimize accuracy keeps them)")
                    for _, s in members:
                        if not s.keep_float:
                            s.float_(why)
                            changed += 1
    return changed


__all__ = ["drop_body_float_regions", "float_body", "agree_across_boundaries", "has_integer_kernel", "useful",
           "body_label"]
