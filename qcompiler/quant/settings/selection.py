"""Which nodes are quantized: exclusions and include-lists (CLI --exclude/--op-types, onnxruntime's
nodes_to_exclude/op_types_to_quantize/nodes_to_quantize) turned into config rules, and the warnings for
selectors, config rules and frozen encodings that match nothing.

Semantics (as onnxruntime's quantize_static):
- `exclude`: each entry is a node name, or (when no node has that name) a regular expression searched in node
  names (RE2, linear time). A matched node stays float: no quantizer on its outputs, its weights float.
- `op_types` / `nodes` (include-lists): only nodes whose op type is listed (and, with `nodes`, whose name is
  listed) are quantized. Other nodes keep their weights float and their outputs unquantized, except an output
  read by a quantized node, or produced by an activation fused with one (Conv -> Relu), which keeps the
  quantizer between them so the quantized node still gets integer inputs and outputs.
Exclusions win over include-lists. Names are checked against the model as loaded (before preparation passes
such as fold-batchnorm remove nodes), so naming a node that exists is never a warning.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import List, Optional, Sequence

import onnx

from qcompiler.arguments import got
from qcompiler.errors import ArgumentError
from qcompiler.quant.settings.config import (
    NodeSettings,
    QuantConfig,
    Rule,
    _compile_regex,
    warning,  # noqa: F401  (one structured warning; selection's callers import it here)
)
from qcompiler.quant.settings.untrusted import short
from qcompiler.shorten import did_you_mean, short_text


@dataclass
class Selection:
    """The API arguments: node names or regexes to exclude, op types and node names to include."""

    exclude: Sequence[str] = ()
    op_types: Optional[Sequence[str]] = None
    nodes: Optional[Sequence[str]] = None
    act_symmetric: Optional[bool] = None
    weight_symmetric: Optional[bool] = None
    warnings: List[dict] = field(default_factory=list)
    exclude_names: Optional[set] = None     # the `exclude` entries that name a node of the model as loaded

    @property
    def empty(self) -> bool:
        return not self.exclude and self.op_types is None and self.nodes is None


def warning_text(w: dict, labels: Optional[dict] = None) -> str:
    label = (labels or {}).get(w["kind"], w["kind"])
    v = w["value"]
    v = v if isinstance(v, str) and len(v) <= 80 else short(v)
    return f"{label} '{v}' {w['problem']}"


def check_names(value, what: str) -> Optional[tuple]:
    """A str or a list/tuple of str as a tuple (None stays None); ArgumentError otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple, set, frozenset)) or not all(isinstance(v, str) for v in value):
        raise ArgumentError(f"{what} must be a list of strings, got {got(value)}")
    return tuple(value)


def _regex(value: str, what: str):
    try:
        return _compile_regex(value)
    except ValueError as e:
        raise ArgumentError(f"{what} '{value[:80]}': no node has that name and it is not a valid regular "
                            f"expression ({e})") from None


@functools.lru_cache(maxsize=1)
def onnx_op_types() -> frozenset:
    """Every op type the installed onnx package defines (any domain, any version): an `op_types` entry outside
    these and the model's own op types is a typo (`matmul`), not an op the model happens to lack."""
    return frozenset(s.name for s in onnx.defs.get_all_schemas_with_history())


def check_unmatched(model, sel: Selection) -> None:
    """Warnings for selectors that match no node of `model` (call on the model as loaded); an op type that is
    neither an ONNX op nor one of the model's is an ArgumentError naming the nearest."""
    nodes = [n for g in model.graph.all_graphs() for n in g.nodes]
    names = {n.name for n in nodes}
    ops = {n.op_type for n in nodes}
    sel.exclude_names = {e for e in sel.exclude if e in names}
    for e in sel.exclude:
        if e in names:
            continue
        rx = _regex(e, "exclude")
        if not any(rx.search(n) for n in names if n):
            sel.warnings.append(warning("exclude", e, "matches no node"))
    for op in sel.op_types or ():
        if op in ops:
            continue
        if op not in onnx_op_types():
            raise ArgumentError(f"op_types: '{short_text(op)}' is no ONNX op type and no node of the model has it"
                                f"{did_you_mean(op, ops | onnx_op_types())}")
        sel.warnings.append(warning("op_types", op, "matches no node"))
    for name in sel.nodes or ():
        if name not in names:
            sel.warnings.append(warning("nodes", name, "matches no node"))


def selection_rules(model, sel: Selection, first_index: int, fused=(), share=()) -> list:
    """Config rules implementing `sel` on `model` (as prepared for placement); appended after the config's own.
    `fused`: the profile's (producer op, activation op) pairs: such an activation after an included node keeps
    its output quantizer (it is the included node's output quantizer). `share`: the profile's data-movement ops
    (shares_input_encoding): one feeding an included node keeps its producer's output quantizer too."""
    fused, share = {tuple(p) for p in fused}, set(share)
    rules = []
    nodes = [n for g in model.graph.all_graphs() for n in g.nodes]
    names = {n.name for n in nodes}
    if sel.op_types is not None or sel.nodes is not None:
        ops = set(sel.op_types) if sel.op_types is not None else None
        wanted = set(sel.nodes) if sel.nodes is not None else None
        included = {id(n) for n in nodes
                    if (ops is None or n.op_type in ops) and (wanted is None or n.name in wanted)}
        next_to, alone = set(), set()
        for n in nodes:
            if id(n) in included:
                continue
            near = any(id(c) in included for v in n.outputs if v is not None for c in v.consumers()) or \
                any(v is not None and v.producer is not None and id(v.producer) in included and
                    (v.producer.op_type, n.op_type) in fused for v in n.inputs)
            (next_to if near else alone).add(n.name)
        # data movement takes its input's grid (and is not observed on its own): walk back to a real producer
        for n in nodes:
            m = n
            while m.name in next_to and m.op_type in share and m.inputs and m.inputs[0] is not None:
                p = m.inputs[0].producer
                if p is None or id(p) in included or p.name in next_to:
                    break
                alone.discard(p.name)
                next_to.add(p.name)
                m = p
        off = {"weight_quantized": False, "bias_quantized": False}
        if next_to:
            rules.append(Rule(index=first_index + len(rules), names=frozenset(next_to), updates=dict(off)))
        if alone:
            rules.append(Rule(index=first_index + len(rules), names=frozenset(alone),
                              updates=dict(off, output_quantized=False)))
    if sel.exclude:
        # NOTE: a name is a name if the model as loaded had that node (fold-batchnorm may have removed it since:
        # it must not turn into a regex matching bn10, bn11, ...)
        named = sel.exclude_names if sel.exclude_names is not None else {e for e in sel.exclude if e in names}
        exact = frozenset(named)
        if exact:
            rules.append(Rule(index=first_index + len(rules), names=exact, updates={"precision": "float32"}))
        for e in sel.exclude:
            if e not in named:
                rules.append(Rule(index=first_index + len(rules), regex=_regex(e, "exclude"),
                                  updates={"precision": "float32"}))
    return rules


def config_with_rules(config, rules: list, defaults: dict, overrides: Optional[dict] = None):
    """A copy of `config` (or a config holding `defaults`, the API arguments, when None) with `overrides` on
    its defaults (its own rules still win) and `rules` appended; the caller's config object is never changed."""
    if config is None:
        config = QuantConfig(source="<arguments>", defaults=NodeSettings(**defaults))
    else:
        config = replace(config, rules=list(config.rules), defaults=replace(config.defaults, **(overrides or {})))
    config.rules.extend(rules)
    return config


def unmatched_config_rules(model, config) -> List[dict]:
    """Warnings for the config: the settings it was read with but that are not applied (`config.warnings`,
    e.g. AIMET keys qcompiler does not use), then its own rules (from its file) that match no node."""
    if config is None:
        return []
    out = list(getattr(config, "warnings", ()))
    if not getattr(config, "rules", None):
        return out
    nodes = [n for g in model.graph.all_graphs() for n in g.nodes]
    for r in config.rules:
        if not any(r.matches(n) for n in nodes):
            out.append(warning("config rule", f"rules[{r.index}]", f"of {config.source} matches no node"))
    return out


__all__ = ["Selection", "check_unmatched", "selection_rules", "config_with_rules", "unmatched_config_rules",
           "warning", "warning_text", "check_names"]
