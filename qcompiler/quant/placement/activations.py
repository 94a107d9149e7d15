"""Activations: a quantizer at each float value's producer unless a rule keeps it float; the recurrent cell
state on the wide grid; quantizers that carry no information left out."""
from __future__ import annotations

import numpy as np

from qcompiler.quant.core.float16 import edge_cast_reason
from qcompiler.quant.core.plan import QuantPlan, QuantSpec
from qcompiler.quant.placement.lookup import float_check
from qcompiler.quant.placement.options import PlacementOptions, node_settings
from qcompiler.quant.targets.profiles import Profile

# field notes §1: the recurrent cell state (LSTM initial_c in, Y_c out) lives on the profile's wide grid (16
# bits); it integrates over every time step, so 8-bit rounding there compounds. Profiles without a wide grid
# (trt) keep it float. Hidden states and Y are quantized at the op boundary like any activation.
CELL_STATE = {"LSTM": {"inputs": (6,), "outputs": (2,)}}
# ops that read only their input's shape, never its values
SHAPE_READERS = ("Shape", "Size")


def place_activations(plan: QuantPlan, g, profile: Profile, opts: PlacementOptions) -> None:
    """A spec for every float graph input and node output (float with its reason where a rule says so)."""
    dtypes = plan.dtypes
    float_ok = float_check(dtypes)
    not_q = set(profile.float_output_ops)
    float_outs = profile.float_outputs
    wide = profile.wide_activation_bits
    fixed = profile.fixed_output_range
    share = set(profile.shares_input_encoding)

    def act_spec(node, s) -> QuantSpec:
        spec = QuantSpec(kind="activation", bits=int(s["act_bits"]), symmetric=bool(s["act_symmetric"]),
                         source="activation")
        if s["encoding_min"] is not None and s["encoding_max"] is not None:
            spec.fixed_range = (float(s["encoding_min"]), float(s["encoding_max"]))
        elif node is not None and node.op_type in fixed:
            spec.fixed_range = tuple(float(x) for x in fixed[node.op_type])
        return spec

    for name, kind in plan.interior.items():
        v = g.value(name)
        if v is not None and (name not in dtypes or np.issubdtype(dtypes[name], np.floating)):
            plan.set(name, QuantSpec(kind="activation")).float_(
                f"inside {kind} supergroup (quantizers only at its boundary)")
    in_settings = node_settings(opts, profile, None)
    model_input_q = True if opts.config is None else bool(getattr(opts.config, "model_input_quantized", True))
    for v in g.inputs:
        if v.is_initializer or not float_ok(v):
            continue
        spec = plan.set(v.name, act_spec(None, in_settings))
        if not model_input_q:
            spec.float_("model inputs unquantized by config")
    for n in g.nodes:
        if n.op_type == "Constant":
            continue
        s = node_settings(opts, profile, n)
        for i, v in enumerate(n.outputs):
            if not float_ok(v) or v.is_constant():
                continue
            spec = plan.set(v.name, act_spec(n, s))
            if n.domain not in ("", "ai.onnx"):
                spec.float_(f"producer '{n.name}' is a custom-domain op ({n.domain}.{n.op_type})")
            elif n.op_type in not_q:
                spec.float_(edge_cast_reason(n) or
                            f"producer '{n.name}' ({n.op_type}) is not quantizable on {profile.name}")
            elif i in CELL_STATE.get(n.op_type, {}).get("outputs", ()) and wide:
                spec.bits, spec.widened = int(wide), \
                    f"cell state of {n.op_type} '{n.name}' (it integrates over every time step)"
            elif i in float_outs.get(n.op_type, ()):
                spec.float_(f"output {i} of {n.op_type} '{n.name}' kept float (recurrent cell state)")
            elif s["keep_float"]:
                spec.float_(f"node '{n.name}' kept {s['precision']} by {s['by']}")
            elif not s["output_quantized"]:
                spec.float_(f"output of '{n.name}' unquantized by config (a rule or --op-types)")
            elif v.name in plan.interior:
                spec.float_(f"inside {plan.interior[v.name]} supergroup (quantizers only at its boundary)")
            elif n.op_type in share and not profile.quantize_data_movement_outputs:
                spec.float_(f"data-movement output of {n.op_type} left unquantized (profile)")

    # cell-state inputs (LSTM initial_c): the value feeding them is widened too (whole value, all its uses)
    for n in g.nodes:
        for slot in CELL_STATE.get(n.op_type, {}).get("inputs", ()):
            v = n.inputs[slot] if slot < len(n.inputs) else None
            spec = plan.spec(v.name) if v is not None else None
            if spec is None or spec.keep_float or spec.bits >= 16:
                continue
            if wide:
                spec.bits, spec.widened = int(wide), \
                    f"cell state input {slot} of {n.op_type} '{n.name}' (it integrates over every time step)"
            else:
                spec.float_(f"cell state input {slot} of {n.op_type} '{n.name}': no wide grid on this target")


def _shape_only(v, share: set, memo: dict) -> bool:
    """Is `v` read only for its shape: by Shape/Size, or by data movement whose outputs are read that way?"""
    if v is None or v.is_output_of_any_graph():
        return False
    if id(v) not in memo:
        memo[id(v)] = False           # cycles (none in a DAG) answer False
        users = v.uses()
        memo[id(v)] = bool(users) and all(_use_shape_only(u, share, memo) for u in users)
    return memo[id(v)]


def _use_shape_only(u, share: set, memo: dict) -> bool:
    """Does this use read only the shape: a Shape/Size, or data movement whose outputs are `_shape_only`?"""
    op = getattr(u.user, "op_type", None)
    return op in SHAPE_READERS or (op in share and u.index == 0 and
                                   all(_shape_only(o, share, memo) for o in u.user.outputs if o is not None))


def drop_needless_quantizers(plan: QuantPlan, g, profile: Profile) -> None:
    """Leave out quantizers that carry no information (the values stay exactly what the plan says).

    - A value read only for its shape (by Shape/Size, possibly through data movement) carries no numbers.
    - A data-movement output whose input is quantized holds values already on that input's grid; when it is
      read only by ops the profile lists in `float_kernel_ops` (no integer kernel: they dequantize anyway) or
      for its shape, a second Q/DQ with the same encoding is a no-op that costs a kernel launch each.
    NOTE: on char_rnn (ort_cpu) both sat between Squeeze/Transpose and LSTM/GRU and between a Transpose and the
    Shape that reads it, which kept ORT's transpose optimizer from removing two Transposes.
    """
    share = set(profile.shares_input_encoding)
    float_kernels = set(profile.float_kernel_ops)
    memo: dict = {}
    for n in g.nodes:
        for v in n.outputs:
            spec = plan.spec(v.name) if v is not None else None
            if spec is None or spec.keep_float or spec.kind != "activation" or v.is_output_of_any_graph():
                continue
            users = v.uses()
            if _shape_only(v, share, memo):
                spec.float_("read only for its shape: no values to quantize")
                continue
            src = n.inputs[0] if n.op_type in share and n.inputs else None
            sspec = plan.spec(src.name) if src is not None else None
            if not float_kernels or sspec is None or sspec.keep_float or sspec.bits != spec.bits:
                continue
            if all(getattr(u.user, "op_type", None) in float_kernels or _use_shape_only(u, share, memo)
                   for u in users):
                spec.float_(f"{n.op_type} output: values already on the grid of '{src.name}', read only by "
                            f"ops without integer kernels (profile float_kernel_ops): no second quantizer")
