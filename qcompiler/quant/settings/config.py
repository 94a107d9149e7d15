"""Quantization config: AIMET quantsim JSON or our readable YAML/JSON, resolved per node into `NodeSettings`.

Resolution order for `config.settings_for(node)`: global defaults, then the AIMET `op_type.<Op>` entry for the
node's op type, then our `rules` in file order; a later rule overrides what an earlier one set (so put broad
rules first and exceptions after). A rule's `match` ANDs its selectors: `op_type` (str or list), `name` (exact
node name, str or list), `regex` (searched in the node name with RE2, a linear-time engine: a pattern
RE2 cannot compile, such as a backreference or a lookaround, is refused with one line).

Our format (unknown keys are errors: a typo must not be silently ignored):
    target: ort_cpu                           # or a profile mapping: {base: ort_cpu, wide_activation_bits: 8}
    scheme: tf_enhanced                       # min_max (= AIMET post_training_tf), tf_enhanced, percentile, ...
    weights: {bits: 8, symmetric: true, per_channel: true, per_block: null, quantized: true}
    activations: {bits: 8, symmetric: false}
    bias: {bits: 32, quantized: true}
    model_input: {quantized: true}            # false: model inputs stay float
    model_output: {quantized: true}           # only true (what qcompiler does); false is refused
    rules:
      - match: {op_type: [Softmax]}
        activations: {bits: 16}
      - match: {regex: "^/encoder/layer\\.0/"}
        keep_float: true                      # or precision: float16
      - match: {op_type: [MatMul, Gemm]}
        input_quantized: true                 # the float values it reads get quantizers (at their producer,
                                              # through data movement) even where a rule left those off
    supergroups: true | [layernorm, gelu, ...]
AIMET's format (anchors.md A; `aimet_common/quantsim_config/quantsim_config_schema.py`) is detected by its six
required keys; booleans there are the strings "True"/"False". Its unknown keys, and the settings AIMET's own
configs carry that qcompiler does not apply (`is_input_quantized: True` on an op: inputs are quantized by their
producers' output quantizers; `supergroups` op lists: fused pairs come from the target profile;
`unsigned_symmetric` with symmetric activations: symmetric grids are signed), become `config.warnings`, which
`quantize` reports (report['warnings'], a `qcompiler: warning:` line). A setting that would change the numbers
and that qcompiler cannot honour (`strict_symmetric: True`, an asymmetric bias, `supported_kernels` widths
outside 4/8/16) is a ConfigError, never ignored; `hw_version` is descriptive.
Duplicate keys are rejected in both JSON and YAML; YAML is read with a safe loader only, with nesting, node
count and alias expansion bounded (untrusted.py). Bit widths come from bitwidths.py (4, 8, 16; bias 32), numbers
must be finite, and no message quotes more than ~60 characters of a value from the file.
"""
from __future__ import annotations

import os

import copy
import math
from dataclasses import dataclass, field, replace
from typing import Optional, Union

import re2

from qcompiler.errors import ConfigError
from qcompiler.input_files import read_bounded
from qcompiler.patterns.supergroups import SUPERGROUP_KINDS
from qcompiler.quant.core.bitwidths import BIAS_BITS, FLOAT_BITS, INT_BITS, check_bits
from qcompiler.quant.core.schemes import canonical_scheme
from qcompiler.quant.settings.presets import preset_path, presets
from qcompiler.quant.settings.untrusted import (
    decode_text,
    parse_json,
    parse_yaml,
    short,
)
from qcompiler.shorten import did_you_mean, short_key, short_text

# NodeSettings fields that set a weight's grid: a rule that sets one asks for that grid
WEIGHT_GRID_KEYS = ("weight_bits", "weight_block")
AIMET_REQUIRED = ("defaults", "params", "op_type", "supergroups", "model_input", "model_output")
PRECISIONS = ("int", "float16", "float32")


@dataclass
class NodeSettings:
    """How one node is quantized (the result of resolving defaults, AIMET op_type entries and rules)."""

    weight_bits: int = 8
    weight_symmetric: bool = True
    weight_per_channel: bool = True
    weight_block: Optional[int] = None
    weight_quantized: bool = True
    bias_bits: int = 32
    bias_quantized: bool = True
    act_bits: int = 8
    act_symmetric: bool = False
    precision: str = "int"           # "int" (QDQ), "float16" or "float32" (kept float, no quantizers)
    output_quantized: bool = True
    input_quantized: bool = False    # the float values it reads get quantizers even where the producer's are off
    encoding_min: Optional[float] = None   # AIMET encoding_constraints: fixed output range
    encoding_max: Optional[float] = None
    matched_rules: tuple = ()        # indices of our rules that matched, for the report
    decided_by: str = ""             # the origin of the last matched rule, when not the user's
    weights_ruled: bool = False      # a matched rule set the weights' grid (a width asked for)

    @property
    def keep_float(self) -> bool:
        return self.precision != "int"


@dataclass
class Rule:
    """One `rules:` entry: selectors ANDed, then a partial NodeSettings update (field name -> value)."""

    index: int
    op_types: Optional[tuple] = None
    names: Optional[tuple] = None
    regex: Optional[object] = None   # a compiled RE2 pattern (see _compile_regex)
    updates: dict = field(default_factory=dict)
    origin: str = ""                 # who made the rule when not the user (a reason names it: "--max-drop")

    def matches(self, node) -> bool:
        if self.op_types is not None and node.op_type not in self.op_types:
            return False
        name = getattr(node, "name", "") or ""
        if self.names is not None and name not in self.names:
            return False
        if self.regex is not None and not self.regex.search(name):
            return False
        return True


@dataclass
class QuantConfig:
    """A parsed config: defaults, per-op-type overrides (AIMET) and ordered rules (ours)."""

    source: str = "<defaults>"
    format: str = "qcompiler"        # or "aimet"
    target: Union[str, dict, None] = None   # a name, a profile file or a profile mapping
    scheme: Optional[str] = None     # None: the caller's default (min_max), so a config never changes it silently
    defaults: NodeSettings = field(default_factory=NodeSettings)
    op_type: dict = field(default_factory=dict)      # op type -> partial NodeSettings updates
    rules: list = field(default_factory=list)
    supergroups: Union[bool, list] = True            # True/False, or names (ours), or op lists (AIMET)
    model_input_quantized: bool = True
    unsigned_symmetric: bool = False                 # AIMET; see the module docstring
    hw_version: Optional[str] = None                 # AIMET; descriptive
    supported_kernels: Optional[list] = None         # AIMET; checked (bit widths), descriptive
    weight_only: Optional[bool] = None               # ours: activations float, weights narrow (--weight-only)
    warnings: list = field(default_factory=list)     # selection.warning dicts: settings read but not applied

    def settings_for(self, node) -> NodeSettings:
        """Settings for `node` (anything with `op_type` and `name`): defaults, op_type entry, then rules."""
        # NOTE: one `replace` with the updates merged in order (later rules win), not one per rule: placement
        # resolves every node several times per plan, and the mixed-precision search builds a plan per candidate
        merged = dict(self.op_type.get(node.op_type) or {})
        matched, by, ruled = [], "", False
        for rule in self.rules:
            if rule.matches(node):
                merged.update(rule.updates)
                matched.append(rule.index)
                by = rule.origin
                ruled = ruled or any(k in rule.updates for k in WEIGHT_GRID_KEYS)
        return replace(self.defaults, **merged, matched_rules=tuple(matched), decided_by=by, weights_ruled=ruled)


# --- file reading ---------------------------------------------------------------------------------------
def warning(kind: str, value: str, problem: str) -> dict:
    """One structured warning: the CLI names its own flag for `kind`, the API its argument."""
    return {"kind": kind, "value": value, "problem": problem}


def _read_text(path: str, what: str) -> str:
    """The file's UTF-8 text (a regular file within `what`'s size bound); errors name the file."""
    return decode_text(read_bounded(path, what, ConfigError), path, what)


def load_json_strict(path: str, what: str = "config"):
    """Parse JSON rejecting duplicate keys (json keeps the last one silently); errors name the file."""
    return parse_json_strict(_read_text(path, what), path)


def parse_json_strict(text: str, path: str):
    return parse_json(text, path, ConfigError)


def _parse_yaml(text: str, path: str):
    return parse_yaml(text, path, ConfigError)


MAX_REGEX_CHARS = 4096


def _compile_regex(pattern: str):
    """An RE2 pattern (linear-time search: `^(a+)+$` on a 5000-character name takes microseconds)."""
    if len(pattern) > MAX_REGEX_CHARS:
        raise ValueError(f"pattern of {len(pattern)} characters (at most {MAX_REGEX_CHARS})")
    opts = re2.Options()
    opts.log_errors = False      # RE2 would log the failure to stderr ahead of our one line
    opts.max_mem = 32 << 20
    try:
        return re2.compile(pattern, opts)
    except Exception as e:  # noqa: BLE001 - re2.error: unsupported syntax (backreference, lookaround) or too big
        msg = e.args[0] if e.args else e
        msg = msg.decode("utf-8", "replace") if isinstance(msg, bytes) else str(msg)
        raise ValueError(f"{msg[:100]} (RE2 syntax: no backreferences or lookarounds)") from None


def load_config(path: str) -> QuantConfig:
    """Read a config file (JSON or YAML), detect its format (AIMET has the six required keys) and parse it.
    A built-in preset's name (qcompiler/quant/settings/presets/NAME.yaml, e.g. `w8a8`) is read from the package."""
    path = preset_path(path)
    if isinstance(path, str) and not os.path.lexists(path) and os.sep not in path and "." not in path:
        raise ConfigError(f"{short_text(path)}: no such file, and no built-in preset of that name"
                          f"{did_you_mean(path, presets())} (presets: {', '.join(presets())})")
    text = _read_text(path, "config")
    if path.lower().endswith(".json") or text.lstrip().startswith("{"):
        data = parse_json_strict(text, path)
    else:
        data = _parse_yaml(text, path)
    return parse_config(data, source=path)


def parse_config(data, source: str = "<dict>") -> QuantConfig:
    """A QuantConfig from already-parsed data (AIMET if it has `defaults`, `params` or `op_type`)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: config must be a mapping, got {short(data)}")
    if any(k in data for k in ("defaults", "params", "op_type")):
        missing = [k for k in AIMET_REQUIRED if k not in data]
        if missing:
            raise ConfigError(f"{source}: AIMET quantsim config lacks required key '{missing[0]}'")
        return _parse_aimet(data, source)
    return _parse_ours(data, source)


# --- our format ------------------------------------------------------------------------------------------
_OURS_TOP = ("target", "scheme", "weights", "activations", "bias", "rules", "supergroups", "model_input",
             "model_output", "weight_only")
_SECTION_FIELDS = {
    "weights": {"bits": "weight_bits", "symmetric": "weight_symmetric", "per_channel": "weight_per_channel",
                "per_block": "weight_block", "quantized": "weight_quantized"},
    "activations": {"bits": "act_bits", "symmetric": "act_symmetric"},
    "bias": {"bits": "bias_bits", "quantized": "bias_quantized"},
}
_RULE_KEYS = ("match", "weights", "activations", "bias", "keep_float", "precision", "output_quantized",
              "input_quantized", "encoding_constraints")
# keys a user may expect from AIMET's vocabulary that qcompiler does not implement: refused with the reason
_UNSUPPORTED: dict = {}


class _Ctx:
    def __init__(self, source):
        self.source = source

    def err(self, where: str, msg: str) -> ConfigError:
        return ConfigError(f"{self.source}: {where}: {msg}")

    def mapping(self, v, where):
        if not isinstance(v, dict):
            raise self.err(where, f"expected a mapping, got {short(v)}")
        return v

    def known(self, d: dict, allowed, where):
        for k in d:
            if k in _UNSUPPORTED and k not in allowed:
                raise self.err(f"{where}.{k}" if where else k, _UNSUPPORTED[k])
            if k not in allowed:
                raise self.err(f"{where}.{_key(k)}" if where else _key(k),
                               f"unknown key {short(k)} (allowed: {', '.join(allowed)})")

    def boolean(self, v, where):
        if isinstance(v, bool):
            return v
        if v in ("True", "False"):  # AIMET writes booleans as strings
            return v == "True"
        raise self.err(where, f"expected true/false, got {short(v)}")

    def bits(self, v, where, allowed=INT_BITS):
        return check_bits(v, f"{self.source}: {where}", allowed)

    def number(self, v, where):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self.err(where, f"expected a number, got {short(v)}")
        try:
            f = float(v)
        except OverflowError:
            f = math.inf
        if not math.isfinite(f):
            raise self.err(where, f"expected a finite number, got {short(v)}")
        return f


_key = short_key   # a key from the file as part of a `where` path (qcompiler/shorten.py)


def _section(ctx: _Ctx, name: str, value, where: str) -> dict:
    d = ctx.mapping(value, where)
    names = _SECTION_FIELDS[name]
    ctx.known(d, tuple(names), where)
    out = {}
    for k, v in d.items():
        w = f"{where}.{k}"
        if k == "bits":
            out[names[k]] = ctx.bits(v, w, BIAS_BITS if name == "bias" else INT_BITS)
        elif k == "per_block":
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
                raise ctx.err(w, f"per_block must be a positive block size or null, got {short(v)}")
            out[names[k]] = v
        else:
            out[names[k]] = ctx.boolean(v, w)
    return out


def _str_list(ctx, v, where) -> tuple:
    if isinstance(v, str):
        return (v,)
    if isinstance(v, list) and v and all(isinstance(x, str) for x in v):
        return tuple(v)
    raise ctx.err(where, f"expected a string or a non-empty list of strings, got {short(v)}")


def _constraints(ctx, v, where) -> dict:
    d = ctx.mapping(v, where)
    ctx.known(d, ("min", "max"), where)
    out = {}
    if "min" in d:
        out["encoding_min"] = ctx.number(d["min"], f"{where}.min")
    if "max" in d:
        out["encoding_max"] = ctx.number(d["max"], f"{where}.max")
    if "encoding_min" in out and "encoding_max" in out and out["encoding_min"] >= out["encoding_max"]:
        raise ctx.err(where, "min must be below max")
    return out


def _scheme(ctx, v, where) -> str:
    if not isinstance(v, str):
        raise ctx.err(where, f"expected a scheme name, got {short(v)}")
    try:
        return canonical_scheme(v)
    except ConfigError as e:
        raise ctx.err(where, str(e)) from None


def _parse_rule(ctx: _Ctx, i: int, r) -> Rule:
    where = f"rules[{i}]"
    r = ctx.mapping(r, where)
    ctx.known(r, _RULE_KEYS, where)
    if "match" not in r:
        raise ctx.err(where, "a rule needs 'match'")
    m = ctx.mapping(r["match"], f"{where}.match")
    ctx.known(m, ("op_type", "name", "regex"), f"{where}.match")
    if not m:
        raise ctx.err(f"{where}.match", "needs at least one of op_type, name, regex")
    rule = Rule(index=i)
    if "op_type" in m:
        rule.op_types = _str_list(ctx, m["op_type"], f"{where}.match.op_type")
    if "name" in m:
        rule.names = _str_list(ctx, m["name"], f"{where}.match.name")
    if "regex" in m:
        if not isinstance(m["regex"], str):
            raise ctx.err(f"{where}.match.regex", f"expected a string, got {short(m['regex'])}")
        try:
            rule.regex = _compile_regex(m["regex"])
        except ValueError as e:
            raise ctx.err(f"{where}.match.regex", f"invalid regular expression: {e}") from None
    upd = {}
    for sec in ("weights", "activations", "bias"):
        if sec in r:
            upd.update(_section(ctx, sec, r[sec], f"{where}.{sec}"))
    if "keep_float" in r:
        upd["precision"] = "float32" if ctx.boolean(r["keep_float"], f"{where}.keep_float") else "int"
    if "precision" in r:
        p = r["precision"]
        if not isinstance(p, str) or p not in PRECISIONS:
            raise ctx.err(f"{where}.precision", f"unknown precision {short(p)} (allowed: {', '.join(PRECISIONS)})")
        if r.get("keep_float") is True and p == "int":
            raise ctx.err(where, "keep_float: true contradicts precision: int")
        upd["precision"] = p
    if "output_quantized" in r:
        upd["output_quantized"] = ctx.boolean(r["output_quantized"], f"{where}.output_quantized")
    if "input_quantized" in r:   # placement/input_quantizers.py; false would need per-use quantizers
        if not ctx.boolean(r["input_quantized"], f"{where}.input_quantized"):
            raise ctx.err(f"{where}.input_quantized", "false is not supported: a node's inputs are quantized by "
                                                      "their producers' output quantizers (set output_quantized "
                                                      "on the producer)")
        upd["input_quantized"] = True
    if "encoding_constraints" in r:
        upd.update(_constraints(ctx, r["encoding_constraints"], f"{where}.encoding_constraints"))
    rule.updates = upd
    return rule


def _parse_ours(data: dict, source: str) -> QuantConfig:
    ctx = _Ctx(source)
    ctx.known(data, _OURS_TOP, "")
    cfg = QuantConfig(source=source, format="qcompiler")
    if "target" in data:   # a name, a profile file, or a profile as a mapping ({base: ort_cpu, ...})
        if data["target"] is not None and not isinstance(data["target"], (str, dict)):
            raise ctx.err("target", f"expected a target name or a profile mapping, got {short(data['target'])}")
        cfg.target = data["target"]
    if "scheme" in data:
        cfg.scheme = _scheme(ctx, data["scheme"], "scheme")
    if "weight_only" in data:
        if not isinstance(data["weight_only"], bool):
            raise ctx.err("weight_only", f"expected true/false, got {short(data['weight_only'])}")
        cfg.weight_only = data["weight_only"]
    upd = {}
    for sec in ("weights", "activations", "bias"):
        if sec in data:
            upd.update(_section(ctx, sec, data[sec], sec))
    cfg.defaults = replace(cfg.defaults, **upd)
    for key in ("model_input", "model_output"):
        if key in data:
            d = ctx.mapping(data[key], key)
            ctx.known(d, ("quantized",), key)
            if "quantized" in d:
                q = ctx.boolean(d["quantized"], f"{key}.quantized")
                if key == "model_input":
                    cfg.model_input_quantized = q
                elif not q:
                    raise ctx.err("model_output.quantized", "false is not supported: each output is quantized "
                                  "as its producer's settings say (use a rule with output_quantized: false)")
    rules = data.get("rules") or []
    if not isinstance(rules, list):
        raise ctx.err("rules", f"expected a list of rules, got {short(rules)}")
    cfg.rules = [_parse_rule(ctx, i, r) for i, r in enumerate(rules)]
    if "supergroups" in data:
        sg = data["supergroups"]
        if isinstance(sg, bool):
            cfg.supergroups = sg
        elif isinstance(sg, list) and all(isinstance(x, str) for x in sg):
            for i, name in enumerate(sg):
                if name not in SUPERGROUP_KINDS:
                    raise ctx.err(f"supergroups[{i}]", f"unknown supergroup {short(name, 40)} "
                                                       f"(known: {', '.join(SUPERGROUP_KINDS)})")
            cfg.supergroups = list(sg)
        else:
            raise ctx.err("supergroups", f"expected true/false or a list of supergroup names, got {short(sg)}")
    return cfg


# --- AIMET format ----------------------------------------------------------------------------------------
def _ignored(cfg, where: str, why: str) -> None:
    """A setting read but not applied: a structured warning `quantize` reports (never dropped silently)."""
    cfg.warnings.append(warning("config key", where, f"of {cfg.source}: {why}"))


_INPUT_Q = "True is not applied (qcompiler quantizes an op's inputs through its producers' " \
           "output quantizers)"


def _aimet_flags(ctx, cfg, d: dict, where: str, mapping: dict, ops: bool = False) -> dict:
    out = {}
    for k, v in d.items():
        if ops and k == "is_input_quantized":
            if ctx.boolean(v, f"{where}.{k}"):
                _ignored(cfg, f"{where}.{k}", _INPUT_Q)
        elif k in mapping:
            out[mapping[k]] = ctx.boolean(v, f"{where}.{k}")
        else:
            _ignored(cfg, f"{where}.{_key(k)}", "unknown AIMET key, ignored")
    return out


def _aimet_kernels(ctx, v, where) -> list:
    """AIMET `supported_kernels`: [{"activation": {"bitwidth": N, "dtype": "int"|"float"}, "param": {...}}];
    bit widths are checked as every other bit width (bitwidths.py), so `bitwidth: 2` is the error
    `--weight-bits 2` gives."""
    if not isinstance(v, list):
        raise ctx.err(where, f"expected a list, got {short(v)}")
    for i, k in enumerate(v):
        w = f"{where}[{i}]"
        k = ctx.mapping(k, w)
        ctx.known(k, ("activation", "param"), w)
        for part, d in k.items():
            d = ctx.mapping(d, f"{w}.{part}")
            ctx.known(d, ("bitwidth", "dtype"), f"{w}.{part}")
            dtype = d.get("dtype", "int")
            if dtype not in ("int", "float"):
                raise ctx.err(f"{w}.{part}.dtype", f"expected 'int' or 'float', got {short(dtype)}")
            if "bitwidth" in d:
                ctx.bits(d["bitwidth"], f"{w}.{part}.bitwidth", INT_BITS if dtype == "int" else FLOAT_BITS)
    return copy.deepcopy(v)


_PARAM_FLAGS = {"weight": {"is_quantized": "weight_quantized", "is_symmetric": "weight_symmetric"},
                "bias": {"is_quantized": "bias_quantized", "is_symmetric": None}}


def _aimet_params(ctx, cfg, d, where) -> dict:
    d = ctx.mapping(d, where)
    out = {}
    for pname, pd in d.items():
        w = f"{where}.{_key(pname)}"
        pd = ctx.mapping(pd, w)
        if pname not in _PARAM_FLAGS:
            _ignored(cfg, w, "parameter kind not used by qcompiler, ignored")
            continue
        for k, v in pd.items():
            attr = _PARAM_FLAGS[pname].get(k, "?")
            if attr == "?":
                _ignored(cfg, f"{w}.{_key(k)}", "unknown AIMET key, ignored")
            elif attr is not None:
                out[attr] = ctx.boolean(v, f"{w}.{_key(k)}")
            elif not ctx.boolean(v, f"{w}.{_key(k)}"):   # bias is_symmetric: False
                raise ctx.err(f"{w}.{_key(k)}", "False is not supported: biases are int32 on a symmetric grid "
                                                "(scale = input scale x weight scale)")
    return out


def _parse_aimet(data: dict, source: str) -> QuantConfig:
    ctx = _Ctx(source)
    cfg = QuantConfig(source=source, format="aimet")
    for k in data:
        if k not in AIMET_REQUIRED:
            _ignored(cfg, _key(k), "unknown top-level AIMET key, ignored")
    d = ctx.mapping(data["defaults"], "defaults")
    # AIMET defaults when a key is absent: outputs quantized, inputs not, params quantized (asymmetric).
    s = NodeSettings(weight_symmetric=False, weight_per_channel=False, output_quantized=True)
    upd = {}
    for k, v in d.items():
        w = f"defaults.{_key(k)}"
        if k == "ops":
            upd.update(_aimet_flags(ctx, cfg, ctx.mapping(v, w), w, {
                "is_output_quantized": "output_quantized", "is_symmetric": "act_symmetric"}, ops=True))
        elif k == "params":
            upd.update(_aimet_flags(ctx, cfg, ctx.mapping(v, w), w, {
                "is_quantized": "weight_quantized", "is_symmetric": "weight_symmetric"}))
        elif k == "strict_symmetric":
            if ctx.boolean(v, w):
                raise ctx.err(w, "True is not supported: QuantizeLinear saturates a signed grid at -2^(b-1) "
                                 "(-128 for 8 bits), not at -(2^(b-1) - 1)")
        elif k == "unsigned_symmetric":
            cfg.unsigned_symmetric = ctx.boolean(v, w)
        elif k == "per_channel_quantization":
            upd["weight_per_channel"] = ctx.boolean(v, w)
        elif k == "hw_version":
            if not isinstance(v, str):
                raise ctx.err(w, f"expected a string, got {short(v)}")
            cfg.hw_version = v
        elif k == "supported_kernels":
            cfg.supported_kernels = _aimet_kernels(ctx, v, w)
        else:
            _ignored(cfg, w, "unknown AIMET key, ignored")
    # params section: defaults for parameter kinds (weight, bias)
    upd.update(_aimet_params(ctx, cfg, data["params"], "params"))
    cfg.defaults = replace(s, **upd)
    ops = ctx.mapping(data["op_type"], "op_type")
    for op, od in ops.items():
        w = f"op_type.{_key(op)}"
        od = ctx.mapping(od, w)
        o = {}
        for k, v in od.items():
            kw = f"{w}.{_key(k)}"
            if k == "is_input_quantized":
                if ctx.boolean(v, kw):
                    _ignored(cfg, kw, _INPUT_Q)
            elif k == "is_output_quantized":
                o["output_quantized"] = ctx.boolean(v, kw)
            elif k == "is_symmetric":
                o["act_symmetric"] = ctx.boolean(v, kw)
            elif k == "per_channel_quantization":
                o["weight_per_channel"] = ctx.boolean(v, kw)
            elif k == "params":
                o.update(_aimet_params(ctx, cfg, v, kw))
            elif k == "encoding_constraints":
                o.update(_constraints(ctx, v, kw))
            elif k == "supported_kernels":
                _aimet_kernels(ctx, v, kw)   # kernel lists describe the target: checked, not applied
            else:
                _ignored(cfg, kw, "unknown AIMET key, ignored")
        cfg.op_type[op] = o
    sgs = data["supergroups"]
    if not isinstance(sgs, list):
        raise ctx.err("supergroups", "expected a list of {\"op_list\": [...]}")
    groups = []
    for i, g in enumerate(sgs):
        w = f"supergroups[{i}]"
        g = ctx.mapping(g, w)
        ol = g.get("op_list")
        if not isinstance(ol, list) or len(ol) < 2 or not all(isinstance(x, str) for x in ol):
            raise ctx.err(f"{w}.op_list", "expected a list of at least two op types")
        for k in g:
            if k != "op_list":
                _ignored(cfg, f"{w}.{_key(k)}", "unknown AIMET key, ignored")
        groups.append(list(ol))
    cfg.supergroups = groups
    if groups:
        _ignored(cfg, "supergroups", "AIMET op lists are not applied: the target profile (--target) decides "
                                     "which op+activation pairs fuse, and qcompiler's own supergroups are all on")
    mi = ctx.mapping(data["model_input"], "model_input")
    cfg.model_input_quantized = False
    for k, v in mi.items():
        if k == "is_input_quantized":
            cfg.model_input_quantized = ctx.boolean(v, f"model_input.{k}")
        else:
            _ignored(cfg, f"model_input.{_key(k)}", "unknown AIMET key, ignored")
    mo = ctx.mapping(data["model_output"], "model_output")
    for k, v in mo.items():
        if k == "is_output_quantized":
            # True: outputs quantized (what qcompiler does, unless the producer's settings say otherwise);
            # False or absent: left to the producers' settings (the same thing)
            ctx.boolean(v, f"model_output.{k}")
        else:
            _ignored(cfg, f"model_output.{_key(k)}", "unknown AIMET key, ignored")
    if cfg.unsigned_symmetric and (cfg.defaults.act_symmetric or
                                   any(o.get("act_symmetric") for o in cfg.op_type.values())):
        _ignored(cfg, "defaults.unsigned_symmetric", "True is not applied: symmetric activation grids are signed "
                                                     "(zero point 0) even for non-negative tensors")
    return cfg


__all__ = ["QuantConfig", "NodeSettings", "Rule", "load_config", "parse_config", "load_json_strict"]
