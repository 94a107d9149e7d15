"""A runtime's QDQ fusions as data: which DQ -> op -> Q units become integer kernels, and their type limits.

`load_fusions("ort_cpu")` reads `fusion_tables/ort_cpu.yaml` (onnxruntime CPU, from its qdq_selector_action_transformer.cc
and qdq_selectors.cc; the file's header gives the field meanings) into a `FusionTable` of typed `Fusion` records;
a path to a .yaml file loads another backend's table the same way (opened through input_files, parsed by the
bounded YAML loader, every bad field one ConfigError line). `FusionTable.for_op(op)` lists the records for an op
type, `is_integer_kernel(op)` says whether an op of an optimized graph runs integer arithmetic.

kernels.py uses the table to explain why a node of a QDQ model stayed float; placement can use the same records
to decide what a supergroup is on a target.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import Optional

from qcompiler.errors import ConfigError
from qcompiler.input_files import read_bounded
from qcompiler.quant.settings.untrusted import decode_text, parse_yaml, short

FUSIONS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fusion_tables")

ACTIONS = ("replace", "drop_qdq", "drop_dq", "weight_only")
DQ_INPUTS = ("all", "first", "weight", "values")
OUTPUT_Q = ("required", "optional", "none")
INT_TYPES = ("uint8", "int8", "uint16", "int16", "uint4", "int4", "uint2", "int2", "int32")
INT8_ACT = ("any", "x86")


@dataclass(frozen=True)
class Fusion:
    """One rule: DQ(s) -> op -> Q for an op in `ops` becomes `kernel` (or loses its Q/DQ) when the limits hold."""

    name: str
    ops: tuple
    action: str                       # one of ACTIONS
    dq_inputs: str = "all"            # one of DQ_INPUTS
    output_q: str = "required"        # one of OUTPUT_Q
    kernel: Optional[str] = None      # "QLinear{op}" names the op's own kernel
    kernel_without_q: Optional[str] = None
    act_dtypes: tuple = ()
    weight_dtypes: tuple = ()
    same_dtype: bool = False
    int8_act_needs_int8_weight: bool = False
    int8_act: str = "any"
    bias_dtype: Optional[str] = None
    equal_qparams: bool = False
    positive_scale: bool = False
    absorbs: tuple = ()
    keeps_q_after: tuple = ()         # a single reader of these types must keep its output Q (else a float fusion)
    min_opset: dict = field(default_factory=dict)
    block_size: dict = field(default_factory=dict)
    min_macs: int = 0                 # below this many multiply-accumulates per call the op stays float
    macs_per_border_element: int = 0  # ... and this many more per element of each value at the region's border
    inputs_from_integer: bool = False  # pays only when every activation input comes from an integer kernel
    note: str = ""

    def kernel_for(self, op: str, with_q: bool = True) -> Optional[str]:
        k = self.kernel if with_q or self.kernel_without_q is None else self.kernel_without_q
        return k.replace("{op}", op) if k else None

    @property
    def allows_16bit(self) -> bool:
        return any(t in ("int16", "uint16") for t in self.act_dtypes)


@dataclass(frozen=True)
class FusionTable:
    target: str
    runtime: str
    integer_kernels: frozenset
    fusions: tuple
    source: str = ""

    def for_op(self, op: str) -> list:
        """The records that can fuse an `op` node, in file order (MatMul: QLinearMatMul, then MatMulNBits)."""
        return [f for f in self.fusions if op in f.ops]

    def is_integer_kernel(self, op: str) -> bool:
        return op in self.integer_kernels


_FIELDS = {f for f in Fusion.__dataclass_fields__}


def _str_list(v, where: str, allowed=None) -> tuple:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise ConfigError(f"{where} must be a list of strings, got {short(v)}")
    if allowed is not None:
        bad = [x for x in v if x not in allowed]
        if bad:
            raise ConfigError(f"{where}: unknown value {short(bad[0])} (expected one of {', '.join(allowed)})")
    return tuple(v)


def _choice(v, where: str, allowed) -> str:
    if v not in allowed:
        raise ConfigError(f"{where} must be one of {', '.join(allowed)}, got {short(v)}")
    return v


def _record(d, i: int, src: str) -> Fusion:
    where = f"{src}: fusions[{i}]"
    if not isinstance(d, dict):
        raise ConfigError(f"{where} must be a mapping, got {short(d)}")
    unknown = [k for k in d if k not in _FIELDS]
    if unknown:
        raise ConfigError(f"{where}: unknown key {short(unknown[0])}")
    if not isinstance(d.get("name"), str) or not d["name"]:
        raise ConfigError(f"{where}: 'name' must be a non-empty string")
    where = f"{src}: fusion {short(d['name'])}"
    kw = dict(name=d["name"], ops=_str_list(d.get("ops"), f"{where}: ops"),
              action=_choice(d.get("action"), f"{where}: action", ACTIONS))
    for k, allowed in (("dq_inputs", DQ_INPUTS), ("output_q", OUTPUT_Q), ("int8_act", INT8_ACT)):
        if k in d:
            kw[k] = _choice(d[k], f"{where}: {k}", allowed)
    for k in ("act_dtypes", "weight_dtypes"):
        if k in d:
            kw[k] = _str_list(d[k], f"{where}: {k}", INT_TYPES)
    for k in ("absorbs", "keeps_q_after"):
        if k in d:
            kw[k] = _str_list(d[k], f"{where}: {k}")
    for k in ("kernel", "kernel_without_q", "note"):
        if k in d:
            if not isinstance(d[k], str):
                raise ConfigError(f"{where}: {k} must be a string, got {short(d[k])}")
            kw[k] = d[k]
    if "bias_dtype" in d:
        kw["bias_dtype"] = _choice(d["bias_dtype"], f"{where}: bias_dtype", INT_TYPES)
    for k in ("same_dtype", "int8_act_needs_int8_weight", "equal_qparams", "positive_scale", "inputs_from_integer"):
        if k in d:
            if not isinstance(d[k], bool):
                raise ConfigError(f"{where}: {k} must be true or false, got {short(d[k])}")
            kw[k] = d[k]
    for k in ("min_macs", "macs_per_border_element"):
        if k in d:
            if isinstance(d[k], bool) or not isinstance(d[k], int) or d[k] < 0:
                raise ConfigError(f"{where}: {k} must be a whole number >= 0, got {short(d[k])}")
            kw[k] = d[k]
    for k in ("min_opset", "block_size"):
        if k in d:
            if not isinstance(d[k], dict):
                raise ConfigError(f"{where}: {k} must be a mapping, got {short(d[k])}")
            kw[k] = dict(d[k])
    if kw["action"] in ("replace", "weight_only") and not kw.get("kernel"):
        raise ConfigError(f"{where}: action {kw['action']} needs a 'kernel'")
    return Fusion(**kw)


def parse_fusions(data, src: str) -> FusionTable:
    """A parsed YAML document -> FusionTable; every bad field is one ConfigError line naming `src`."""
    if not isinstance(data, dict):
        raise ConfigError(f"{src}: a fusion table must be a mapping, got {short(data)}")
    for k in ("target", "runtime"):
        if not isinstance(data.get(k), str) or not data[k]:
            raise ConfigError(f"{src}: '{k}' must be a non-empty string")
    fus = data.get("fusions")
    if not isinstance(fus, list) or not fus:
        raise ConfigError(f"{src}: 'fusions' must be a non-empty list")
    records = tuple(_record(d, i, src) for i, d in enumerate(fus))
    names = [r.name for r in records]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise ConfigError(f"{src}: fusion {short(dup)} is listed twice")
    kernels = _str_list(data.get("integer_kernels", []), f"{src}: integer_kernels")
    derived = {r.kernel_for(op) for r in records for op in r.ops} | \
              {r.kernel_for(op, with_q=False) for r in records for op in r.ops}
    return FusionTable(target=data["target"], runtime=data["runtime"],
                       integer_kernels=frozenset(kernels) | frozenset(k for k in derived if k), fusions=records,
                       source=src)


@functools.lru_cache(maxsize=8)
def _builtin(name: str) -> FusionTable:
    path = os.path.join(FUSIONS_DIR, f"{name}.yaml")
    text = decode_text(read_bounded(path, "profile", ConfigError), path, "fusion table")
    return parse_fusions(parse_yaml(text, path, ConfigError), f"{name}.yaml")


def builtin_tables() -> list:
    """Names of the fusion tables shipped with qcompiler (`ort_cpu`, ...)."""
    return sorted(f[:-5] for f in os.listdir(FUSIONS_DIR) if f.endswith(".yaml"))


def load_fusions(target: str = "ort_cpu") -> FusionTable:
    """The fusion table of a built-in target (`ort_cpu`) or of a .yaml file at that path."""
    if not isinstance(target, (str, os.PathLike)):
        raise ConfigError(f"fusion table must be a target name or a .yaml path, got {short(target)}")
    target = os.fspath(target)
    if target.endswith((".yaml", ".yml")):
        text = decode_text(read_bounded(target, "profile", ConfigError), target, "fusion table")
        return parse_fusions(parse_yaml(text, target, ConfigError), target)
    if target not in builtin_tables():
        raise ConfigError(f"no fusion table for target {short(target)} (known: {', '.join(builtin_tables())})")
    return _builtin(target)


__all__ = ["Fusion", "FusionTable", "load_fusions", "parse_fusions", "builtin_tables", "FUSIONS_DIR"]
