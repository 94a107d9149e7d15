"""Quantizer placement: fill a QuantPlan from the graph, the backend profile, the config and calibration stats.

Rules (issue 3 "placement", field notes §2, §3, §6):
- Every float activation (graph input or node output of the main graph) gets a quantizer at its producer,
  unless it is integer-typed, produced by an op the profile marks not quantizable, inside a supergroup
  (LayerNorm/RMSNorm/GELU/HardSwish decompositions, Conv→Relu-like pairs), or 8 bits cannot carry it (§6).
  A value that is also a graph output keeps the quantizer on every use: the graph output is one more use.
- Weights (profile `weights` slots holding constants, initializers or Constant-node outputs alike) get
  per-use specs with the op's per-channel axis, so a weight shared by two Gemms with different transB gets two
  copies and one with the same axis gets one DQ. Bias slots become int32 (scale s_in * s_w) in qdq.py.
- Weights inside If/Loop/Scan bodies (recursively, captured outer weights included) get the same per-use
  specs (field notes §1); the bodies' activations stay float (calibration does not see inside bodies), and the
  report says so once per body.
- Data-movement outputs tie to input 0; Concat inputs tie to its output. Ties never cross a producer that is
  not quantizable (that input gets a per-use quantizer at the Concat instead) and never touch integer tensors.
"""
from __future__ import annotations

from typing import Dict, Iterable, List, Optional

import numpy as np

from qcompiler.passes.supergroups import FLOAT_INTERIOR_KINDS

from .plan import Body, QuantPlan, QuantSpec
from .profiles import weight_axis

# field notes §6 thresholds: an 8-bit grid keeps the bulk of a tensor useful while max|x| / p99.9|x| stays
# below ~30; far beyond that (masks, variances) the bulk collapses onto one or two levels.
SENTINEL_MAGNITUDE = 1e20
OUTLIER_RATIO_LIMIT = 1e3
CONCAT_RANGE_RATIO_LIMIT = 64.0
# the bulk (99.9% of |x|) must span at least this many steps of the min/max grid; BERT's outlier channels
# (FFN outputs up to ~200 over a bulk of ~1) leave it 1-10 steps and wreck the model
MIN_BULK_STEPS = 16.0
# estimated SQNR of the 8-bit min/max grid (calibrate.estimated_sqnr_db) below which a tensor is widened
MIN_SQNR8_DB = 30.0
# field notes §1: the recurrent cell state (LSTM initial_c in, Y_c out) lives on the profile's wide grid (16
# bits); it integrates over every time step, so 8-bit rounding there compounds. Profiles without a wide grid
# (trt) keep it float. Hidden states and Y are quantized at the op boundary like any activation.
CELL_STATE = {"LSTM": {"inputs": (6,), "outputs": (2,)}}
# ops that read only their input's shape, never its values
SHAPE_READERS = ("Shape", "Size")


def _const(v) -> Optional[np.ndarray]:
    return None if v is None else v.const_value()


def _const_kind(v):
    """What build_plan reads of a weight (dtype, ndim), without decoding one still in its external-data file
    (a 2 GB model's weights would all be read and cached here); else `_const(v)`."""
    t = getattr(v, "tensor", None)
    if t is not None and not v.is_input and t.is_external:
        from types import SimpleNamespace
        import onnx
        try:
            return SimpleNamespace(dtype=np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.dtype)), ndim=len(t.dims))
        except Exception:   # noqa: BLE001 - an element type numpy has no dtype for: decode as before
            pass
    return _const(v)


# --------------------------------------------------------------------------- supergroups

# norms and decomposed activations: no quantizer inside (Conv/MatMul + activation pairs come from the profile).
# The kinds and which of them stay float are listed once, in passes/supergroups.py.
SUPERGROUP_KINDS = FLOAT_INTERIOR_KINDS


def find_supergroups(g, kinds: Iterable[str] = SUPERGROUP_KINDS) -> List[tuple]:
    """[(kind, [nodes in order])] for each supergroup of `kinds` in `g`, read from the IR's annotations.

    The pattern library finds the structures; `annotate-supergroups` records them on the nodes (and protects
    their structural constants). Annotating here too makes placement independent of which passes ran before
    (an opset conversion rebuilds the IR and drops annotations); annotation is idempotent.
    """
    from qcompiler.passes.supergroups import annotate_graph, supergroups_in
    kinds = tuple(kinds)
    annotate_graph(g, kinds, recurse=False)
    return [(sg.split(":")[0], nodes) for sg, nodes in supergroups_in(g).items() if sg.split(":")[0] in kinds]


def _interior_values(nodes: list) -> List:
    """Outputs of the group's nodes read only inside the group (the boundary outputs are the rest)."""
    members = {id(n) for n in nodes}
    interior = []
    for n in nodes:
        for v in n.outputs:
            if v is None or v.is_output_of_any_graph():
                continue
            if all(id(c) in members for c in v.consumers()):
                interior.append(v)
    return interior


# --------------------------------------------------------------------------- plan building

class PlacementOptions:
    """Global knobs (API arguments) used when no config rule says otherwise."""

    def __init__(self, per_channel=True, weight_bits=8, act_bits=8, act_symmetric=None, weight_symmetric=None,
                 config=None, supergroups=True, weight_block=None):
        self.per_channel, self.weight_bits, self.act_bits = per_channel, weight_bits, act_bits
        self.weight_block = weight_block
        self.act_symmetric, self.weight_symmetric = act_symmetric, weight_symmetric
        self.config, self.supergroups = config, supergroups


def _settings(opts: PlacementOptions, profile: dict, node):
    """Resolved per-node settings as a dict (config rules when a config is given, else API args + profile)."""
    a, w = profile["activation"], profile["weight"]
    s = {"act_bits": opts.act_bits, "act_symmetric": a["symmetric"] if opts.act_symmetric is None
         else opts.act_symmetric, "weight_bits": opts.weight_bits,
         "weight_symmetric": w["symmetric"] if opts.weight_symmetric is None else opts.weight_symmetric,
         "weight_per_channel": opts.per_channel, "weight_block": opts.weight_block, "weight_quantized": True,
         "bias_quantized": True, "keep_float": False, "precision": "int", "output_quantized": True,
         "encoding_min": None, "encoding_max": None}
    cfg = opts.config
    if cfg is not None and node is not None:
        ns = cfg.settings_for(node)
        for k in ("act_bits", "act_symmetric", "weight_bits", "weight_symmetric", "weight_per_channel",
                  "weight_block", "weight_quantized", "bias_quantized", "precision", "output_quantized",
                  "encoding_min", "encoding_max"):
            if hasattr(ns, k):
                s[k] = getattr(ns, k)
        s["keep_float"] = bool(getattr(ns, "keep_float", False))
    return s


def _mark_supergroups(plan: QuantPlan, g, profile: dict, opts: PlacementOptions) -> None:
    """Supergroups (decomposed norms/activations, fused op+activation pairs): their interiors stay float."""
    if opts.supergroups:
        kinds = SUPERGROUP_KINDS
        if isinstance(opts.supergroups, (list, tuple)):
            kinds = tuple(opts.supergroups)
        for kind, nodes in find_supergroups(g, kinds):
            plan.add_supergroup(kind, [n.name for n in nodes], [v.name for v in _interior_values(nodes)])
    fused = {tuple(p) for p in profile.get("fused_activations", [])}
    _mark_bias_adds(plan, g, profile)
    # a decomposed activation supergroup (HardSwish) fuses with its producer like the op would (AIMET's
    # Conv+HardSwish supergroup): its input is then interior too
    entry = {}
    for sg in plan.supergroups:
        if sg.kind in ("hardswish", "gelu"):
            for name in sg.nodes:
                entry[name] = sg.kind
    for n in g.nodes:
        for v in n.outputs:
            if v is None or v.is_output_of_any_graph():
                continue
            cons = v.consumers()
            if len(cons) == 1 and (n.op_type, cons[0].op_type) in fused:
                plan.add_supergroup(f"{n.op_type}+{cons[0].op_type}", [n.name, cons[0].name], [v.name])
            elif cons and all(c.name in entry for c in cons) and \
                    (n.op_type, "HardSwish" if entry[cons[0].name] == "hardswish" else "Gelu") in fused:
                plan.add_supergroup(f"{n.op_type}+{entry[cons[0].name]}", [n.name] + [c.name for c in cons],
                                    [v.name])


def _mark_bias_adds(plan: QuantPlan, g, profile: dict) -> None:
    """A linear op whose only reader is an Add of a constant (a bias the exporter split off, torch Linear ->
    MatMul + Add) forms one unit with it: no quantizer between them (profile `bias_add_ops`).

    NOTE: the product goes on to the Add in float (ORT's MatMulIntegerToFloat takes the bias in; TensorRT fuses
    it), so a quantizer there only rounds twice: on minilm_l6 removing it raised last_hidden_state from 17.2 to
    18.7 dB (valid tokens 19.1 -> 20.9) and saved 24 Q/DQ pairs.
    """
    ops = set(profile.get("bias_add_ops", ()))
    if not ops:
        return
    for n in g.nodes:
        if n.op_type not in ops or not n.outputs or n.outputs[0] is None:
            continue
        v = n.outputs[0]
        users = v.uses()
        if len(users) != 1 or v.is_output_of_any_graph():
            continue
        add = users[0].user
        if add.op_type != "Add" or len(add.inputs) != 2:
            continue
        other = add.inputs[1 - users[0].index]
        if other is None or other.const_value() is None:
            continue
        plan.add_supergroup(f"{n.op_type}+bias", [n.name, add.name], [v.name])


def observed_names(model, profile: dict, opts: Optional[PlacementOptions] = None) -> List[str]:
    """Values worth observing during calibration: every candidate activation except those the plan keeps
    float for structural reasons (supergroup interiors, outputs of ops that are not quantizable)."""
    from .calibrate import candidate_names
    opts = opts or PlacementOptions()
    g = model.graph
    plan = QuantPlan(profile)
    _mark_supergroups(plan, g, profile, opts)
    share = set(profile.get("shares_input_encoding", ()))
    skip = set(plan.interior)
    for n in g.nodes:
        # NOTE: outputs of ops that are not quantizable are still observed: their dtype decides whether a
        # Concat reading them needs a per-use quantizer, and the report lists integer tensors by name
        if n.op_type in share and n.op_type != "Gather":
            # NOTE: data movement keeps its input's dtype and (tied) encoding; observing it again only costs
            skip.update(v.name for v in n.outputs if v is not None and not v.is_output_of_any_graph())
    return [name for name in candidate_names(model) if name not in skip]


def block_axis(node, slot: int, rank: int) -> Optional[int]:
    """Axis along which per-block weight scales run: the weight's reduction (input-channel) axis.

    MatMul B [.., K, N]: rank-2 (blocks along K, as ORT's MatMulNBits wants); Gemm B: 0, or 1 with transB;
    Conv W [Cout, Cin/g, ..]: 1; ConvTranspose W [Cin, Cout/g, ..]: 0; LSTM/GRU/RNN W, R [dirs, gates*H, in]: 2.
    None: no per-block rule for this op or slot.
    """
    if slot not in (1, 2) or rank < 2:
        return None
    op = node.op_type
    if op == "MatMul" and slot == 1:
        return rank - 2
    if op == "Gemm" and slot == 1 and rank == 2:
        return 1 if node.attr("transB", 0) else 0
    if op == "Conv" and slot == 1:
        return 1
    if op == "ConvTranspose" and slot == 1:
        return 0
    if op in ("LSTM", "GRU", "RNN") and rank == 3:
        return 2
    return None


def weight_nodes(g) -> List:
    """Nodes whose weights placement considers: the main graph's, then those of every If/Loop/Scan body
    (recursively). Body nodes whose name repeats one seen before are left out: plan keys are node names.

    Field notes §1: bodies are graphs like any other, and their weights need no calibration. A body node reading
    a weight captured from an outer graph counts as a use like any other (qdq.apply_plan gives it its own DQ
    inside the body).
    """
    out = list(g.nodes)
    seen = {n.name for n in out}
    for body in g.subgraphs(recursive=True):
        for n in body.nodes:
            if n.name and n.name not in seen:
                seen.add(n.name)
                out.append(n)
    return out


def nodes_by_name(g) -> Dict[str, object]:
    """name -> node over the main graph and every body (the first of a repeated name wins, as in
    `weight_nodes`), for resolving the plan's (node name, slot) keys."""
    return {n.name: n for n in weight_nodes(g)}


def _record_bodies(plan: QuantPlan, g) -> None:
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


def _propagate_dtypes(g, profile: dict, dtypes: Dict[str, np.dtype]) -> Dict[str, np.dtype]:
    """Unobserved data-movement outputs carry their input 0's dtype (see `observed_names`)."""
    share = set(profile.get("shares_input_encoding", ()))
    out = dict(dtypes)
    for n in g.nodes:
        if n.op_type in share and n.inputs and n.inputs[0] is not None and n.inputs[0].name in out:
            for v in n.outputs:
                if v is not None and v.name not in out:
                    out[v.name] = out[n.inputs[0].name]
    return out


def build_plan(model, profile: dict, dtypes: Dict[str, np.dtype], stats: Dict[str, dict],
               opts: Optional[PlacementOptions] = None) -> QuantPlan:
    """Fill a QuantPlan for the main graph from the profile, settings, observed dtypes and statistics.

    `dtypes` maps every observed value name to its runtime numpy dtype (calibration saw it); values missing
    from it are not quantized. `stats` maps names to observer `stats()` dicts (field notes §6 checks).
    """
    opts = opts or PlacementOptions()
    g = model.graph
    plan = QuantPlan(profile)
    dtypes = _propagate_dtypes(g, profile, dtypes)
    plan.dtypes = dtypes
    float_ok = lambda v: v is not None and v.name in dtypes and np.issubdtype(dtypes[v.name], np.floating)

    _mark_supergroups(plan, g, profile, opts)

    # 2. weights and biases (per use), in the main graph and inside If/Loop/Scan bodies (field notes §1)
    pc_ops = set(profile.get("per_channel_ops", ()))
    for n in weight_nodes(g):
        slots = profile["weights"].get(n.op_type, {})
        if not slots:
            continue
        s = _settings(opts, profile, n)
        for slot in slots:
            v = n.inputs[slot] if slot < len(n.inputs) else None
            arr = _const_kind(v)
            if arr is None or not np.issubdtype(arr.dtype, np.floating):
                continue
            if s["keep_float"] or not s["weight_quantized"]:
                plan.set_use(n.name, slot, QuantSpec(kind="weight", source="config").float_(
                    "weights kept float by config (a rule, --exclude or --op-types)"))
                continue
            # NOTE: a grouped ConvTranspose's axis 1 holds C_out/g channels, each shared by the g groups: its
            # scale is the max over them and the bias tiles it over groups (qdq.output_channel_scales)
            axis = weight_axis(profile, n, slot, arr.ndim) if (s["weight_per_channel"] and n.op_type in pc_ops) \
                else None
            if axis is not None and arr.ndim < 2 and n.op_type != "MatMul":
                axis = None
            if n.op_type == "MatMul" and arr.ndim < 2:
                axis = None
            bits = int(s["weight_bits"])
            block, fallback = s["weight_block"], ""
            if block:
                baxis = block_axis(n, slot, arr.ndim)
                if baxis is None:
                    fallback = f"; per-block asked but {n.op_type} input {slot} has no block axis"
                elif bits not in profile.get("per_block_weight_bits", (4, 8)):
                    fallback = f"; per-block {bits}-bit weights not supported on {profile.get('name', 'target')}"
                else:
                    axis = baxis
                if fallback:
                    block = None   # the per-channel/per-tensor grid above
                    if axis is not None:
                        fallback += ", per-channel instead"
            rb = profile["weight"].get("range_bits")
            range_bits = min(bits, rb) if (rb and bits == 8) else bits
            plan.set_use(n.name, slot, QuantSpec(kind="weight", bits=bits, symmetric=bool(s["weight_symmetric"]),
                                                 signed=True, axis=axis, block_size=block,
                                                 range_bits=range_bits,
                                                 source=f"profile weights {n.op_type}{fallback}"))
        bslot = profile.get("bias", {}).get(n.op_type)
        if bslot is not None and bslot < len(n.inputs) and _const(n.inputs[bslot]) is not None \
                and s["bias_quantized"] and not s["keep_float"]:
            plan.set_use(n.name, bslot, QuantSpec(kind="bias", bits=32, symmetric=True, signed=True,
                                                  source="profile bias"))

    # 3. activations
    not_q = set(profile.get("float_output_ops", ()))
    float_outs = profile.get("float_outputs", {})
    wide = profile.get("wide_activation_bits")
    fixed = profile.get("fixed_output_range", {})
    share = set(profile.get("shares_input_encoding", ()))

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
    in_settings = _settings(opts, profile, None)
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
        s = _settings(opts, profile, n)
        for i, v in enumerate(n.outputs):
            if not float_ok(v) or v.is_constant():
                continue
            spec = plan.set(v.name, act_spec(n, s))
            if n.domain not in ("", "ai.onnx"):
                spec.float_(f"producer '{n.name}' is a custom-domain op ({n.domain}.{n.op_type})")
            elif n.op_type in not_q:
                spec.float_(f"producer '{n.name}' ({n.op_type}) is not quantizable on {profile.get('name', 'target')}")
            elif i in CELL_STATE.get(n.op_type, {}).get("outputs", ()) and wide:
                spec.bits, spec.widened = int(wide), \
                    f"cell state of {n.op_type} '{n.name}' (it integrates over every time step)"
            elif i in float_outs.get(n.op_type, ()):
                spec.float_(f"output {i} of {n.op_type} '{n.name}' kept float (recurrent cell state)")
            elif s["keep_float"]:
                spec.float_(f"node '{n.name}' kept {s['precision']} by config (a rule, --exclude or --op-types)")
            elif not s["output_quantized"]:
                spec.float_(f"output of '{n.name}' unquantized by config (a rule or --op-types)")
            elif v.name in plan.interior:
                spec.float_(f"inside {plan.interior[v.name]} supergroup (quantizers only at its boundary)")
            elif n.op_type in share and not profile.get("quantize_data_movement_outputs", True):
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

    _drop_needless_quantizers(plan, g, profile)

    _record_bodies(plan, g)

    # 4. field notes §6: tensors 8 bits cannot carry (widened to the profile's wide grid, or kept float)
    wide = profile.get("wide_activation_bits")
    for name, spec in plan.values.items():
        # NOTE: wide grids are checked too: a -3.4e38 mask destroys an int16 grid as surely as an int8 one
        if spec.keep_float or spec.kind != "activation" or spec.fixed_range is not None:
            continue
        st = stats.get(name)
        if not st:
            continue
        absmax = max(abs(st.get("min", 0.0)), abs(st.get("max", 0.0)))
        headroom = 2.0 ** max(spec.bits - 8, 0)
        if absmax >= SENTINEL_MAGNITUDE:
            spec.float_(f"holds sentinel values of magnitude {absmax:.3g} (an additive mask?): "
                        f"{spec.bits} bits cannot carry them together with the rest")
        elif st.get("outlier_ratio", 1.0) >= OUTLIER_RATIO_LIMIT * headroom:
            spec.float_(f"max|x| is {st['outlier_ratio']:.3g}x its 99.9th percentile: {spec.bits} bits would zero "
                        f"the bulk")
        elif spec.bits > 8:
            pass
        elif st.get("p999_steps", MIN_BULK_STEPS) < MIN_BULK_STEPS * 2 ** (spec.bits - 8) or \
                (spec.bits == 8 and st.get("sqnr8_db", 99.0) < MIN_SQNR8_DB):
            why = f"an 8-bit grid gives ~{st.get('sqnr8_db', 0):.0f} dB (max|x| {absmax:.3g}"
            why += (f", 99.9% of |x| within {st['p999_steps']:.1f} steps)" if "p999_steps" in st else
                    f", rms {np.sqrt(st.get('mean_sq', 0.0)):.3g})")
            if wide:
                spec.bits, spec.widened = int(wide), why
            else:
                spec.float_(why)
        elif st.get("nonfinite", 0):
            spec.float_(f"calibration saw {st['nonfinite']} non-finite values")

    # 5. ties: data movement shares input 0; Concat inputs share the output
    ties = set(profile.get("tie_inputs_and_output", ()))
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
    _check_tie_spread(plan, stats, g)
    _full_range_for_float_kernels(plan, g)
    return plan


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


def _drop_needless_quantizers(plan: QuantPlan, g, profile: dict) -> None:
    """Leave out quantizers that carry no information (the values stay exactly what the plan says).

    - A value read only for its shape (by Shape/Size, possibly through data movement) carries no numbers.
    - A data-movement output whose input is quantized holds values already on that input's grid; when it is
      read only by ops the profile lists in `float_kernel_ops` (no integer kernel: they dequantize anyway) or
      for its shape, a second Q/DQ with the same encoding is a no-op that costs a kernel launch each.
    NOTE: on char_rnn (ort_cpu) both sat between Squeeze/Transpose and LSTM/GRU and between a Transpose and the
    Shape that reads it, which kept ORT's transpose optimizer from removing two Transposes.
    """
    share = set(profile.get("shares_input_encoding", ()))
    float_kernels = set(profile.get("float_kernel_ops", ()))
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


def _group_bits_table(plan: QuantPlan) -> Dict[str, int]:
    """tie-group root -> bits its activations will carry (a widened member widens its group, calibrate.py)."""
    table: Dict[str, int] = {}
    for name, s in plan.values.items():
        if s.kind == "activation" and not s.keep_float:
            root = plan.find(name)
            table[root] = max(table.get(root, 0), s.bits)
    return table


def _act_bits(plan: QuantPlan, table: Dict[str, int], v) -> Optional[int]:
    """Bits the activation `v` will carry, None when float (or not an activation)."""
    spec = plan.spec(v.name) if v is not None else None
    if spec is None or spec.keep_float or spec.kind != "activation":
        return None
    return table.get(plan.find(v.name), spec.bits)


def _integer_kernel(plan: QuantPlan, table: Dict[str, int], node) -> bool:
    """Will the runtime run `node` as an integer kernel (profile `integer_weight_kernels`, read from the plan
    before encodings exist, as weight_storage.unfused_reason reads it once they do)? Unsure cases answer True."""
    rule = plan.profile.get("integer_weight_kernels", {}).get(node.op_type)
    if rule is None:
        return False
    bits = rule.get("act_bits", 8)
    if not node.inputs or _act_bits(plan, table, node.inputs[0]) != bits:
        return False
    if rule.get("output_q"):
        through = set(plan.profile.get("output_q_through", ()))
        v = node.outputs[0]
        while v is not None and v.name in plan.interior:
            cons = v.consumers()
            if len(cons) != 1 or cons[0].op_type not in through:
                return True
            v = cons[0].outputs[0]
        return v is None or _act_bits(plan, table, v) == bits
    return True


def _full_range_for_float_kernels(plan: QuantPlan, g) -> None:
    """Weights whose node runs a float kernel use their whole grid: `range_bits` (ORT's reduce_range) exists
    only because u8 x s8 pairs summed into int16 saturate inside integer kernels (anchors F).

    NOTE: such weights are stored on their int8 grid (weight_storage.py) and multiplied in float. On minilm_l6 the FFN
    down projection of layer 0 (16-bit input, so a float MatMul) has one output channel whose largest weight is
    39x its rms; on the 7-bit grid that channel's small weights rounded so coarsely that padding tokens, which
    do not fire the large weight's neuron, lost their last_hidden_state (3.3 dB; 17.2 dB with the full grid).
    """
    by_name = nodes_by_name(g)
    table = _group_bits_table(plan)
    for (node_name, slot), spec in plan.uses.items():
        if spec.kind != "weight" or spec.keep_float or not spec.range_bits or spec.range_bits >= spec.bits:
            continue
        node = by_name.get(node_name)
        if node is not None and not _integer_kernel(plan, table, node):
            spec.range_bits = spec.bits
            spec.source += "; full range (float kernel)"


def _check_tie_spread(plan: QuantPlan, stats: Dict[str, dict], g) -> None:
    """§6: a Concat joining very different ranges (pixel boxes with 0-1 scores) keeps its output float."""
    ties = set(plan.profile.get("tie_inputs_and_output", ()))
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
