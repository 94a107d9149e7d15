"""Dynamic weights: an activation read as the weight input of a Conv/ConvTranspose/Gemm/MatMul (attention's K and V
feeding a MatMul) takes the weights' symmetry, on profiles that list the op in `symmetric_dynamic_weight_ops`.

AIMET-ONNX does this for every config (quantsim `_apply_param_symmetry_to_inputs`): the closest enabled quantizer
upstream of input 1, through grid-preserving ops, gets the params' `is_symmetric`. A file for AIMET's default
config must say `is_sym: true` there, or its strict loader counts a mismatch (12 on minilm_l6). Here
the quantizer found the same way (through `shares_input_encoding` ops) and its whole tie group turn symmetric.
"""
from __future__ import annotations

from qcompiler.quant.core.plan import QuantPlan
from qcompiler.quant.placement.options import PlacementOptions, node_settings
from qcompiler.quant.targets.profiles import Profile


def _feeding_quantizer(plan: QuantPlan, v, share: set):
    """The name of the value whose quantizer `v` carries: `v` itself, or the first quantized value up a chain of
    data-movement producers; None when a float value or a constant comes first."""
    while v is not None:      # a DAG: every step goes one producer up
        spec = plan.values.get(v.name)
        if spec is not None and not spec.keep_float and spec.kind == "activation":
            return v.name
        p = v.producer
        if v.is_constant() or p is None or p.op_type not in share or not p.inputs:
            return None
        v = p.inputs[0]
    return None


def symmetric_dynamic_weights(plan: QuantPlan, g, profile: Profile, opts: PlacementOptions) -> int:
    """Make the quantizer feeding each dynamic weight input (and its tie group) symmetric when the node's weights
    are; returns how many tie groups changed."""
    ops = set(profile.symmetric_dynamic_weight_ops)
    if not ops:
        return 0
    share = set(profile.shares_input_encoding)
    roots = set()
    for n in g.nodes:
        if n.op_type not in ops or len(n.inputs) < 2 or n.inputs[1] is None or n.inputs[1].is_constant():
            continue
        if not node_settings(opts, profile, n)["weight_symmetric"]:
            continue
        name = _feeding_quantizer(plan, n.inputs[1], share)
        if name is not None:
            roots.add(plan.find(name))
    if not roots:
        return 0
    for name, spec in plan.values.items():
        if spec.kind == "activation" and not spec.symmetric and plan.find(name) in roots:
            spec.symmetric = True
            spec.source = (spec.source + ", " if spec.source else "") + "dynamic weight input (weights' symmetry)"
    return len(roots)
