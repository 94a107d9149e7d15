"""The quantization plan: what each value (and each use) should become, kept apart from the graph.

Placement fills a plan; calibration turns specs into encodings; QDQ insertion reads the plan and edits the
graph. Keys are exact value names (unique model-wide) and `(node name, input slot)` for per-use overrides, so
two outputs named `hidden_output` and `hidden_output_1` can never collide (field notes §3).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Literal, Optional, Tuple

from qcompiler.quant.core.encoding import Encoding
from qcompiler.quant.targets.profiles import Profile

# how a quantized weight or bias is written (placement.decide_storage decides, qdq.apply_plan writes)
INT = "int"                        # the integer tensor and a DequantizeLinear
FLOAT_ON_GRID = "float_on_grid"    # float32 values on the integer grid (the node runs a float kernel)
Storage = Literal["int", "float_on_grid"]


@dataclass
class QuantSpec:
    """How one tensor is quantized: grid, granularity, fixed range, frozen encoding, or kept float (and why)."""

    kind: str = "activation"            # "activation" | "weight" | "bias"
    bits: int = 8
    symmetric: bool = False
    signed: Optional[bool] = None       # storage signedness; None = symmetric
    axis: Optional[int] = None          # per-channel axis (weights), None = per-tensor
    block_size: Optional[int] = None    # per-block along `axis`
    range_bits: Optional[int] = None    # narrower weight grid stored in `bits` (ORT reduce_range)
    fixed_range: Optional[Tuple[float, float]] = None
    encoding: Optional[Encoding] = None  # computed (after calibration) or frozen (loaded)
    frozen: bool = False
    keep_float: bool = False
    reason: str = ""
    widened: str = ""                   # why the grid was widened beyond the default bits (field notes §6)
    source: str = ""                    # why this spec exists (profile rule, config, tie, ...)
    tie_root: Optional[str] = None      # a per-use quantizer with the encoding of this value's tie group
    storage: Storage = INT              # weights and biases: how the lowering writes them
    asked: bool = False                 # weights: a config rule set this grid (kept even on a float kernel)
    storage_reason: str = ""            # why FLOAT_ON_GRID (the node's float kernel)
    param_name: str = ""                # the name a FLOAT_ON_GRID use's parameter is reported under
    rounded: Optional[object] = None    # weights: learned integers (storage dtype, the weight's shape) that
    #                                     insert-qdq writes instead of round-to-nearest (adaround; frozen encoding)

    def float_(self, reason: str) -> "QuantSpec":
        """Mark this spec float with `reason` (the first reason wins: it names the root cause)."""
        if not self.keep_float:
            self.keep_float, self.reason = True, reason
        return self


@dataclass
class Supergroup:
    """Nodes treated as one unit: quantizers only at its boundary, interior values stay float (field notes §2)."""

    kind: str
    nodes: List[str]
    interior: List[str]


@dataclass
class Body:
    """An If/Loop/Scan body: its weights are quantized per use and its activations placed like the main
    graph's (placement/bodies.py); values calibration never reached there stay float. The report lists it
    under `key`."""

    owner: str           # the If/Loop/Scan node
    op_type: str
    index: int           # which of the node's bodies (If: 0 then, 1 else)
    nodes: int
    weights: int         # weight uses quantized inside it
    activations: int = 0     # activations quantized inside it
    unobserved: int = 0      # float values calibration never reached (left float)

    @property
    def key(self) -> str:
        return f"<body {self.index} of {self.op_type} '{self.owner}'>"

    @property
    def reason(self) -> str:
        what = (f"subgraph body of {self.op_type} '{self.owner}' ({self.nodes} nodes, {self.weights} weights "
                f"quantized, {self.activations} activations quantized)")
        if self.unobserved:
            what += f": {self.unobserved} float values never reached by calibration stay float"
        elif not self.activations:
            what += ": activations float (none observed or quantizable)"
        return what


class QuantPlan:
    """Per-value specs, per-use overrides, tie groups (union-find) and supergroups."""

    def __init__(self, profile: Profile, optimize: str = "balanced"):
        self.profile = profile
        self.optimize = optimize    # the `--optimize` objective (how float kernels' weights are stored)
        self.values: Dict[str, QuantSpec] = {}                  # activations and weights by value name
        self.uses: Dict[Tuple[str, int], QuantSpec] = {}        # (node name, input slot) overrides
        self.supergroups: List[Supergroup] = []
        self.bodies: List[Body] = []                            # If/Loop/Scan bodies
        self.interior: Dict[str, str] = {}                      # value name -> supergroup kind
        self._parent: Dict[str, str] = {}
        self.dtypes: Dict[str, object] = {}                     # runtime dtype of every value seen
        # the one resolver of the (node name, slot) keys: name -> node over the main graph and every body, built
        # once by build_plan (inserting Q/DQ adds nodes but renames none of the float model's)
        self.nodes: Dict[str, object] = {}
        self.trim_candidates: List[str] = []   # Q/DQ pairs between float kernels (passes/quantize/latency_search.py)
        self.narrow_candidates: List[str] = []  # widened values narrowed to 8 bits for an integer kernel (idem)
        self.narrow_weights: Dict[Tuple[str, int], tuple] = {}  # (node, slot) -> (group root, float weight)
        self.node_macs: Dict[str, float] = {}   # multiply-accumulates per call (placement/cost.py size rule)
        self.sizes: Dict[str, dict] = {}        # value name -> {"count", "calls"} observed (the rule's borders)
        self.macs: Dict[str, float] = {}        # the same for every sized node (the summary's integer share)

    # --- specs ------------------------------------------------------------------------------------------
    def spec(self, name: str) -> Optional[QuantSpec]:
        return self.values.get(name)

    def set(self, name: str, spec: QuantSpec) -> QuantSpec:
        self.values[name] = spec
        return spec

    def set_use(self, node_name: str, slot: int, spec: QuantSpec) -> QuantSpec:
        self.uses[(node_name, slot)] = spec
        return spec

    def keep_float(self, name: str, reason: str) -> None:
        spec = self.values.get(name)
        if spec is None:
            spec = self.values[name] = QuantSpec()
        spec.float_(reason)

    def quantized_activations(self) -> List[str]:
        return [n for n, s in self.values.items() if s.kind == "activation" and not s.keep_float]

    def needs_opset(self) -> int:
        """Lowest default-domain opset the plan's Q/DQ need: 21 for int16/int4 grids and per-block weights
        (DequantizeLinear `block_size`; anchors B), else 13."""
        specs = list(self.values.values()) + list(self.uses.values())
        wide = any(not s.keep_float and s.kind != "bias" and (s.bits != 8 or s.block_size) for s in specs)
        return 21 if wide else 13

    def stored_on_grid(self) -> Dict[str, str]:
        """{weight or bias name: reason} for every quantized parameter stored as float on its grid (the first
        use's reason when several uses of one weight are)."""
        out: Dict[str, str] = {}
        for spec in self.uses.values():
            if spec.kind in ("weight", "bias") and not spec.keep_float and spec.storage == FLOAT_ON_GRID \
                    and spec.encoding is not None and spec.param_name:
                out.setdefault(spec.param_name, spec.storage_reason)
        return out

    def float_values(self) -> Dict[str, str]:
        """Every value the plan leaves float, with its reason, and every body where something stays float
        (values calibration never reached, or no activation quantized)."""
        out = {n: s.reason for n, s in self.values.items() if s.keep_float}
        out.update((b.key, b.reason) for b in self.bodies if b.unobserved or not b.activations)
        return out

    # --- supergroups ------------------------------------------------------------------------------------
    def add_supergroup(self, kind: str, nodes: Iterable[str], interior: Iterable[str]) -> None:
        sg = Supergroup(kind, list(nodes), list(interior))
        self.supergroups.append(sg)
        for v in sg.interior:
            self.interior.setdefault(v, kind)

    # --- ties ---------------------------------------------------------------------------------------------
    def find(self, name: str) -> str:
        p = self._parent.get(name, name)
        if p == name:
            return name
        root = self.find(p)
        self._parent[name] = root
        return root

    def tie(self, a: str, b: str) -> None:
        """Make `a` and `b` share one encoding."""
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self._parent[rb] = ra

    def untie(self, names: Iterable[str]) -> None:
        """Dissolve the groups of `names` (each member becomes its own group)."""
        names = set(names)
        groups = self.tie_groups()
        for members in groups.values():
            if names & set(members):
                for m in members:
                    self._parent[m] = m

    def tie_groups(self) -> Dict[str, List[str]]:
        """root -> members, for every group of two or more values."""
        groups: Dict[str, List[str]] = {}
        for n in list(self._parent):
            groups.setdefault(self.find(n), []).append(n)
        for root, members in groups.items():
            if root not in members:
                members.insert(0, root)
        return {r: m for r, m in groups.items() if len(m) > 1}
