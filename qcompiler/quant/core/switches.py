"""The switches of `quantize()` / `qcompiler quantize`: one declaration each, the one source of every fact about it.

A switch is a keyword of `quantize()` that changes what quantization does (not the model, the data or the
instruments). Its entry in SWITCHES holds the keyword and its default, the check every value goes through (one
ArgumentError line naming the keyword), the text of its API documentation, its CLI flag (declaration, click type,
help, how the flag's value becomes the keyword's), the pass it asks for and when, and its config-file key when a
config can set the same thing. Everything else is derived from the table:

- `qcompiler quantize`'s options (`cli_quantize.py`: `switch_options`), in table order;
- `quantize()`'s argument checks (`check_switches`) and the keyword section of its docstring (`api_doc`);
- the fields of `QuantSettings` (context.py: one per switch, holding its checked value);
- `pipeline.SWITCHES` / `pipeline_for` (the passes a switch adds, like a `--recipe` entry).

`quantize()` keeps its keywords written out, so `help()`, `inspect.signature` and an IDE show them;
tests/quant/test_switch_table.py checks that they are exactly the table's names and defaults, that each switch
has a flag (or says why not), a row in docs/cli.md and a check, and that a bad value reads the same from each door: the
CLI runs the same `check_switches` before it reads a file, so `--weight-bits 7` and `weight_bits=7` give the same
line, and a config key sets the same thing with the same words after the file and the key (bit widths, scheme).
Three flags keep a click type built from the table (`--optimize` and `--untaken-branches`: click.Choice of the
table's tuple; `--smoothquant-alpha`: the same open range): the command line refuses their bad values while
parsing, in click's form, naming the flag.

Adding a switch: one entry here, one keyword in `quantize()`'s signature (the test names a missing one), then
`python -m qcompiler.cli_reference docs/cli.md` (the command-line reference is written from this table; a test
checks it); the pass reads it as `ctx.settings.<name>`.
"""
from __future__ import annotations

import math
import os
import textwrap
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

import click
import numpy as np

from qcompiler.arguments import (
    got,
    require_bool,
    require_choice,
    require_int,
    require_path,
)
from qcompiler.errors import ArgumentError
from qcompiler.quant.core.bitwidths import INT_BITS, check_bits
from qcompiler.quant.core.objectives import OPTIMIZE
from qcompiler.quant.core.schemes import canonical_scheme
from qcompiler.quant.runtime.executor import check_ray
from qcompiler.quant.settings.selection import check_names

# `--untaken-branches`: what an If branch calibration never took gets (body_probe.py, untaken_branches.py)
UNTAKEN_BRANCHES = ("float", "mirror")

_SAME = object()   # a Flag's default: the same as the API's
_BITS = "{" + ",".join(map(str, INT_BITS)) + "}"     # the allowed bit widths, as the help shows them


@dataclass(frozen=True)
class Flag:
    """The switch's `qcompiler quantize` option. `decls`: click's declarations (the switch's name is added as the
    parameter name); `type`: click's type, or a zero-argument factory of it (click is imported by the CLI only);
    `to_api`: the option's value -> the keyword's value (default: as is)."""

    decls: Tuple[str, ...]
    help: str = ""
    type: Any = None
    default: Any = _SAME
    metavar: Optional[str] = None
    show_default: bool = False
    is_flag: bool = False
    multiple: bool = False
    to_api: Optional[Callable[[Any], Any]] = None

    @property
    def name(self) -> str:
        """The option as a user types it (`--weight-bits`; the first of a `--x/--no-x` pair)."""
        return self.decls[0].split("/")[0]

    @property
    def names(self) -> Tuple[str, ...]:
        """Every spelling of the option (`--per-channel`, `--per-tensor`)."""
        return tuple(n for d in self.decls for n in d.split("/") if n.startswith("-"))


def _given(value) -> bool:
    return value not in (None, False)


@dataclass(frozen=True)
class Switch:
    """One switch. `check(value) -> value`: the checked value `QuantSettings` keeps (raises ArgumentError naming
    `name`); `doc`: its paragraph in `quantize()`'s docstring; `flag`: its CLI option, or None with the reason in
    `api_only`; `enables`: the pass it adds when `enabled(value)`; `configures`: the passes whose work it changes
    (documentation; registered names, checked by the tests); `config_key`: the config-file key that sets
    the same thing (a dotted path of our YAML format); `setting_default`: QuantSettings' default when it is not
    check(default) (the value is resolved later, e.g. the scheme from a config)."""

    name: str
    default: Any
    check: Callable[[Any], Any]
    doc: str
    flag: Optional[Flag] = None
    api_only: str = ""
    enables: str = ""
    enabled: Callable[[Any], bool] = _given
    configures: Tuple[str, ...] = ()
    config_key: str = ""
    setting_default: Any = _SAME

    def settings_default(self):
        return self.check(self.default) if self.setting_default is _SAME else self.setting_default

    @property
    def cli_default(self):
        return self.default if self.flag is None or self.flag.default is _SAME else self.flag.default


# --- checks: each returns the value QuantSettings keeps, or raises one ArgumentError line naming the keyword ----

def _optional(check):
    """`check`, with None passing through (the keyword's "not given")."""
    def run(value, what):
        return None if value is None else check(value, what)
    return run


def _bool(value, what):
    return require_bool(value, what)


def _path(value, what):
    require_path(value, what)
    return value


def _choice(choices):
    def run(value, what):
        return require_choice(value, what, choices)
    return run


def _bits(value, what):
    return check_bits(value, what, error=ArgumentError)


def _config(value, what):
    if value is not None and not hasattr(value, "settings_for"):    # a QuantConfig passes as it is
        _path(value, what)
    return value


def _target(value, what):
    if value is not None and not isinstance(value, (str, dict, os.PathLike)):
        raise ArgumentError(f"{what} must be a profile name, a profile YAML path or a dict, got {got(value)}")
    return value


def _scheme(value, what):
    if not isinstance(value, str):
        raise ArgumentError(f"{what} must be a scheme name (e.g. 'min_max'), got {got(value)}")
    canonical_scheme(value, error=ArgumentError)
    return value        # as given: _context resolves it with the config's (qcompiler/quant/core/schemes.py)


def _block(value, what):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(f"block size {got(value)}: must be a positive number of elements")
    return value


def _names(value, what):
    return check_names(value, what)


def _pass_list(value, what):
    """A comma list of pass names, or a list of names / pass objects (unknown names: build_pipeline)."""
    if not isinstance(value, (str, list, tuple)):
        raise ArgumentError(f"{what} must be a comma list or a list of pass names, got {got(value)}")
    return value


def _int(lo=None, hi=None):
    def run(value, what):
        return require_int(value, what, lo=lo, hi=hi)
    return run


DEFAULT_MIN_SQNR_DB = 15.0


def check_min_sqnr(value) -> float:
    """`min_sqnr=` of the API: None -> the default floor; a real number of dB (-inf: the net and gate off)."""
    if value is None:
        return DEFAULT_MIN_SQNR_DB
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or math.isnan(float(value)) or float(value) == float("inf") or abs(float(value)) > 1000 \
            and float(value) != float("-inf"):
        raise ArgumentError(f"min_sqnr must be a number of dB (e.g. 15), got {got(value)}")
    return float(value)


DEFAULT_LATENCY_BUDGET_DB = 1.0


def check_latency_budget(value) -> float:
    """`latency_budget_db=` of the API: None -> DEFAULT_LATENCY_BUDGET_DB; a finite number of dB >= 0."""
    if value is None:
        return DEFAULT_LATENCY_BUDGET_DB
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not math.isfinite(float(value)) or not 0 <= float(value) <= 100:
        raise ArgumentError(f"latency_budget_db must be a number of dB between 0 and 100, got {got(value)}")
    return float(value)


def parse_max_drop(value):
    """0.01, "0.01" or "1%" -> 0.01; None -> None. A budget is a fraction in (0, 1)."""
    if value is None:
        return None
    v = value
    if isinstance(v, str):
        t = v.strip()
        try:
            v = float(t[:-1]) / 100.0 if t.endswith("%") else float(t)
        except ValueError:
            raise ArgumentError(f"max_drop must be a fraction (0.01) or a percentage ('1%'), got {got(value)}") \
                from None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)) \
            or not 0 < float(v) < 1:
        raise ArgumentError(f"max_drop must be a fraction in (0, 1) such as 0.01, or '1%', got {got(value)}")
    return float(v)


def _alpha(value, what):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) < 1.0:
        raise ArgumentError(f"{what} must be a number between 0 and 1 (exclusive), got {got(value)}")
    return float(value)


def _latency_budget(value, what):
    return check_latency_budget(value)


def _min_sqnr(value, what):
    return check_min_sqnr(value)


def _max_drop(value, what):
    return parse_max_drop(value)


def _ray(value, what):
    return check_ray(value)


def _metric(value, what):
    if value is not None and not callable(value):
        raise ArgumentError(f"{what} must be a callable metric(outputs, reference) -> score, got {got(value)}")
    return value


def _executor(value, what):
    if value is not None and not callable(getattr(value, "map", None)):
        raise ArgumentError(f"{what} must have map(fn, items), got {got(value)}")
    return value


def _check(fn, name):
    """The switch's check with its keyword bound as the name its message gives."""
    def check(value):
        return fn(value, name)
    check.__name__ = f"check_{name}"
    return check


# --- CLI conversions --------------------------------------------------------------------------------------

def _path_type():
    return click.Path()


def _choice_type(choices):
    def make():
        return click.Choice(list(choices))
    return make


def _alpha_type():
    return click.FloatRange(0.0, 1.0, min_open=True, max_open=True)


def _list_or_none(values):
    return list(values) or None


def _op_types(text):
    if text is None:
        return None
    ops = [t.strip() for t in text.split(",") if t.strip()]
    if not ops:
        raise click.BadParameter("expected a comma list of op types, e.g. Conv,MatMul", param_hint="--op-types")
    return ops


def _true_or_none(flag: bool):
    return True if flag else None


# --- the table ---------------------------------------------------------------------------------------------

def _switch(name, default, check, doc, flag=None, **kw) -> Switch:
    return Switch(name=name, default=default, check=_check(check, name), doc=doc, flag=flag, **kw)


SWITCHES: Tuple[Switch, ...] = (
    # --- files beside the model and the data ---
    _switch("config", None, _config,
            "a path or a QuantConfig (when given, its settings replace the per_channel/weight_bits/act_bits "
            "arguments)",
            Flag(("--config",), "AIMET quantsim JSON or qcompiler YAML/JSON config, or a preset's name (w8a8, "
                 "w4a16)", type=_path_type, metavar="FILE|PRESET"),
            configures=("place", "assign-encodings")),
    # NOTE: before max_drop: two passes a switch adds after the same pass run in table order (load-encodings,
    # then mixed-precision, both after place)
    _switch("load_encodings", None, _optional(_path),
            "an AIMET encodings file whose encodings are frozen; everything else is calibrated (the "
            "`load-encodings` pass)",
            Flag(("--load-encodings",), "AIMET encodings to freeze; the rest is calibrated", type=_path_type,
                 metavar="FILE"),
            enables="load-encodings",
            configures=("load-encodings",)),
    # --- the grid ---
    _switch("target", None, _target,
            "the target profile: a name (ort_cpu, trt, qnn_htp, aimet), a profile YAML path or a dict; None: the "
            "config's target, else ort_cpu",
            Flag(("--target",), "backend profile: ort_cpu (default), trt, qnn_htp, aimet (encodings for AIMET's "
                 "default config), or a profile YAML", default=None, metavar="NAME|FILE"),
            config_key="target"),
    _switch("scheme", None, _optional(_scheme),
            "the calibration scheme or one of its aliases (qcompiler/quant/core/schemes.py); None: the config's, else min_max",
            Flag(("--scheme",), "min_max (default; aliases post_training_tf, tf), tf_enhanced "
                 "(post_training_tf_enhanced), percentile, entropy (kl), mse", metavar="NAME"),
            config_key="scheme", setting_default="min_max",
            configures=("calibrate", "assign-encodings", "mixed-precision")),
    _switch("per_channel", None, _optional(_bool),
            "weights per output channel (True) or per tensor (None: per channel; weight-only: blocks of "
            "weight_block, and True asks for one block over each weight's whole reduction axis)",
            Flag(("--per-channel/--per-tensor",), "weights per output channel (default) or per tensor; with "
                 "--weight-only and no --block-size, --per-channel is one block over the whole reduction axis",
                 default=None),
            config_key="weights.per_channel",
            configures=("place", "cle", "plan-weights")),
    _switch("weight_bits", 8, _bits, "weight grid bits (4, 8 or 16; qcompiler/quant/core/bitwidths.py)",
            Flag(("--weight-bits",), "weight grid bits", type=int, show_default=True, metavar=_BITS),
            config_key="weights.bits",
            configures=("place", "cle")),
    _switch("act_bits", 8, _bits, "activation grid bits (4, 8 or 16)",
            Flag(("--act-bits",), "activation grid bits", type=int, show_default=True, metavar=_BITS),
            config_key="activations.bits",
            configures=("calibrate", "place", "cle")),
    _switch("weight_block", None, _optional(_block),
            "per-block weight scales of this many elements along the reduction axis (placement.block_axis; "
            "opset 21)",
            Flag(("--block-size",), "per-block weight scales: this many elements along each weight's reduction "
                 "axis (MatMul K); opset 21 DequantizeLinear block_size", type=int, metavar="N"),
            config_key="weights.per_block",
            configures=("place", "cle")),
    _switch("weight_only", False, _bool,
            "activations stay float; the weights of MatMul/Gemm (and embedding Gathers where the target has a "
            "kernel) become weight_bits-bit blocks, run as MatMulNBits/GatherBlockQuantized on ort_cpu and as a "
            "blocked DequantizeLinear on trt (the profile's weight_only form); round-to-nearest needs no "
            "calibration data (calib=None)",
            Flag(("--weight-only",), "activations stay float; MatMul/Gemm weights and embeddings become "
                 "--weight-bits blocks of --block-size (default 32 at 4 bits): MatMulNBits and "
                 "GatherBlockQuantized on ort_cpu, blocked DequantizeLinear on trt; --calib is optional "
                 "(round-to-nearest) unless --recipe gptq/awq", is_flag=True),
            config_key="weight_only",
            configures=("plan-weights", "weight-grid", "write-weights")),
    _switch("head_bits", None, _optional(_bits),
            "weight-only: the bits of the model's ends, the head that writes the logits and the token embedding; "
            "None: 8 when weight_bits is below 8 (they carry most of a 4-bit model's error)",
            Flag(("--head-bits",), "weight-only: bits of the logits head and the token embedding (default: 8 "
                 "when --weight-bits is 4)", type=int, metavar=_BITS),
            configures=("plan-weights", "measure-head-bits")),
    _switch("accuracy_level", None, _optional(_int(0, 4)),
            "MatMulNBits' accuracy_level for weight-only MatMuls (None: 0 under optimize='accuracy', else the "
            "target's, 4 on ort_cpu: int8 "
            "activations inside the kernel, checked per MatMul on the calibration data; 0: float)",
            Flag(("--accuracy-level",), "weight-only MatMulNBits accuracy_level 0-4 (default: 0 under --optimize "
                 "accuracy, else the target's: ort_cpu 4, a MatMul whose output level 4 moves too much on the "
                 "calibration data gets 0; 8-bit ones stay 4 at 0 unless --optimize accuracy)",
                 type=int, metavar="0-4"),
            configures=("write-weights", "check-accuracy-level")),
    # --- what is quantized ---
    _switch("exclude", None, _names,
            "node names or regexes whose nodes stay float (qcompiler.quant.settings.selection)",
            Flag(("--exclude",), "keep this node float: a node name, or (when no node has that name) a regular "
                 "expression searched in node names; repeatable", metavar="NODE|REGEX", multiple=True,
                 default=(), to_api=_list_or_none),
            configures=("place",)),
    _switch("op_types", None, _names,
            "only nodes of these op types are quantized (added after the config's rules, so they win)",
            Flag(("--op-types",), "quantize only nodes of these op types (comma list, e.g. Conv,MatMul); the "
                 "others keep float weights and outputs", metavar="OP[,OP...]", to_api=_op_types),
            configures=("place",)),
    _switch("nodes", None, _names, "only the nodes with these names are quantized",
            api_only="no flag yet: --exclude and --op-types cover the command line's needs",
            configures=("place",)),
    _switch("act_symmetric", None, _optional(_bool),
            "symmetric activation grids (None: the target's choice); overrides a config",
            Flag(("--symmetric-activations",), "symmetric activation grids (zero point 0), whatever the "
                 "target's default", is_flag=True, default=False, to_api=_true_or_none),
            config_key="activations.symmetric",
            configures=("place",)),
    _switch("weight_symmetric", None, _optional(_bool),
            "symmetric weight grids (None: the target's choice); overrides a config",
            Flag(("--symmetric-weights/--asymmetric-weights",), "symmetric weight grids, or with zero points "
                 "(default: the target's choice; weight-only: zero points where the target allows them)",
                 default=None),
            config_key="weights.symmetric",
            configures=("place", "plan-weights")),
    # --- the pipeline: passes, recipes, opset ---
    _switch("bias_correction", False, _bool,
            "empirical bias correction of Conv/Gemm weights (qdq.correct_biases; the `bias-correction` pass); off "
            "by default because on ppocr_cls it helped weight-only quantization (49 -> 56 dB) but hurt W8A8 "
            "(43 -> 32 dB output SQNR)",
            Flag(("--bias-correction/--no-bias-correction",), "empirical bias correction of Conv/Gemm weights "
                 "(helps weight-only, may hurt W8A8); the same as --recipe bias-correction", show_default=True),
            enables="bias-correction"),
    _switch("recipe", None, _optional(_pass_list),
            "optional passes to add, each where it belongs (\"bias-correction\", or a plug-in's pass with an "
            "`after`)",
            Flag(("--recipe",), "optional quantization passes to add, each where it belongs in the default "
                 "pipeline (see `qcompiler list-passes`)", metavar="PASS[,PASS...]")),
    _switch("pipeline", None, _optional(_pass_list),
            "the whole list of passes instead (experts; the passes' contracts are checked before any work)",
            Flag(("--pipeline",), "replace the whole default pipeline (experts; each pass's requirements are "
                 "checked first)", metavar="PASS[,PASS...]")),
    _switch("optimize", "balanced", _choice(OPTIMIZE),
            "accuracy keeps every quantizer; balanced (default) leaves float the 16-bit quantizers no integer "
            "kernel of the target reads or writes (float is more accurate and costs nothing); latency also takes "
            "out, by a measured search (report['latency_search']), the Q/DQ pairs between float kernels and "
            "narrows widened 16-bit values to 8 bits where an integer kernel then runs, while the output SQNR "
            "stays at most `latency_budget_db` dB below its starting value (passes/quantize/latency_search.py); "
            "size places activations as balanced and stores every weight narrow (int8 + DequantizeLinear, or a "
            "weight-only kernel) wherever that makes the file smaller (docs/optimize.md)",
            Flag(("--optimize",), "accuracy: every quantizer; balanced: no 16-bit quantizer where no integer "
                 "kernel reads or writes it (float is exact and free); latency: a search takes out Q/DQ pairs "
                 "between float kernels and narrows 16-bit values to 8 bits for integer kernels while the output "
                 "SQNR loses at most --latency-budget-db; size: activations as balanced, every weight stored narrow "
                 "where the file gets smaller", type=_choice_type(OPTIMIZE), show_default=True),
            configures=("place", "latency-search")),
    _switch("latency_budget_db", None, _latency_budget,
            "with optimize='latency': the output SQNR (dB) the search may give up (default 1)",
            Flag(("--latency-budget-db",), "with --optimize latency: output SQNR (dB) the search may give up for "
                 "speed (default 1)", type=float, metavar="DB"),
            configures=("latency-search",)),
    _switch("untaken_branches", "float", _choice(UNTAKEN_BRANCHES),
            "an If branch calibration never took keeps float activations (\"float\", default) or, \"mirror\", is "
            "calibrated from the other branch where the values are the same tensors "
            "(passes/quantize/untaken_branches.py; the notes say what each idle branch got)",
            Flag(("--untaken-branches",), "an If branch the calibration data never takes: float activations, or "
                 "mirror: calibrated from the other branch where the values are the same tensors (the report's "
                 "notes say which)", type=_choice_type(UNTAKEN_BRANCHES), show_default=True),
            enables="mirror-untaken-branches", enabled=lambda v: v == "mirror",
            configures=("mirror-untaken-branches",)),
    _switch("smoothquant_alpha", None, _optional(_alpha),
            "SmoothQuant's alpha (0 < alpha < 1) for every layer; adds the `smoothquant` pass (without it, "
            "recipe=[\"smoothquant\"] searches alpha per layer)",
            Flag(("--smoothquant-alpha",), "SmoothQuant's alpha for every layer (adds --recipe smoothquant; "
                 "without it the recipe searches alpha per layer on the calibration data)", type=_alpha_type,
                 metavar="ALPHA"),
            enables="smoothquant",
            configures=("smoothquant",)),
    _switch("measure_latency", False, _bool,
            "add the `measure-latency` pass (report['latency'] and report['kernels'])",
            Flag(("--measure-latency",), "time the quantized model against float in onnxruntime (default "
                 "session options, interleaved) and list which nodes run on integer kernels and why not",
                 is_flag=True),
            enables="measure-latency"),
    _switch("max_drop", None, _max_drop,
            "a budget (0.01 or \"1%\") switches on the `mixed-precision` pass: the cheapest per-layer precision "
            "whose drop on the calibration samples stays within it (qcompiler.passes.quantize.mixed_precision.search; "
            "report['mixed_precision'])",
            Flag(("--max-drop",), "mixed precision: the cheapest per-layer precision (W4A8 .. float) whose drop "
                 "on the calibration samples stays within X% (relative output error; see "
                 "qcompiler.passes.quantize.mixed_precision.search); a table is printed, a Pareto PNG written beside --report",
                 metavar="X%"),
            enables="mixed-precision",
            configures=("mixed-precision", "weight-mixed-precision")),
    _switch("metric", None, _metric,
            "the mixed-precision search's `metric(outputs, reference) -> score` (default: relative output error)",
            api_only="a Python callable",
            configures=("mixed-precision",)),
    _switch("ray", None, _ray, "run the mixed-precision evaluations and the safety net's independent trials on "
            "Ray (\"auto\" or an address)",
            Flag(("--ray",), "run the --max-drop evaluations and the safety net's independent trials on a Ray "
                 "cluster (pip install 'qcompiler[ray]'); default: local processes (docs/parallel.md)",
                 metavar="auto|ADDRESS"),
            configures=("mixed-precision", "safety-net")),
    _switch("executor", None, _executor,
            "run the mixed-precision evaluations and the safety net's independent trials on this object's "
            "`map(fn, items)` instead (qcompiler.quant.runtime.executor; default: local processes, or Ray with "
            "`ray`)",
            api_only="a Python object",
            configures=("mixed-precision", "safety-net")),
    _switch("opset", None, _optional(_int(13, 1 << 16)), "pin the output opset",
            Flag(("--opset",), "pin the output opset (default: 21 on a target that may widen activations to 16 "
                 "bits, as ort_cpu and qnn_htp do, or for int4/int16 grids and per-block weights; else 13; never "
                 "below the model's own)", type=int, metavar="N"),
            configures=("convert-opset",)),
    # --- the calibration data ---
    _switch("limit", None, _optional(_int(lo=1)), "use at most this many calibration samples",
            Flag(("--limit",), "use at most this many calibration samples", type=int, metavar="N"),
            configures=("calibrate",)),
    _switch("report_samples", None, _optional(_int(lo=1)),
            "measure the report's output SQNR on at most this many calibration samples (default: the samples "
            "calibration kept)",
            Flag(("--report-samples",), "the report's output SQNR pass runs on at most N calibration samples",
                 type=int, metavar="N"),
            configures=("measure-sqnr",)),
    # --- the output SQNR floor ---
    _switch("min_sqnr", None, _min_sqnr,
            "the output SQNR floor in dB (default DEFAULT_MIN_SQNR_DB; -inf turns it off): below it "
            "the safety net keeps float or widens the quantizers that break the output, and the outputs still "
            "below it are listed in report['below_floor'] (never raised: the CLI exits 3 on them)",
            Flag(("--min-sqnr",), "output SQNR floor in dB (default 15): below it the safety net keeps float or "
                 "widens the quantizers that break the output, and an output still below it exits 3 (after "
                 "writing)", type=float, metavar="DB"),
            configures=("safety-net",)),
    # --- terminal ---
    _switch("progress", None, _optional(_bool),
            "progress bars on stderr (None: on a terminal only)",
            Flag(("--progress/--no-progress",), "progress bars on stderr for loading, calibration and the report "
                 "pass (default: on a terminal only; plain lines in logs)"),
            configures=("calibrate", "measure-sqnr", "seq-mse")),
)

BY_NAME = {s.name: s for s in SWITCHES}
# keywords of quantize() that are not switches: what is quantized, with what, and the instruments around it
NOT_SWITCHES = ("model_or_path", "calib", "instrumentations")
# a switch that only means something together with another: (switch, the one it needs, what for)
NEEDS = (("metric", "max_drop", "the mixed-precision search"),)


def check_switches(values: dict) -> dict:
    """Every switch in `values` (keyword -> value, as a caller gave it) checked in table order: the checked
    values, or one ArgumentError line naming the first bad keyword. Missing keywords get their defaults."""
    out = {s.name: s.check(values.get(s.name, s.default)) for s in SWITCHES}
    for name, needed, what in NEEDS:
        if out[name] is not None and out[needed] is None:
            raise ArgumentError(f"{name} is for {what}: give {needed} too")
    return out


def pass_switches() -> dict:
    """keyword -> the pass it asks for (pipeline.SWITCHES)."""
    return {s.name: s.enables for s in SWITCHES if s.enables}


def wanted_passes(values: dict) -> list:
    """The passes the given switch values ask for, in table order."""
    return [s.enables for s in SWITCHES if s.enables and s.name in values and s.enabled(values[s.name])]


def cli_switches() -> Tuple[Switch, ...]:
    return tuple(s for s in SWITCHES if s.flag is not None)


def api_from_cli(values: dict) -> dict:
    """The option values of `qcompiler quantize` (by switch name) as quantize()'s keywords."""
    out = {}
    for s in cli_switches():
        v = values[s.name]
        out[s.name] = s.flag.to_api(v) if s.flag.to_api is not None else v
    return out


def api_doc() -> str:
    """The keyword section of quantize()'s docstring, one paragraph per switch, in table order."""
    lines = ["Switches (qcompiler/quant/core/switches.py; the CLI flag in brackets):"]
    for s in SWITCHES:
        where = f"[{'/'.join(s.flag.names)}]" if s.flag else "[API only]"
        lines.extend(textwrap.wrap(f"`{s.name}` (default {s.default!r}) {where}: {s.doc}.", width=112,
                                   initial_indent="    ", subsequent_indent="        "))
    return "\n".join(lines)
