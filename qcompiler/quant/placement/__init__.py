"""Quantizer placement: fill a QuantPlan from the graph, the backend profile, the config and calibration stats.

`build_plan` is the sequence of steps below, one module each: supergroups.py (units whose interior stays
float), weights.py (per-use weight and bias specs), activations.py (a quantizer per float value, or float with
its reason), bodies.py (If/Loop/Scan records), widening.py (§6: what 8 bits cannot carry), ties.py (shared
encodings), kernels.py (full weight grid where the kernel is float). observe.py picks what calibration observes;
storage.py decides, once encodings exist, how each weight is stored (int + DQ, or float on its grid);
options.py holds the knobs; lookup.py the IR lookups.

Rules (field notes §2, §3, §6):
- Every float activation (graph input or node output of the main graph) gets a quantizer at its producer,
  unless it is integer-typed, produced by an op the profile marks not quantizable, inside a supergroup
  (LayerNorm/RMSNorm/GELU/HardSwish decompositions, Conv→Relu-like pairs), or 8 bits cannot carry it (§6).
  A value that is also a graph output keeps the quantizer on every use: the graph output is one more use.
- Weights (profile `weights` slots holding constants, initializers or Constant-node outputs alike) get
  per-use specs with the op's per-channel axis, so a weight shared by two Gemms with different transB gets two
  copies and one with the same axis gets one DQ. Bias slots become int32 (scale s_in * s_w) in qdq.py.
- Weights inside If/Loop/Scan bodies (recursively, captured outer weights included) get the same per-use
  specs (field notes §1); the bodies' activations follow the main graph's rules where calibration observed
  them (bodies.py: ties across each body boundary), and the report lists each body once.
- Data-movement outputs tie to input 0; Concat inputs tie to its output. Ties never cross a producer that is
  not quantizable (that input gets a per-use quantizer at the Concat instead) and never touch integer tensors.
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np

from qcompiler.quant.core.plan import QuantPlan
from qcompiler.quant.placement.activations import (
    CELL_STATE,
    drop_needless_quantizers,
    place_activations,
)
from qcompiler.quant.placement.bodies import (
    observed_body_names,
    place_bodies,
    record_bodies,
    tie_bodies,
)
from qcompiler.quant.placement.body_float_regions import drop_body_float_regions
from qcompiler.quant.placement.cost import SIZED_OPS, node_macs, observed_sizes
from qcompiler.quant.placement.dynamic_weights import symmetric_dynamic_weights
from qcompiler.quant.placement.float_regions import (
    ACTIVATIONS_AS_BALANCED,
    drop_float_region_quantizers,
)
from qcompiler.quant.placement.input_quantizers import quantize_inputs
from qcompiler.quant.placement.kernels import (
    full_range_for_float_kernels,
    integer_kernel,
)
from qcompiler.quant.placement.lookup import nodes_by_name, weight_nodes
from qcompiler.quant.placement.observe import observed_names, propagate_dtypes
from qcompiler.quant.placement.options import PlacementOptions
from qcompiler.quant.placement.storage import decide_storage
from qcompiler.quant.placement.supergroups import (
    SUPERGROUP_KINDS,
    find_supergroups,
    mark_supergroups,
)
from qcompiler.quant.placement.ties import check_tie_spread, tie_values
from qcompiler.quant.placement.weights import block_axis, place_weights
from qcompiler.quant.placement.widening import bulk_names, widen_or_float
from qcompiler.quant.targets.fusions import load_fusions
from qcompiler.quant.targets.profiles import Profile

__all__ = ["build_plan", "observed_names", "observed_body_names", "PlacementOptions", "block_axis", "nodes_by_name",
           "weight_nodes", "find_supergroups", "SUPERGROUP_KINDS", "decide_storage", "CELL_STATE", "integer_kernel",
           "bulk_names"]


def build_plan(model, profile: Profile, dtypes: Dict[str, np.dtype], stats: Dict[str, dict],
               opts: Optional[PlacementOptions] = None) -> QuantPlan:
    """Fill a QuantPlan for the main graph from the profile, settings, observed dtypes and statistics.

    `dtypes` maps every observed value name to its runtime numpy dtype (calibration saw it); values missing
    from it are not quantized. `stats` maps names to observer `stats()` dicts (field notes §6 checks).
    """
    opts = opts or PlacementOptions()
    g = model.graph
    plan = QuantPlan(profile, opts.optimize)
    plan.nodes = nodes_by_name(g)
    plan.dtypes = propagate_dtypes(g, profile, dtypes)
    plan.macs = node_macs(g, stats, SIZED_OPS)
    mark_supergroups(plan, g, profile, opts, stats)
    place_weights(plan, g, profile, opts)           # main graph and If/Loop/Scan bodies (field notes §1)
    place_activations(plan, g, profile, opts)
    quantize_inputs(plan, g, profile, opts, stats)  # config input_quantized (the W8A8 preset)
    drop_needless_quantizers(plan, g, profile)
    place_bodies(plan, g, profile, opts)            # the same rules inside If/Loop/Scan bodies
    tie_bodies(plan, g, profile, stats)             # inside bodies and across their boundaries
    widen_or_float(plan, stats, profile, g)
    tie_values(plan, g, profile)
    check_tie_spread(plan, stats, g)
    symmetric_dynamic_weights(plan, g, profile, opts)     # AIMET: K/V feeding a MatMul take the weights' symmetry
    if opts.optimize != "accuracy" and profile.fusions:
        table = load_fusions(profile.fusions)
        sized = {op for r in table.fusions if r.min_macs for op in r.ops}
        plan.node_macs = node_macs(g, stats, sized) if sized else {}
        plan.sizes = observed_sizes(stats)
        fast = opts.optimize == "latency"     # narrowing and the latency search: latency only (see float_regions)
        drop_float_region_quantizers(plan, g, table, everywhere=True,  # then passes/quantize/latency_search.py
                                     narrow=fast, cost=opts.optimize)
        # the same rules inside If/Loop/Scan bodies, their boundaries agreeing; the latency search measures
        # main-graph candidates only, so inside bodies `latency` keeps the rule
        drop_body_float_regions(plan, g, table, everywhere=opts.optimize not in ACTIVATIONS_AS_BALANCED)
    full_range_for_float_kernels(plan, g)
    record_bodies(plan, g)
    return plan
