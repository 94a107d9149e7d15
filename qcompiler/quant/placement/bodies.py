"""If/Loop/Scan bodies on the plan: one record each (weights quantized inside, activations float)."""
from __future__ import annotations

from ..plan import Body, QuantPlan


def record_bodies(plan: QuantPlan, g) -> None:
    """A `Body` record per If/Loop/Scan body: its weights are quantized, its activations stay float (§1).

    NOTE: calibration observes main-graph values only (ORT cannot fetch a body's intermediates as outputs), so
    nothing inside a body has an activation range yet; the body's weights need none.
    """
    for owner in [g] + g.subgraphs(recursive=True):
        for n in owner.nodes:
            for i, body in enumerate(n.subgraphs()):
                names = {m.name for m in body.nodes}
                w = sum(1 for (node, _), spec in plan.uses.items()
                        if node in names and spec.kind == "weight" and not spec.keep_float)
                plan.bodies.append(Body(n.name, n.op_type, i, len(body), w))
