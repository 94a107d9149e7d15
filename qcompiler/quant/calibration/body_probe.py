"""Observe the float values computed inside If/Loop/Scan bodies during calibration.

onnxruntime returns main-graph values only, so `build_probe` makes a calibration-only copy of the model in which
every float value defined inside a body (at any depth) reaches a main-graph output, and `ProbeModel.values`
turns one run's outputs back into {body value name: array, or None when that run never reached the value}.

Design, and why:

- **One session, bubbling outputs** (not one session per body on captured inputs): a body's inputs are only
  known while its parent runs (loop-carried state, per-iteration scan slices, captured values of the current
  outer iteration), so running bodies apart would mean re-implementing the control flow in Python. Here each
  probed value gets an `Identity` inside its body that becomes one more body output, and each level passes its
  probes up: an `If` gets one more output per probe in both branches, a `Loop` or `Scan` one more scan output
  (stacked over iterations), until the main graph lists it as a graph output. The original outputs and nodes
  are untouched, so the model computes exactly what it did (`test_original_outputs_bit_exact`).
- **What is observed**: graph inputs of the body (loop-carried state, scan slices) and every output of a node of
  the body except `Constant`, with a float element type (float, float16, bfloat16, double): integer tensors
  are never quantized. Values captured from an outer scope are not probed in the body that reads them: they
  are observed where they are produced (the main graph's own calibration, or the enclosing body's probes).
- **How** (`Probe.how`), chosen from the number of Loop/Scan bodies around the value (`loops`):
  - `value` (loops = 0: the value sits in If branches only): the value itself, as the main-graph calibration
    sees its own activations.
  - `stacked` (loops = 1, a static shape of at most `stack_limit` elements, within the body's
    `stack_budget`): the per-iteration values stacked on a new leading axis. The observers get every element.
  - `minmax` (anything else: nested loops, a shape that may change from one iteration to the next, a large
    value): per iteration a float32 pair [min, max] (Cast, Reshape to 1-D, ReduceMin/ReduceMax); each
    enclosing Loop/Scan reduces its stacked pairs to one pair again, so one run yields 8 bytes per value
    whatever the trip count. The observers get the two numbers: the `min_max` range is exact, but a histogram
    scheme (entropy, percentile, mse, tf_enhanced) sees only the extremes of each run and cannot be given a
    flattened copy, and its search over two points per run would clip them: `calibrate` gives these values
    a min/max observer whatever the scheme, and the report should say so (`ProbeModel.minmax_values`).
- **A branch that did not run** outputs a filler: for `value` probes an empty 1-D tensor of the value's dtype
  (If outputs may differ in shape between branches), for `stacked` probes zeros of the static shape (a Loop
  must stack equal shapes), for `minmax` probes the pair [+inf, -inf], the identity of (min, max) (so it
  vanishes under the enclosing reductions, and a pair with min > max means "never reached"). Each If also
  outputs a branch code, 1 in `then_branch`, 2 in `else_branch`, 0 in the filler of an enclosing If not taken
  (an int32 scalar, stacked by one Loop; inside nested loops the pair [1, 1] / [2, 2] reduced like the
  others). `value` and `stacked` probes are selected by the code of their innermost If, element by element
  over the iterations, so fillers never reach an observer; `BranchTally` accumulates the codes over the whole
  calibration set and names the branches never taken.
- **A branch never taken** over the whole calibration set keeps float activations, and the report's notes name it
  (`BranchTally.untaken_notes`). On request (`--untaken-branches mirror`, the `mirror-untaken-branches` pass)
  each of its values computed exactly as a value of the other branch (`mirrored_values`: same op, domain,
  attributes and inputs, pairing outward from the captured names) shares that twin's observer: the same tensor
  on the same inputs, so the same statistics. Both branches' twins are observed (`mirror_candidates`), since
  which branch goes idle is known only after calibration; the rest of the idle branch stays float.
- **Names** come from one NameScope holding every value and node name of the model, so a probe name never
  collides with or shadows an existing one. The input goes through the IR (names model-wide unique, importer
  `_define`), so a body value name is a key as good as a main-graph name.
- **Types and shapes** come from onnx shape inference on a weightless copy (`model_to_proto(stub_over=...)`),
  falling back on the types the IR already holds. A dimension counts as static when it is a number, or a
  symbolic dimension of a main-graph input whose size the caller gives in `dims` (one run's inputs fix it for
  every iteration). onnx infers nothing for many body values (a Split whose sizes are an outer initializer:
  inference of a body does not see outer constants), so `calibration_probe` runs the first sample once
  through a `learn_shapes` copy (each such value's Shape, padded to SHAPE_SLOTS entries so it stacks) and
  stacks the values whose shape held on every iteration. A later sample may break what the first one taught
  (an If filler of the learnt shape, a stacked value whose length follows the input): `BodyCalibration`
  then falls back to `minmax` for every value inside a loop, once.

Memory (item 3): per sample and per `stacked` value, at most `stack_limit` elements (default 1024, 4 KB of
float32) times the trip count; per body at most `stack_budget` elements per iteration in all (default 16384:
64 KB per iteration, 64 MB for 1000 iterations); every other value costs 8 bytes per iteration inside
onnxruntime and 8 bytes per run in the outputs. `value` probes (If branches outside any loop) cost what the
value costs, like any main-graph activation. Building the probe holds one serialized copy of the weights
(the proto handed to onnxruntime): use it only when the model has bodies (`has_bodies`).

Not probed (listed in `ProbeModel.skipped` with the reason): values without a known element type, models
before opset 11 (the probe nodes' forms), and graph attributes of other ops (SequenceMap, custom domains).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

import numpy as np
import onnx
from onnx import TensorProto, helper

from qcompiler.errors import DataError
from qcompiler.ir.names import NameScope
from qcompiler.onnx_io.exporter import model_to_proto, node_attr_protos
from qcompiler.onnx_io.graph_protos import graph_protos
from qcompiler.onnx_io.importer import model_from_proto
from qcompiler.ort_session import create_session

STACK_LIMIT = 1024       # elements per iteration of one value stacked over a loop's iterations
STACK_BUDGET = 16384     # elements per iteration of all values stacked by one loop body
SHAPE_SLOTS = 16         # learnt shapes: ranks up to SHAPE_SLOTS - 1
UNSHAPED = "shape may change between iterations"
MIN_OPSET = 11           # Pad/Reshape/Concat as the probe nodes use them
STUB_BYTES = 4096        # initializers above this size go to shape inference as data-less stubs

FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE})
THEN, ELSE = 1, 2        # branch codes
BRANCH_ATTRS = {THEN: "then_branch", ELSE: "else_branch"}


def path_str(path: tuple) -> str:
    """(('loop', 'body'), ('if', 'then_branch')) -> 'loop/body/if/then_branch'."""
    return "/".join(f"{n}/{a}" for n, a in path)


@dataclass
class Probe:
    """One probed body value: where its observation comes out, and how to read it."""

    output: str = ""                 # main-graph output name (set when the probe reaches the main graph)
    path: tuple = ()                 # ((node name, attribute name), ...) from the main graph to the body
    value: str = ""                  # value name inside the body
    how: str = "value"               # "value" | "stacked" | "minmax" (module docstring)
    reason: str = ""                 # why `minmax` rather than the values themselves
    guard: Optional["BranchProbe"] = None   # innermost If on the path (value/stacked only)
    guard_code: int = 0


@dataclass
class BranchProbe:
    """The branch code output of one If node (which branch ran, per run and per enclosing iteration)."""

    output: str = ""
    path: tuple = ()                 # path of the graph holding the If node
    node: str = ""
    how: str = "code"                # "code" (int32, stacked by at most one loop) | "minmax" (pair)

    def taken(self, arr) -> Dict[int, bool]:
        a = np.asarray(arr)
        if self.how == "code":
            return {THEN: bool((a == THEN).any()), ELSE: bool((a == ELSE).any())}
        a = a.reshape(-1)
        return {THEN: bool(a.size == 2 and a[0] == THEN), ELSE: bool(a.size == 2 and a[1] == ELSE)}


@dataclass
class _Item:
    """A probe on its way up: the local name carrying it in the current graph, and its layout there."""

    name: str
    ref: object                      # Probe or BranchProbe
    kind: str                        # "value" (the value or its stack) | "code" (int32) | "pair" (float32 [2])
    elem: int = TensorProto.FLOAT
    shape: Optional[tuple] = None    # static shape of one iteration ("value" items inside one loop)


@dataclass
class ProbeModel:
    """The calibration copy (`proto`) and how to read its extra outputs."""

    proto: onnx.ModelProto
    probes: Dict[str, Probe] = field(default_factory=dict)          # output name -> Probe
    branches: Dict[str, BranchProbe] = field(default_factory=dict)  # output name -> BranchProbe
    skipped: List[Tuple[str, str, str]] = field(default_factory=list)   # (body path, value or node, reason)
    original_outputs: List[str] = field(default_factory=list)

    @property
    def output_names(self) -> List[str]:
        """The probe and branch-code outputs (ask onnxruntime for these besides the model's own)."""
        return list(self.probes) + list(self.branches)

    @property
    def mapping(self) -> Dict[str, Tuple[str, str, str]]:
        """{main-graph output name: (body path, value name, how)} for every probed value."""
        return {o: (path_str(p.path), p.value, p.how) for o, p in self.probes.items()}

    @property
    def minmax_values(self) -> Dict[str, str]:
        """Body values observed as per-run [min, max] only, with the reason."""
        return {p.value: p.reason for p in self.probes.values() if p.how == "minmax"}

    def values(self, outputs: Mapping[str, np.ndarray]) -> Dict[str, Optional[np.ndarray]]:
        """From one run's outputs (name -> array), every probed body value: the array to hand to its observer,
        or None when the run never reached it (branch not taken, zero iterations)."""
        out: Dict[str, Optional[np.ndarray]] = {}
        for name, p in self.probes.items():
            arr = outputs.get(name)
            out[p.value] = None if arr is None else _decode(p, np.asarray(arr), outputs)
        return out

    def shapes(self, outputs: Mapping[str, np.ndarray]) -> Dict[str, tuple]:
        """From one run of a `learn_shapes` probe: value name -> its per-iteration shape, for the values whose
        shape was the same on every iteration that ran (others are left out: they stay `minmax`)."""
        out = {}
        for name, p in self.probes.items():
            if p.how != "shape" or name not in outputs:
                continue
            rows = _decode(p, np.asarray(outputs[name]), outputs)
            if rows is None or rows.ndim != 2 or rows.shape[0] == 0 or not (rows == rows[0]).all():
                continue
            r = rows[0]
            rank = int(np.argmax(r < 0)) if (r < 0).any() else SHAPE_SLOTS   # no -1: rank over SHAPE_SLOTS - 1
            if rank >= SHAPE_SLOTS or (r[rank:] != -1).any():
                continue
            out[p.value] = tuple(int(d) for d in r[:rank])
        return out

    def taken(self, outputs: Mapping[str, np.ndarray]) -> Dict[Tuple[str, str, str], bool]:
        """(graph path, If node, branch attribute) -> whether this run took that branch at least once."""
        res = {}
        for name, b in self.branches.items():
            arr = outputs.get(name)
            t = b.taken(arr) if arr is not None else {THEN: False, ELSE: False}
            for code, attr in BRANCH_ATTRS.items():
                res[(path_str(b.path), b.node, attr)] = t[code]
        return res


def _decode(p: Probe, arr: np.ndarray, outputs) -> Optional[np.ndarray]:
    if p.how == "minmax":
        a = arr.reshape(-1).astype(np.float32, copy=False)
        if a.size != 2 or a[0] > a[1]:
            return None
        return a
    if p.guard is not None:
        code = outputs.get(p.guard.output)
        if code is None:
            return None
        sel = np.asarray(code) == p.guard_code
        if sel.ndim == 0:
            return arr if bool(sel) else None
        if not sel.any() or arr.shape[:sel.ndim] != sel.shape:
            return None
        arr = arr[sel]
    if p.how in ("stacked", "shape") and arr.size == 0:
        return None
    return arr


class BranchTally:
    """Which If branches the calibration set took: `update` per run, then `never_taken`."""

    def __init__(self, probe: ProbeModel):
        self.probe = probe
        self.seen: Dict[Tuple[str, str, str], bool] = {}
        self.runs = 0

    def update(self, outputs: Mapping[str, np.ndarray]) -> None:
        for k, t in self.probe.taken(outputs).items():
            self.seen[k] = self.seen.get(k, False) or t
        self.runs += 1

    def never_taken(self) -> List[Tuple[str, str, str]]:
        """(graph path, If node, branch attribute) of every branch no run took, in model order."""
        return [k for k, t in self.seen.items() if not t]

    def report(self) -> List[str]:
        """One line per branch never taken: its values were not observed, so its activations stay float (the
        `mirror-untaken-branches` pass replaces these lines with its own)."""
        return self.untaken_notes("float")

    def untaken_notes(self, mode: str, mirrored: Optional[Mapping[str, str]] = None, model=None) -> List[str]:
        """One line per branch never taken saying what was done with it: `mode` "float" (its activations stay
        float) or "mirror" (`mirrored`: idle value -> taken twin whose statistics it was given)."""
        out = []
        branches = _branch_values(model) if model is not None else {}
        for path, node, attr in self.never_taken():
            where = f"If '{node[:80]}' {attr} ({path[-80:] or 'main graph'})"
            if mode != "mirror":
                out.append(f"{where} never taken in {self.runs} calibration runs: its activations stay float "
                           f"(--untaken-branches mirror calibrates the values it shares with the other branch)")
                continue
            own = branches.get((node, attr), [])
            got = [v for v in own if v in (mirrored or {})]
            other = "else_branch" if attr == "then_branch" else "then_branch"
            shown = ", ".join(f"'{v[:40]}'" for v in got[:4]) + (f" and {len(got) - 4} more" if len(got) > 4 else "")
            out.append(f"{where} never taken in {self.runs} calibration runs: {len(got)} of {len(own)} values "
                       f"calibrated from {other}'s statistics (the same tensors: {shown or 'none'}); "
                       f"{len(own) - len(got)} stay float")
        return out


def has_bodies(model) -> bool:
    """Whether the IR model (or ModelProto) holds any subgraph."""
    if isinstance(model, onnx.ModelProto):
        return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                   for n in model.graph.node for a in n.attribute)
    return len(model.graphs()) > 1


def feed_dims(model, feed: Mapping[str, np.ndarray]) -> Dict[str, int]:
    """Symbolic dimension name -> size, from one feed of the main-graph inputs (IR Model)."""
    dims: Dict[str, int] = {}
    for v in model.graph.inputs:
        arr = feed.get(v.name)
        if arr is None or v.type is None or not v.type.HasField("tensor_type"):
            continue
        shape = np.shape(arr)
        for i, d in enumerate(v.type.tensor_type.shape.dim):
            if d.HasField("dim_param") and i < len(shape):
                dims.setdefault(d.dim_param, int(shape[i]))
    return dims


def calibration_probe(model, first_feed: Mapping[str, np.ndarray], extra_outputs: Iterable[str] = (),
                      **kw) -> ProbeModel:
    """The probe copy calibration runs: symbolic sizes from the first sample's feed (`feed_dims`) and, when
    shape inference leaves values inside a loop unshaped, their per-iteration shapes learnt from one run of
    that sample (one more onnxruntime session, only for such models). `kw`: `build_probe`'s limits."""
    if isinstance(model, onnx.ModelProto):
        model = model_from_proto(model)
    dims = feed_dims(model, first_feed)
    pm = build_probe(model, dims=dims, extra_outputs=extra_outputs, **kw)
    if kw.get("stack", True) and any(p.reason == UNSHAPED for p in pm.probes.values()):
        pm = None   # NOTE: each copy holds the weights: one at a time
        only = kw.get("body_names")
        learn = build_probe(model, dims=dims, learn_shapes=True,
                            body_names=None if only is None else set(only) | set(extra_outputs))
        shapes: dict = {}
        if learn.probes:
            names = learn.output_names
            sess = create_session(learn.proto)
            learn.proto = None
            got = dict(zip(names, sess.run(names, dict(first_feed), where="calibration sample 0")))
            del sess
            shapes = learn.shapes(got)
        del learn
        pm = build_probe(model, dims=dims, extra_outputs=extra_outputs, shapes=shapes, **kw)
    return pm


# --------------------------------------------------------------------------------------------- building

def build_probe(model, stack_limit: int = STACK_LIMIT, stack_budget: int = STACK_BUDGET,
                dims: Optional[Mapping[str, int]] = None, extra_outputs: Iterable[str] = (),
                stack: bool = True, shapes: Optional[Mapping[str, tuple]] = None,
                learn_shapes: bool = False, body_names: Optional[Iterable[str]] = None) -> ProbeModel:
    """The calibration copy of `model` (IR Model or ModelProto; never changed) with every float body value
    observable as a main-graph output (module docstring).

    `dims`: sizes of the symbolic dimensions of the main-graph inputs (e.g. from the first sample's feed), so
    values shaped by them can be stacked; `extra_outputs`: main-graph value names to list as outputs too (the
    main graph's own calibration outputs; names already outputs are skipped); `stack=False`: every value inside
    a loop as `minmax` (a fallback should onnxruntime refuse to stack a value whose shape the inference wrongly
    took as fixed); `shapes`: per-iteration shapes learnt from a run (`ProbeModel.shapes`), for values onnx
    shape inference leaves untyped; `learn_shapes`: instead of observing values, probe the per-iteration
    shape of every value inside one loop whose shape inference does not know (`how == "shape"`);
    `body_names`: probe only these body values (placement's choice, as `observed_names` is for the main
    graph; None: every float body value).
    """
    if isinstance(model, onnx.ModelProto):
        model = model_from_proto(model)   # IR names: model-wide unique (the body value names are keys)
    proto = model_to_proto(model)
    types = _types(model, model_to_proto(model, stub_over=STUB_BYTES))
    b = _Builder(proto, types, dict(dims or {}), max(0, int(stack_limit)), max(0, int(stack_budget)), stack)
    b.shapes, b.learn = dict(shapes or {}), bool(learn_shapes)
    b.only = None if body_names is None else set(body_names)
    if b.only is not None:   # body values among `extra_outputs` (a pass's calibration_request) are probed too
        b.only.update(extra_outputs)
    res = b.result
    res.original_outputs = [o.name for o in proto.graph.output]
    if b.opset < MIN_OPSET:   # nothing probed; extra_outputs still listed below
        res.skipped.append(("", "", f"opset {b.opset} < {MIN_OPSET}: bodies are not probed"))
    for it in (b.graph(proto.graph, (), 0) if b.opset >= MIN_OPSET else []):
        vi = _vi(it.name, it)
        proto.graph.output.append(vi)
        it.ref.output = it.name
        if isinstance(it.ref, Probe):
            res.probes[it.name] = it.ref
        else:
            res.branches[it.name] = it.ref
    present = {o.name for o in proto.graph.output} | {i.name for i in proto.graph.input}
    main = present | {t.name for t in proto.graph.initializer} | {o for n in proto.graph.node for o in n.output}
    for name in extra_outputs:
        if name not in main:
            continue   # a body value asked for (bias correction's channel means, twins): probed when `only` lets it
        if name not in present:
            proto.graph.output.append(onnx.ValueInfoProto(name=name))
            present.add(name)
    return res


def _types(model, stub: onnx.ModelProto) -> Dict[str, onnx.TypeProto]:
    """Value name -> TypeProto over every graph: the IR's own types, then onnx shape inference's."""
    types: Dict[str, onnx.TypeProto] = {}
    for g in model.graphs():
        for v in g.local_values():
            if v.type is not None and _known(v.type):
                types[v.name] = v.type
    try:
        inferred = onnx.shape_inference.infer_shapes(stub)
    except Exception:   # NOTE: inference is best effort here: values it cannot type are skipped with a reason
        return types
    for g in graph_protos(inferred.graph):
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            if _known(vi.type):
                old = types.get(vi.name)
                if old is None or not old.tensor_type.HasField("shape") or vi.type.tensor_type.HasField("shape"):
                    types[vi.name] = vi.type
    return types


def _known(t: onnx.TypeProto) -> bool:
    kind = t.WhichOneof("value")
    return kind is not None and (kind != "tensor_type" or t.tensor_type.elem_type != 0)


def _vi(name: str, it: _Item) -> onnx.ValueInfoProto:
    if it.kind == "pair":
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [2])
    if it.kind == "code":
        return helper.make_tensor_value_info(name, TensorProto.INT32, None)
    return helper.make_tensor_value_info(name, it.elem, None)


def _all_names(proto: onnx.ModelProto) -> set:
    names = set()
    for g in graph_protos(proto.graph):
        names.update(v.name for v in g.input)
        names.update(v.name for v in g.output)
        names.update(v.name for v in g.value_info)
        names.update(t.name for t in g.initializer)
        for n in g.node:
            names.update(n.input)
            names.update(n.output)
            names.add(n.name)
    names.discard("")
    return names


class _Builder:
    def __init__(self, proto, types, dims, stack_limit, stack_budget, stack):
        self.proto = proto
        self.types = types
        self.dims = dims
        self.stack_limit, self.stack_budget, self.stack = stack_limit, stack_budget, stack
        self.scope = NameScope()
        for n in _all_names(proto):
            self.scope.reserve(n)
        self.input_params = set()
        for vi in proto.graph.input:
            for d in vi.type.tensor_type.shape.dim:
                if d.HasField("dim_param"):
                    self.input_params.add(d.dim_param)
        self.opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)
        self.result = ProbeModel(proto)

    # --- small node builders (each returns the output name) ---------------------------------------------
    def fresh(self, hint: str) -> str:
        return self.scope.fresh(hint[:60])

    def node(self, new: list, op: str, inputs: list, hint: str, **attrs) -> str:
        out = self.fresh(hint)
        new.append(helper.make_node(op, inputs, [out], name=self.fresh(f"probe_{op}"), **attrs))
        return out

    def const(self, new: list, array: np.ndarray, hint: str) -> str:
        out = self.fresh(hint)
        new.append(helper.make_node("Constant", [], [out], name=self.fresh("probe_Constant"),
                                    value=onnx.numpy_helper.from_array(np.asarray(array), out)))
        return out

    def pair_of(self, new: list, x: str, elem: int) -> str:
        """float32 [min, max] of every element of `x` ([+inf, -inf] when empty)."""
        if elem != TensorProto.FLOAT:
            x = self.node(new, "Cast", [x], f"{x}_f32", to=TensorProto.FLOAT)
        flat = self.node(new, "Reshape", [x, self.const(new, np.array([-1], np.int64), "probe_flat")],
                         f"{x}_flat")
        lo = self.node(new, "Concat", [flat, self.const(new, np.array([np.inf], np.float32), "probe_inf")],
                       f"{x}_lo_in", axis=0)
        hi = self.node(new, "Concat", [flat, self.const(new, np.array([-np.inf], np.float32), "probe_ninf")],
                       f"{x}_hi_in", axis=0)
        mn = self.node(new, "ReduceMin", [lo], f"{x}_min", keepdims=1)
        mx = self.node(new, "ReduceMax", [hi], f"{x}_max", keepdims=1)
        return self.node(new, "Concat", [mn, mx], f"{x}_minmax", axis=0)

    def reduce_pairs(self, new: list, x: str) -> str:
        """Stacked pairs [..., 2] -> one pair [min of mins, max of maxes] (an empty stack gives [+inf, -inf])."""
        rows = self.node(new, "Reshape", [x, self.const(new, np.array([-1, 2], np.int64), "probe_rows")],
                         f"{x}_rows")
        ident = self.const(new, np.array([[np.inf, -np.inf]], np.float32), "probe_identity")
        rows = self.node(new, "Concat", [rows, ident], f"{x}_rows_id", axis=0)
        c0 = self.node(new, "Gather", [rows, self.const(new, np.array([0], np.int64), "probe_c0")],
                       f"{x}_mins", axis=1)
        c1 = self.node(new, "Gather", [rows, self.const(new, np.array([1], np.int64), "probe_c1")],
                       f"{x}_maxs", axis=1)
        mn = self.node(new, "ReduceMin", [c0], f"{x}_min", keepdims=1)
        mx = self.node(new, "ReduceMax", [c1], f"{x}_max", keepdims=1)
        both = self.node(new, "Concat", [mn, mx], f"{x}_mm", axis=1)
        return self.node(new, "Reshape", [both, self.const(new, np.array([2], np.int64), "probe_two")],
                         f"{x}_minmax")

    def padded_shape(self, new: list, x: str) -> str:
        """Shape(x) padded with -1 to SHAPE_SLOTS entries (the same length whatever the rank, so it stacks)."""
        shp = self.node(new, "Shape", [x], f"{x}_shape")
        rank = self.node(new, "Shape", [shp], f"{x}_rank")
        room = self.node(new, "Sub", [self.const(new, np.array([SHAPE_SLOTS], np.int64), "probe_slots"), rank],
                         f"{x}_room")
        pads = self.node(new, "Concat", [self.const(new, np.array([0], np.int64), "probe_zero"), room],
                         f"{x}_pads", axis=0)
        return self.node(new, "Pad", [shp, pads, self.const(new, np.array(-1, np.int64), "probe_minus1")],
                         f"{x}_shape_padded")

    def filler(self, new: list, it: _Item, loops: int) -> str:
        """What the branch that did not run outputs in place of `it` (module docstring)."""
        if it.kind == "pair":
            return self.const(new, np.array([np.inf, -np.inf], np.float32), "probe_not_taken")
        if it.kind == "code":
            return self.const(new, np.array(0, np.int32), "probe_not_taken")
        np_dtype = onnx.helper.tensor_dtype_to_np_dtype(it.elem)
        if loops == 0 or it.shape is None:
            t = onnx.helper.make_tensor("probe_not_taken", it.elem, [0], [])
            out = self.fresh("probe_not_taken")
            new.append(helper.make_node("Constant", [], [out], name=self.fresh("probe_Constant"), value=t))
            return out
        if it.elem == TensorProto.BFLOAT16:
            t = onnx.helper.make_tensor("probe_not_taken", it.elem, list(it.shape),
                                        [0.0] * int(np.prod(it.shape, dtype=np.int64)))
            out = self.fresh("probe_not_taken")
            new.append(helper.make_node("Constant", [], [out], name=self.fresh("probe_Constant"), value=t))
            return out
        return self.const(new, np.zeros(it.shape, np_dtype), "probe_not_taken")

    # --- shapes ----------------------------------------------------------------------------------------
    def static_shape(self, name: str) -> Optional[tuple]:
        if name in self.shapes:
            return self.shapes[name]
        t = self.types.get(name)
        if t is None or not t.tensor_type.HasField("shape"):
            return None
        out = []
        for d in t.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value >= 0:
                out.append(int(d.dim_value))
            elif d.HasField("dim_param") and d.dim_param in self.input_params and d.dim_param in self.dims:
                out.append(int(self.dims[d.dim_param]))
            else:
                return None
        return tuple(out)

    def elem(self, name: str) -> int:
        """The element type of a tensor value; 0 when unknown; -1 for a sequence, map or optional."""
        t = self.types.get(name)
        if t is None or t.WhichOneof("value") is None:
            return 0
        return t.tensor_type.elem_type if t.HasField("tensor_type") else -1

    # --- the walk ---------------------------------------------------------------------------------------
    def graph(self, g: onnx.GraphProto, path: tuple, loops: int) -> List[_Item]:
        """Rewrite the bodies under `g` and, for a body, probe its own values. Returns the items `g` must pass
        up (for the main graph: the items to list as outputs)."""
        new: list = []
        items: List[_Item] = []
        budget = [self.stack_budget]
        if path:
            for vi in g.input:
                self.value(g, new, items, path, loops, vi.name, budget)
        for n in list(g.node):
            own = list(n.output)    # before `control` appends the outputs that carry the body probes
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute):
                items.extend(self.control(g, n, new, path, loops))
            if path and n.op_type != "Constant":
                for o in own:
                    if o:
                        self.value(g, new, items, path, loops, o, budget)
        g.node.extend(new)
        return items

    def value(self, g, new, items, path, loops, name, budget) -> None:
        elem = self.elem(name)
        if elem == 0:
            self.result.skipped.append((path_str(path), name, "element type unknown"))
            return
        if elem not in FLOAT_TYPES:   # integers and booleans are never quantized; nor are sequences
            return
        if self.only is not None and name not in self.only:
            return
        p = Probe(path=path, value=name)
        shape = self.static_shape(name) if loops == 1 else None
        if self.learn:
            if loops == 1 and shape is None and self.opset >= 11:
                p.how = "shape"
                items.append(_Item(self.padded_shape(new, name), p, "value", TensorProto.INT64, (SHAPE_SLOTS,)))
            return
        if loops == 0:
            p.how = "value"
        elif not self.stack:
            p.how, p.reason = "minmax", "stacking disabled"
        elif loops > 1:
            p.how, p.reason = "minmax", "inside nested loops"
        elif shape is None:
            p.how, p.reason = "minmax", UNSHAPED
        else:
            size = int(np.prod(shape, dtype=np.int64))
            if size > self.stack_limit:
                p.how, p.reason = "minmax", f"{size} elements per iteration > {self.stack_limit}"
            elif size > budget[0]:
                p.how, p.reason = "minmax", f"stacking budget of the body ({self.stack_budget} elements) spent"
            else:
                p.how = "stacked"
                budget[0] -= size
        if p.how == "minmax":
            items.append(_Item(self.pair_of(new, name, elem), p, "pair"))
        else:
            out = self.node(new, "Identity", [name], f"{name}_probe")
            items.append(_Item(out, p, "value", elem, shape))

    def control(self, g, n, new, path, loops) -> List[_Item]:
        """Probe the bodies of `n` and widen `n` so their probes come out as outputs of `n` in `g`."""
        label = n.name or (n.output[0] if n.output else n.op_type)
        attrs = {a.name: a for a in n.attribute}
        if n.op_type == "If" and n.domain in ("", "ai.onnx") and {"then_branch", "else_branch"} <= set(attrs):
            return self.if_node(n, attrs, new, path, loops, label)
        if n.op_type in ("Loop", "Scan") and n.domain in ("", "ai.onnx") and "body" in attrs:
            return self.loop_node(n, attrs, new, path, loops, label)
        self.result.skipped.append((path_str(path), label, f"bodies of {n.op_type[:40]} are not probed"))
        return []

    def if_node(self, n, attrs, new, path, loops, label) -> List[_Item]:
        then_g, else_g = attrs["then_branch"].g, attrs["else_branch"].g
        bp = BranchProbe(path=path, node=label, how="code" if loops <= 1 else "minmax")
        then_items = self.graph(then_g, path + ((label, "then_branch"),), loops)
        else_items = self.graph(else_g, path + ((label, "else_branch"),), loops)
        for its, code in ((then_items, THEN), (else_items, ELSE)):
            for it in its:
                if isinstance(it.ref, Probe) and it.ref.guard is None and it.kind == "value":
                    it.ref.guard, it.ref.guard_code = bp, code
        then_new: list = []
        else_new: list = []
        out: List[_Item] = []
        if bp.how == "code":
            tc = self.const(then_new, np.array(THEN, np.int32), "probe_then")
            ec = self.const(else_new, np.array(ELSE, np.int32), "probe_else")
            code_item = _Item("", bp, "code", TensorProto.INT32, ())
        else:
            tc = self.const(then_new, np.array([THEN, THEN], np.float32), "probe_then")
            ec = self.const(else_new, np.array([ELSE, ELSE], np.float32), "probe_else")
            code_item = _Item("", bp, "pair")
        rows = [(code_item, tc, ec)]
        rows += [(it, it.name, self.filler(else_new, it, loops)) for it in then_items]
        rows += [(it, self.filler(then_new, it, loops), it.name) for it in else_items]
        for it, t_name, e_name in rows:
            vi = _vi("", it)
            then_g.output.append(_named(vi, t_name))
            else_g.output.append(_named(vi, e_name))
            name = self.fresh(f"{label}_{it.ref.value if isinstance(it.ref, Probe) else 'branch'}_out")
            n.output.append(name)
            out.append(_Item(name, it.ref, it.kind, it.elem, it.shape))
        then_g.node.extend(then_new)
        else_g.node.extend(else_new)
        return out

    def loop_node(self, n, attrs, new, path, loops, label) -> List[_Item]:
        body = attrs["body"].g
        items = self.graph(body, path + ((label, "body"),), loops + 1)
        out: List[_Item] = []
        for it in items:
            body.output.append(_named(_vi("", it), it.name))
            name = self.fresh(f"{label}_{it.ref.value if isinstance(it.ref, Probe) else 'branch'}_scan")
            n.output.append(name)
            if it.kind == "pair":
                out.append(_Item(self.reduce_pairs(new, name), it.ref, "pair"))
            else:   # value or code items only come from a body inside one loop: stacked, `g` is outside loops
                out.append(_Item(name, it.ref, it.kind, it.elem, None))
        if n.op_type == "Scan" and items:
            for key in ("scan_output_axes", "scan_output_directions"):
                a = attrs.get(key)
                if a is not None:
                    a.ints.extend([0] * len(items))
        return out


def _named(vi: onnx.ValueInfoProto, name: str) -> onnx.ValueInfoProto:
    v = onnx.ValueInfoProto()
    v.CopyFrom(vi)
    v.name = name
    return v


class BodyCalibration:
    """The calibration session over a probe copy, for `calibrate(..., bodies=True)`.

    `run(names, feed, where)` -> (probe, {output name: array}) of one sample (the model's outputs, the
    main-graph values asked for and the probe outputs); `values(outputs)` -> the same dict with the probe
    outputs replaced by the body values they carry (values a sample never reached are left out), the
    branches tallied in `tally`.

    NOTE: a value stacked on the strength of a shape learnt from the first sample (or of its symbolic sizes)
    can change shape in a later sample; onnxruntime then refuses to stack it and the run fails. The probe is
    then rebuilt with every value inside a loop as `minmax` (`stack=False`), once, and the sample run again:
    coarser statistics rather than a failed calibration. `run` is called from one worker thread at a time;
    each result carries the probe it was made with, so `values` never decodes with the wrong one.
    """

    def __init__(self, model, first_feed, extra_outputs=(), **kw):
        self.model = model_from_proto(model) if isinstance(model, onnx.ModelProto) else model
        self.extra_outputs, self.kw = list(extra_outputs), dict(kw)
        self.probe = calibration_probe(self.model, first_feed, self.extra_outputs, **self.kw)
        self.tally = BranchTally(self.probe)
        self.minmax = set(self.probe.minmax_values)   # observed as per-run [min, max] pairs only
        self.fell_back = False
        self._open()

    def _open(self) -> None:
        self.session = create_session(self.probe.proto)
        self.probe.proto = None   # NOTE: a serialized copy of the weights; onnxruntime has its own now
        self.names = [o.name for o in self.session.get_outputs()]

    def run(self, names, feed, where: str = "") -> tuple:
        """One sample: (the probe used, {output name: array}). `names` is ignored (the signature of
        ort_session.Session.run, so calibrate's loop calls either): every output of the probe copy is read."""
        probe = self.probe
        try:
            arrays = self.session.run(self.names, feed, where=where)
        except DataError:
            stacked = any(p.how == "stacked" for p in probe.probes.values())
            if self.fell_back or not stacked:
                raise
            self.fell_back = True
            self.probe = build_probe(self.model, extra_outputs=self.extra_outputs,
                                     **{**self.kw, "stack": False})
            self.tally.probe = self.probe
            self.minmax |= set(self.probe.minmax_values)
            self._open()
            return self.run(names, feed, where)
        return probe, dict(zip(self.names, arrays))

    def values(self, result) -> Dict[str, np.ndarray]:
        probe, outputs = result
        self.tally.probe = probe
        self.tally.update(outputs)
        body = probe.values(outputs)
        carried = set(probe.probes) | set(probe.branches)
        out = {k: v for k, v in outputs.items() if k not in carried}
        out.update((k, v) for k, v in body.items() if v is not None)
        return out


# --------------------------------------------------------------------------------------------- never taken

def _branch_values(model) -> Dict[Tuple[str, str], List[str]]:
    """(If label, branch attribute) -> the float-typed values defined in that branch (node outputs)."""
    out: Dict[Tuple[str, str], List[str]] = {}
    for g in model.graphs():
        for n in g.nodes_by_op("If"):
            label = n.name or (n.outputs[0].name if n.outputs and n.outputs[0] is not None else "")
            for attr in ("then_branch", "else_branch"):
                b = n.attr(attr)
                if b is not None:
                    out[(label, attr)] = [o.name for m in b.nodes if m.op_type != "Constant" for o in m.outputs
                                          if o is not None and o.dtype in FLOAT_TYPES]
    return out


def mirror_candidates(model) -> List[str]:
    """Every If-branch value that has a twin in the other branch, on both sides (`_twins` both ways): what
    calibration must observe so that, whichever branch goes idle, its twins' statistics exist (supergroup
    interiors included: an idle Conv -> Sigmoid output may borrow from its twin inside a Conv -> Relu pair)."""
    out: List[str] = []
    for g in model.graphs():
        for n in g.nodes_by_op("If"):
            a, b = n.attr("then_branch"), n.attr("else_branch")
            if a is None or b is None:
                continue
            for x, y in _twins(a, b).items():
                out.extend((x, y))
    return list(dict.fromkeys(out))


def mirror_untaken(calibration, model) -> Dict[str, str]:
    """Give each value of a branch calibration never took the observer (and dtype) of its twin in the branch
    that ran (`mirrored_values`), so placement quantizes it on the twin's grid. Returns {idle: twin} for the
    values that got one (a twin calibration did not observe gives nothing)."""
    body = calibration.bodies
    if body is None:
        return {}
    done = {}
    for idle, twin in mirrored_values(model, body.tally.never_taken()).items():
        obs = calibration.observers.get(twin)
        if obs is None or idle in calibration.observers or twin not in calibration.dtypes:
            continue
        calibration.observers[idle], calibration.dtypes[idle] = obs, calibration.dtypes[twin]
        axis = calibration.channel_axes.get(idle)
        if axis is not None and twin in calibration.channel_sums:
            calibration.channel_sums[idle] = calibration.channel_sums[twin]
        done[idle] = twin
    return done


def mirrored_values(model, never_taken: Iterable[Tuple[str, str, str]]) -> Dict[str, str]:
    """For If branches calibration never took (`BranchTally.never_taken()`): value in the idle branch -> the
    value of the taken branch computed the same way (same op, domain and attributes; inputs that are the same
    captured names or values already paired), whose statistics are then exactly the idle value's. For a user
    who asks to calibrate idle branches from the other one; values with no twin stay float.
    Nodes holding bodies are not paired (nor is anything computed from them)."""
    ifs = {}
    for g in model.graphs():
        for n in g.nodes_by_op("If"):
            ifs[n.name or (n.outputs[0].name if n.outputs and n.outputs[0] is not None else "")] = n
    idle: Dict[str, set] = {}
    for _path, label, attr in never_taken:
        idle.setdefault(label, set()).add(attr)
    pairs: Dict[str, str] = {}
    for label, attrs in idle.items():
        n = ifs.get(label)
        if n is None or len(attrs) != 1:   # both branches idle: nothing to borrow from
            continue
        (attr,) = attrs
        other = "else_branch" if attr == "then_branch" else "then_branch"
        if n.attr(attr) is not None and n.attr(other) is not None:
            pairs.update(_twins(n.attr(attr), n.attr(other)))
    return pairs


def _signature(n, names: Mapping[str, str]) -> tuple:
    protos = sorted(node_attr_protos(n) or (), key=lambda p: p.name)
    attrs = tuple(p.SerializeToString(deterministic=True) for p in protos)
    return (n.op_type, n.domain, attrs, tuple(names.get(x, x) for x in n.input_names()))


def _twins(idle_g, taken_g) -> Dict[str, str]:
    pairs: Dict[str, str] = {}
    free: Dict[tuple, list] = {}
    for t in taken_g.nodes:
        if not t.subgraphs():
            free.setdefault(_signature(t, {}), []).append(t)
    for n in idle_g.nodes:
        if n.subgraphs():
            continue
        cands = free.get(_signature(n, pairs))
        if not cands:
            continue
        t = cands.pop(0)
        for a, b in zip(n.output_names(), t.output_names()):
            if a and b:
                pairs[a] = b
    return pairs
