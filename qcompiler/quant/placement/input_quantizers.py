"""Config `input_quantized: true`: the float values a node reads get quantizers even where a rule turned their
producers' off (`output_quantized: false`).

This is how a config asks for SmoothQuant's W8A8 (Xiao et al. 2023: int8 inputs for the linear layers and the
attention matmuls, every element-wise op in float; the preset qcompiler/quant/settings/presets/w8a8.yaml): one rule turns
every output off, one turns the MatMul/Gemm inputs back on. A value is quantized at its producer (one Q/DQ per
value), so its other readers see it on the grid too (a post-LN BERT's residual Add reads the LayerNorm output the
MatMuls read). Through data movement the quantizer goes to the op computing the values (K: Add(bias) ->
Reshape -> Transpose -> MatMul quantizes the Add's output and ties the rest to it, as placement does anyway).

Only a float that a rule caused is undone: a value float for a structural reason (inside a supergroup, an op
the profile cannot quantize, a custom-domain producer, a node a rule keeps float or fp16) stays float, and a
later step (widening, sentinels, the safety net) may still keep one float, with its reason.
"""
from __future__ import annotations

from typing import Dict

from qcompiler.quant.core.plan import QuantPlan
from qcompiler.quant.placement.options import PlacementOptions, node_settings
from qcompiler.quant.targets.profiles import Profile

SOURCE = "input of a node with input_quantized (config)"


def quantize_inputs(plan: QuantPlan, g, profile: Profile, opts: PlacementOptions, stats: Dict[str, dict]) -> int:
    """Turn on the quantizers of the values read by nodes whose settings say `input_quantized`; returns how
    many specs changed."""
    if opts.config is None:
        return 0
    share = set(profile.shares_input_encoding)
    changed = 0
    for n in g.nodes:
        if n.op_type == "Constant":
            continue
        s = node_settings(opts, profile, n)
        if not s.get("input_quantized") or s["keep_float"]:
            continue
        for slot, v in enumerate(n.inputs):
            use = plan.uses.get((n.name, slot))
            if v is None or (use is not None and use.kind in ("weight", "bias")):
                continue
            seen = set()
            while v is not None and id(v) not in seen:
                seen.add(id(v))
                changed += _enable(plan, v, profile, opts)
                p = v.producer
                # data movement: its output shares its input's grid and has no statistics of its own
                if p is None or p.op_type not in share or v.name in stats or not p.inputs:
                    break
                v = p.inputs[0]
    return changed


def _enable(plan: QuantPlan, v, profile: Profile, opts: PlacementOptions) -> int:
    spec = plan.spec(v.name)
    if spec is None or not spec.keep_float or spec.kind != "activation":
        return 0
    p = v.producer
    if p is None:
        model_input_q = bool(getattr(opts.config, "model_input_quantized", True))
        if model_input_q:
            return 0          # float for another reason
    else:
        if p.domain not in ("", "ai.onnx") or p.op_type in set(profile.float_output_ops) or \
                v.name in plan.interior:
            return 0
        slot = next((i for i, o in enumerate(p.outputs) if o is v), 0)
        if slot in profile.float_outputs.get(p.op_type, ()):
            return 0
        ps = node_settings(opts, profile, p)
        if ps["keep_float"] or ps["output_quantized"]:
            return 0          # kept float by precision, or float for a reason that is not the rule
    spec.keep_float, spec.reason, spec.source = False, "", SOURCE
    return 1
