"""Backend profiles as data: which ops carry quantized tensors, which share encodings, axes and fixed ranges.

A profile is data (PROFILES below, or a user's YAML/JSON/dict naming a `base`); `get_profile` checks it
(`check_profile`) and returns a typed, frozen `Profile` that generic placement code reads by attribute (no
`if target == ...` anywhere). Keys (one attribute each):

- `activation`: default activation grid `{bits, symmetric}`; `weight`: `{bits, symmetric, range_bits}` where
  `range_bits` < `bits` narrows the weight grid (ort_cpu: 7, because u8 x s8 pairs summed into int16 saturate on
  AVX2 CPUs without VNNI under ORT's default optimization level; anchors F, as ORT's `reduce_range`).
- `weights`: op -> {input slot: per-channel axis rule}; an axis rule is an int (negative counts from the end),
  or `"gemm_transB"` (transB=1: axis 0, else axis 1). A data-movement op listed here has its constant input
  quantized like a weight (qnn_htp: an embedding Gather's table, as AIMET quantizes it and QNN runs it; `_TABLES`)
  and its output carries that grid. `table_ops`: those of them whose constant takes the activation grid's
  symmetry (AIMET gives it an input quantizer, not a parameter's; minilm_l6's position table on a symmetric 8-bit
  grid: 15.2 dB, asymmetric 20.4 dB). `bias`: op -> input slot stored as int32 with
  scale = s_input * s_weight and zero point 0.
- `per_channel_ops`: ops whose weights may be per-channel (others fall back to per-tensor).
- `float_output_ops`: ops whose outputs are never quantized (not quantizable: ties never cross them).
- `float_outputs`: op -> output slots kept float (LSTM cell state Y_c; field notes §1 wants it wide).
- `shares_input_encoding`: data-movement ops whose output reuses input 0's encoding (anchors B: ORT drops
  the Q/DQ pair around them when the two encodings match).
- `quantize_data_movement_outputs`: False (qnn_htp, anchors B) leaves their outputs without a quantizer.
- `tie_inputs_and_output`: ops whose float inputs and output share one encoding (Concat).
- `fixed_output_range`: op -> [min, max] (Sigmoid/Softmax [0, 1], Tanh [-1, 1]).
- `wide_activation_bits`: grid used instead of float for activations whose bulk 8 bits cannot resolve
  (field notes §6); None keeps them float (TensorRT has no int16 activations).
- `fused_activations`: (producer op, activation op) pairs treated as one unit: no quantizer between them.
- `split_fused_above_macs`: activation op -> multiply-accumulates per call of its producer from which the pair is
  NOT one unit: the activation gets a QDQ unit of its own so the producer runs its integer kernel (ort_cpu: no
  QLinearConv absorbs HardSwish, so a Conv+HardSwish unit ran a float Conv at any size; a chain of 3 Convs C->C 3x3
  + HardSwish, split / float: 0.65x at 1.8 M MACs each, 0.43x at 7.2 M, 0.33x at 116 M, while fused stays 1.0x).
  Below it the pair stays one float unit. NOTE: 8 M is tuned, not derived: inside MobileNet-style blocks (a 1x1
  expand Conv between float depthwise Convs) splitting at 2 M made benchmarks/bench_latency.py's mobilenet_like
  1.28x float (layout changes at every border); 8 M splits none of its Convs (0.96x) and every dense Conv from
  about 32 channels at 28x28 up.
- `bias_add_ops`: linear ops whose product, read only by an Add of a constant (an exported Linear's bias),
  goes on to that Add unquantized (the runtime takes the bias into the kernel; placement._mark_bias_adds).
- `per_block_weight_bits`: weight bit widths that may be per-block (default 4 and 8); others fall back to
  per-channel and say so.
- `prefold_unfused_weight_dq`: store a weight whose node cannot fuse its DQ into an integer kernel as float
  values on its int grid (quant/placement/storage.py), so no DequantizeLinear runs per inference.
  `integer_weight_kernels`: op -> {act_bits, output_q} says when the runtime fuses DQ(weight) (output_q:
  only with a Q on the output, possibly behind `output_q_through` ops); other weighted ops (LSTM/GRU/RNN)
  never do.
  `requantizes_float_weights`: ops whose float weight the runtime re-quantizes itself (keep their DQ).
- `float_kernel_weights`: `--optimize` objective -> how a weight read by a float kernel is stored: "grid" (float32
  on its integer grid: the QDQ model's numbers, no DequantizeLinear at run time, no size gained), "float" (exact
  float: nothing rounded for nothing) or "int" (the integer tensor and a DequantizeLinear: a quarter of the bytes,
  but onnxruntime runs that DQ on every inference and a Conv fed by it loses the NCHWc layout: a 64-channel 3x3
  Conv at 56x56 1.32 ms against 1.02 ms). An objective it does not name: "grid" with `prefold_unfused_weight_dq`,
  else "int". A MatMul weight the target's weight-only kernel takes (`weight_only.matmul` MatMulNBits) is left
  exact float where the form is "int": narrow-float-weights stores it int8 for that kernel (as small, no DQ).
  `Profile.float_kernel_weight_form` is the one reader (placement/float_regions.py, placement/storage.py).
- `float_kernel_ops`: ops that always run a float kernel on the target (they dequantize their inputs): a
  data-movement output read only by them needs no quantizer of its own (it is on its input's grid already).
- `fusions`: the runtime's QDQ fusion table (qcompiler/quant/targets/fusions.py; a built-in name such as `ort_cpu` or a
  YAML path): placement keeps an activation quantizer only next to an op that runs an integer kernel under it
  (quant/placement/float_regions.py; `--optimize accuracy` keeps every quantizer). None: every quantizer stays.
- `symmetric_dynamic_weight_ops`: ops whose weight input 1, when it is an activation and not a constant (a
  dynamic MatMul's K or V), is quantized with the weights' symmetry: the quantizer that feeds it, through data
  movement, and its tie group (AIMET's `_apply_param_symmetry_to_inputs`; quant/placement/dynamic_weights.py).
- `float16_compute`: how a float16 model's float arithmetic runs between its quantizers: "float32" (ort_cpu,
  aimet: the model is lifted to float32 inside and keeps its float16 inputs and outputs, pass upcast-float16;
  onnxruntime's CPU provider has few float16 kernels and its integer kernels dequantize to float32) or "float16"
  (trt, qnn_htp: the runtime computes in half precision; Q/DQ in the value's own type, qdq.float_route).
- `weight_only`: how the target runs weight-only quantized MatMul/Gemm weights and embeddings (`--weight-only`),
  or absent when it has no such kernel: `matmul` is the op written for a MatMul/Gemm weight ("MatMulNBits": the
  com.microsoft op onnxruntime's CPU and CUDA EPs run with packed 4/8-bit weights; "DequantizeLinear": a blocked
  opset-21 DequantizeLinear feeding the float MatMul, the form TensorRT and ModelOpt read), `gather` the op for an
  embedding Gather ("GatherBlockQuantized", "DequantizeLinear" or null: the embedding stays float), `bits` the
  weight widths it runs, `signed` whether the DQ form stores signed integers, `zero_points` whether asymmetric
  grids (a zero point per block) are allowed, `accuracy_level` MatMulNBits' default (4: int8 activations inside
  the kernel, what onnxruntime-genai writes for CPU; 0: float), `slow_level0_bits` the widths whose MatMulNBits
  has no fast kernel at accuracy_level 0 (such a weight gets level 4 unless `--optimize accuracy` or the
  level-4 check says otherwise: passes/quantize/check_accuracy_level.py). Checked against onnxruntime by
  tests/quant/test_weight_only_profiles.py.
- `max_opset_int8` is implicit: per-channel Q/DQ needs opset 13, int16/int4 need opset 21 (anchors B).
"""
from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field
from typing import Dict, Optional, Tuple, Union

from qcompiler.errors import ConfigError
from qcompiler.input_files import read_bounded
from qcompiler.quant.core.bitwidths import check_bits
from qcompiler.quant.core.objectives import OPTIMIZE
from qcompiler.shorten import did_you_mean
from qcompiler.quant.settings.untrusted import (
    decode_text,
    parse_json,
    parse_yaml,
    short,
)

DATA_MOVEMENT = ["Reshape", "Transpose", "Slice", "Gather", "Split", "Squeeze", "Unsqueeze", "Flatten",
                 "MaxPool", "Expand", "Tile", "Identity", "Pad", "DepthToSpace", "SpaceToDepth",
                 "ReduceMax", "ReduceMin", "GatherElements", "GatherND"]

NOT_QUANTIZABLE = ["Shape", "Size", "NonZero", "NonMaxSuppression", "TopK", "ArgMax", "ArgMin", "Cast",
                   "ConstantOfShape", "Range", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
                   "Not", "And", "Or", "Xor", "IsNaN", "IsInf", "RandomNormal", "RandomUniform",
                   "RandomNormalLike", "RandomUniformLike", "Multinomial", "Loop", "If", "Scan",
                   "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "Constant", "EyeLike",
                   "Trilu"]

_WEIGHTS = {"Conv": {1: 0}, "ConvTranspose": {1: 1}, "Gemm": {1: "gemm_transB"}, "MatMul": {1: -1},
            "LSTM": {1: 1, 2: 1}, "GRU": {1: 1, 2: 1}, "RNN": {1: 1, 2: 1}}
# an embedding Gather's constant table (input 0) as the target runs it: on a grid, the Gather moving integers.
# aimet_onnx's QuantizationSimModel (quantsim.py `_is_tensor_quantizable`) gives every float initializer that
# is not a parameter of its connected graph (Gather's table is none) an input quantizer, which the default and
# HTP configs turn on (`model_input.is_input_quantized`); Gather's output is in `op_outputs_to_ignore`, so the
# Gather runs on the table's grid. Per tensor: Gather is in no `per_channel_ops`. load_encodings_to_sim looks a
# quantizer up in param_encodings as well as activation_encodings, so the file's param entry loads (aimet).
_TABLES = {"Gather": {0: 0}}
_BIAS = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2}
_FIXED = {"Sigmoid": [0.0, 1.0], "Softmax": [0.0, 1.0], "Tanh": [-1.0, 1.0], "HardSigmoid": [0.0, 1.0]}
_FUSED = [["Conv", "Relu"], ["Conv", "Clip"], ["Conv", "LeakyRelu"], ["Conv", "HardSwish"],
          ["Gemm", "Relu"], ["Gemm", "Clip"], ["MatMul", "Relu"], ["Add", "Relu"], ["Add", "Clip"],
          ["ConvTranspose", "Relu"], ["BatchNormalization", "Relu"], ["Conv", "BatchNormalization"]]
# onnxruntime's CPU provider absorbs only the Relu/Clip a Q makes redundant; a Conv+LeakyRelu with no Q between
# them runs a float FusedConv, with a Q/DQ between them QLinearConv + QLinearLeakyRelu
# (tests/quant/test_ort_cpu_facts.py checks every pair against onnxruntime)
_FUSED_ORT_CPU = [p for p in _FUSED if p != ["Conv", "LeakyRelu"]]

PROFILES: dict = {
    "ort_cpu": {
        "description": "onnxruntime CPU EP, QDQ: u8 asymmetric activations, s8 symmetric weights in a 7-bit "
                       "range (reduce_range), int32 bias",
        "activation": {"bits": 8, "symmetric": False},
        "weight": {"bits": 8, "symmetric": True, "range_bits": 7},
        "wide_activation_bits": 16,
        # ORT 1.31 fuses an int8 blocked DQ(weight)->MatMul into QLinearMatMul, which then fails at run time
        # ("weight zero point must be a scalar ..."): 8-bit per-block falls back to per-channel here
        "per_block_weight_bits": [4],
        "weights": _WEIGHTS, "bias": _BIAS,
        "per_channel_ops": ["Conv", "ConvTranspose", "Gemm", "MatMul", "LSTM", "GRU", "RNN"],
        "float_output_ops": NOT_QUANTIZABLE,
        "float_outputs": {"LSTM": [2]},
        "shares_input_encoding": DATA_MOVEMENT,
        "quantize_data_movement_outputs": True,
        "tie_inputs_and_output": ["Concat"],
        "fixed_output_range": _FIXED,
        "fused_activations": _FUSED_ORT_CPU,
        "split_fused_above_macs": {"HardSwish": 8000000},
        "bias_add_ops": ["MatMul", "Gemm"],
        # anchors B, checked on ORT 1.31: Conv->QLinearConv needs an output Q (Relu/Clip before it fold into
        # the Q); MatMul->MatMulIntegerToFloat and Gemm->QGemm take a float output; int16 inputs never fuse
        "prefold_unfused_weight_dq": True,
        "integer_weight_kernels": {"Conv": {"act_bits": 8, "output_q": True},
                                   "MatMul": {"act_bits": 8, "output_q": False},
                                   "Gemm": {"act_bits": 8, "output_q": False}},
        "output_q_through": ["Relu", "Clip"],
        "float_kernel_ops": ["LSTM", "GRU", "RNN"],
        # a float kernel's weights: on the grid only when asked (accuracy), exact float for speed, int8 for size
        "float_kernel_weights": {"accuracy": "grid", "balanced": "float", "latency": "float", "size": "int"},
        # placement/storage.py: ORT's WeightBiasQuantization
        "requantizes_float_weights": ["Conv", "ConvTranspose", "Gemm"],
        # which QDQ units onnxruntime's CPU EP turns into integer kernels (qcompiler/quant/targets/fusion_tables/ort_cpu.yaml): placement
        # keeps a quantizer only next to one of them (placement/float_regions.py)
        "fusions": "ort_cpu",
        "float16_compute": "float32",
        # accuracy_level 4: faster at one token (decode), slower for long prompts (prefill); decode dominates a
        # generation (measured in docs/weight-only.md, "accuracy_level on ort_cpu"). 8-bit MatMulNBits at level 0
        # (onnxruntime 1.32 CPU): 10x a float MatMul at one token, 2.6x at 128; at level 4 about float's
        "weight_only": {"matmul": "MatMulNBits", "gather": "GatherBlockQuantized", "bits": [4, 8],
                        "signed": False, "zero_points": True, "accuracy_level": 4, "slow_level0_bits": [8]},
    },
    "trt": {
        "description": "TensorRT explicit quantization: s8 symmetric activations and weights, bias float",
        "activation": {"bits": 8, "symmetric": True},
        "weight": {"bits": 8, "symmetric": True, "range_bits": 8},
        "wide_activation_bits": None,
        "weights": _WEIGHTS, "bias": {},
        # LSTM/GRU/RNN W and R per channel on the gate axis: an explicit DQ TensorRT folds
        "per_channel_ops": ["Conv", "ConvTranspose", "Gemm", "MatMul", "LSTM", "GRU", "RNN"],
        "float_output_ops": NOT_QUANTIZABLE,
        "float_outputs": {"LSTM": [2]},
        "shares_input_encoding": DATA_MOVEMENT,
        "quantize_data_movement_outputs": True,
        "tie_inputs_and_output": ["Concat"],
        "fixed_output_range": {"Sigmoid": [0.0, 1.0], "Tanh": [-1.0, 1.0]},
        "fused_activations": _FUSED,
        "bias_add_ops": ["MatMul", "Gemm"],
        "float16_compute": "float16",
        # TensorRT 10 / ModelOpt int4 AWQ: signed int4 blocked DQ -> MatMul, no zero point; no quantized Gather
        "weight_only": {"matmul": "DequantizeLinear", "gather": None, "bits": [4, 8], "signed": True,
                        "zero_points": False, "accuracy_level": 0},
    },
    "qnn_htp": {
        "description": "Qualcomm QNN HTP (as AIMET's htp_quantsim_config_v75): u8 asymmetric activations, s8 "
                       "symmetric per-channel Conv weights, per-tensor Gemm/MatMul, int32 bias, data-movement "
                       "outputs unquantized",
        "activation": {"bits": 8, "symmetric": False},
        "weight": {"bits": 8, "symmetric": True, "range_bits": 8},
        "wide_activation_bits": 16,
        "weights": {**_WEIGHTS, **_TABLES}, "bias": _BIAS, "table_ops": list(_TABLES),
        "per_channel_ops": ["Conv", "ConvTranspose", "LSTM", "GRU", "RNN"],
        "float_output_ops": NOT_QUANTIZABLE,
        "float_outputs": {"LSTM": [2]},
        "shares_input_encoding": DATA_MOVEMENT,
        "quantize_data_movement_outputs": False,
        "tie_inputs_and_output": ["Concat"],
        "fixed_output_range": _FIXED,
        "fused_activations": _FUSED + [["Conv", "PRelu"], ["Gemm", "PRelu"]],
        # AIMET gives a dynamic MatMul's second input the params' symmetry under every config (HTP's too)
        "symmetric_dynamic_weight_ops": ["Conv", "ConvTranspose", "Gemm", "MatMul"],
        "float16_compute": "float16",
    },
    "aimet": {
        "description": "AIMET-ONNX's QuantizationSimModel with its default_config_per_channel.json: u8 asymmetric "
                       "activations, s8 symmetric per-channel weights on the full 8-bit range, a symmetric grid on "
                       "a dynamic MatMul's second input, no quantizer on grid-preserving (data-movement) outputs; "
                       "pick it when the encodings file goes to AIMET (load_encodings_to_sim)",
        "activation": {"bits": 8, "symmetric": False},
        "weight": {"bits": 8, "symmetric": True, "range_bits": 8},
        # AIMET keeps its activations on the grid asked for: no 16-bit widening (a value 8 bits cannot carry
        # stays float and the file leaves it out; AIMET disables the quantizers a loaded file has no entry for)
        "wide_activation_bits": None,
        "weights": {**_WEIGHTS, **_TABLES}, "bias": _BIAS, "table_ops": list(_TABLES),
        "per_channel_ops": ["Conv", "ConvTranspose", "Gemm", "MatMul"],
        "float_output_ops": NOT_QUANTIZABLE,
        "float_outputs": {"LSTM": [2]},
        # aimet_onnx common/onnx/_utils.py `_is_grid_preserving_op`: is_output_quantized False unless configured
        "shares_input_encoding": ["Reshape", "Transpose", "Slice", "Gather", "Split", "Squeeze", "Unsqueeze",
                                  "Flatten", "MaxPool", "Expand", "Tile", "Identity", "Pad", "DepthToSpace",
                                  "SpaceToDepth", "ReduceMax", "ReduceMin", "GatherElements", "GatherND",
                                  "Dropout", "Compress", "Col2Im", "MaxRoiPool"],
        "quantize_data_movement_outputs": False,
        "tie_inputs_and_output": [],
        "fixed_output_range": {},
        # the config's supergroups and its MatmulAdd pass
        "fused_activations": [["Conv", "Relu"], ["Conv", "Clip"], ["ConvTranspose", "Relu"], ["Add", "Relu"],
                              ["Gemm", "Relu"]],
        "bias_add_ops": ["MatMul"],
        "symmetric_dynamic_weight_ops": ["Conv", "ConvTranspose", "Gemm", "MatMul"],
        "float16_compute": "float32",
        # AIMET's weight-only sims (W4A16): the encodings file carries the grids; the model a DQ form
        "weight_only": {"matmul": "DequantizeLinear", "gather": "DequantizeLinear", "bits": [4, 8], "signed": True,
                        "zero_points": False, "accuracy_level": 0},
    },
}


@dataclass(frozen=True)
class Grid:
    """A default grid: `activation` {bits, symmetric}; `weight` adds `range_bits` (None: the whole grid)."""

    bits: int
    symmetric: bool
    range_bits: Optional[int] = None


@dataclass(frozen=True)
class KernelRule:
    """When the runtime fuses DQ(weight) of an op into an integer kernel (`integer_weight_kernels`)."""

    act_bits: int = 8
    output_q: bool = False      # only with a Q on the output (possibly behind `output_q_through` ops)


WEIGHT_ONLY_MATMUL = ("MatMulNBits", "DequantizeLinear")
WEIGHT_ONLY_GATHER = ("GatherBlockQuantized", "DequantizeLinear")


@dataclass(frozen=True)
class WeightOnlyForm:
    """How a target runs weight-only weights (the profile's `weight_only`; see the module docstring)."""

    matmul: str
    gather: Optional[str] = None
    bits: Tuple[int, ...] = (4, 8)
    signed: bool = False
    zero_points: bool = True
    accuracy_level: int = 0
    slow_level0_bits: Tuple[int, ...] = ()


@dataclass(frozen=True)
class Profile:
    """A checked backend profile (see the module docstring for each key); lists are tuples, in data order."""

    name: str
    activation: Grid
    weight: Grid
    description: str = ""
    base: str = ""
    weights: Dict[str, Dict[int, Union[int, str]]] = field(default_factory=dict)
    bias: Dict[str, int] = field(default_factory=dict)
    per_channel_ops: Tuple[str, ...] = ()
    float_output_ops: Tuple[str, ...] = ()
    float_outputs: Dict[str, Tuple[int, ...]] = field(default_factory=dict)
    shares_input_encoding: Tuple[str, ...] = ()
    quantize_data_movement_outputs: bool = True
    tie_inputs_and_output: Tuple[str, ...] = ()
    fixed_output_range: Dict[str, Tuple[float, float]] = field(default_factory=dict)
    wide_activation_bits: Optional[int] = None
    fused_activations: Tuple[Tuple[str, str], ...] = ()
    split_fused_above_macs: Dict[str, int] = field(default_factory=dict)
    bias_add_ops: Tuple[str, ...] = ()
    per_block_weight_bits: Tuple[int, ...] = (4, 8)
    prefold_unfused_weight_dq: bool = False
    integer_weight_kernels: Dict[str, KernelRule] = field(default_factory=dict)
    output_q_through: Tuple[str, ...] = ()
    float_kernel_ops: Tuple[str, ...] = ()
    requantizes_float_weights: Tuple[str, ...] = ()
    symmetric_dynamic_weight_ops: Tuple[str, ...] = ()
    table_ops: Tuple[str, ...] = ()     # `weights` ops whose constant takes the activation grid's symmetry
    fusions: Optional[str] = None       # the runtime's QDQ fusion table (qcompiler/quant/targets/fusions.py): a name or a YAML path
    float16_compute: str = "float32"    # "float32" | "float16": FLOAT16_COMPUTE
    weight_only: Optional[WeightOnlyForm] = None   # None: the target has no weight-only kernel
    float_kernel_weights: Dict[str, str] = field(default_factory=dict)   # objective -> FLOAT_KERNEL_WEIGHT_FORMS

    def to_dict(self) -> dict:
        """Plain data (JSON-serialisable: tuples become lists)."""
        return asdict(self)

    def float_kernel_weight_form(self, objective: str, op_type: str, weight_only: bool = True) -> str:
        """How a weight of an `op_type` node that runs a float kernel is stored under `objective` ("grid",
        "float" or "int"; the `float_kernel_weights` key above). `weight_only` False: the form once Q/DQ are
        placed (a weight kept for the MatMulNBits route is not re-routed then)."""
        form = self.float_kernel_weights.get(objective) or ("grid" if self.prefold_unfused_weight_dq else "int")
        if weight_only and form == "int" and op_type == "MatMul" and self.weight_only is not None \
                and self.weight_only.matmul == "MatMulNBits" and 8 in self.weight_only.bits:
            return "float"      # narrow-float-weights: int8 MatMulNBits, as small and no DQ at run time
        return form


def get_profile(target) -> Profile:
    """The profile named `target`, or a dict/YAML/JSON file path given by the user, checked and typed.

    A user's profile (dict or file) names a `base` (default ort_cpu) and overrides its keys; every key's type
    and range is checked (`check_profile`), so a bad value is one ConfigError line naming the file and key.
    """
    return _get_profile(target, "profile")


def _get_profile(target, source: str) -> Profile:
    if isinstance(target, dict):
        base_name = target.get("base", "ort_cpu")
        if not isinstance(base_name, str) or base_name not in PROFILES:
            raise ConfigError(f"{source}: unknown base {short(base_name)}; known targets: {', '.join(PROFILES)}")
        base = copy.deepcopy(PROFILES[base_name])
        unknown = [_key(k) for k in target if k not in base and k not in ("base", "name")]
        if unknown:  # a typo must not be silently ignored
            raise ConfigError(f"{source}: unknown key(s) {', '.join(sorted(unknown)[:5])}; "
                              f"known: {', '.join(sorted(base))}")
        base["name"] = base_name + "+custom"
        base.update(copy.deepcopy(target))
        return check_profile(base, source)
    if isinstance(target, str) and target in PROFILES:
        prof = copy.deepcopy(PROFILES[target])
        prof["name"] = target
        return check_profile(prof, f"profile '{target}'")
    if isinstance(target, str) and target.endswith((".yaml", ".yml", ".json")):
        text = decode_text(read_bounded(target, "profile", ConfigError), target, "profile")
        src = f"profile '{target}'"
        if target.endswith(".json"):
            data = parse_json(text, src, ConfigError)
        else:
            data = parse_yaml(text, src, ConfigError)
        if not isinstance(data, dict):
            raise ConfigError(f"{src}: expected a mapping at top level, got {short(data)}")
        return _get_profile(data, src)
    if not isinstance(target, str):
        raise ConfigError(f"target must be a profile name, a profile file path or a dict, got {short(target)}")
    raise ConfigError(f"unknown target {short(target)}{did_you_mean(target, PROFILES)}; known targets: "
                      f"{', '.join(PROFILES)}")


def _key(k) -> str:
    k = k if isinstance(k, str) else short(k)
    return k if len(k) <= 60 else k[:60] + "..."


class _Check:
    """Type and range checks of one profile's keys; each failure is `source: key: what was expected`."""

    def __init__(self, source: str):
        self.source = source

    def err(self, where: str, msg: str) -> ConfigError:
        return ConfigError(f"{self.source}: {where}: {msg}")

    def mapping(self, v, where) -> dict:
        if not isinstance(v, dict):
            raise self.err(where, f"expected a mapping, got {short(v)}")
        return v

    def boolean(self, v, where) -> bool:
        if not isinstance(v, bool):
            raise self.err(where, f"expected true/false, got {short(v)}")
        return v

    def names(self, v, where) -> list:
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise self.err(where, f"expected a list of op type names, got {short(v)}")
        return list(v)

    def slot(self, v, where) -> int:
        if isinstance(v, str) and v.isdigit() and len(v) < 6:   # JSON keys are strings
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1024:
            raise self.err(where, f"expected an input/output slot number (0..1023), got {short(v)}")
        return v

    def number(self, v, where) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)):
            raise self.err(where, f"expected a finite number, got {short(v)}")
        return float(v)

    def grid(self, v, where, keys) -> dict:
        d = self.mapping(v, where)
        for k in d:
            if k not in keys:
                raise self.err(f"{where}.{_key(k)}", f"unknown key (allowed: {', '.join(keys)})")
        for k in keys:
            if k not in d:
                raise self.err(where, f"missing '{k}'")
        out = {"bits": check_bits(d["bits"], f"{self.source}: {where}.bits"),
               "symmetric": self.boolean(d["symmetric"], f"{where}.symmetric")}
        if "range_bits" in d:
            rb = d["range_bits"]
            if isinstance(rb, bool) or not isinstance(rb, int) or not 2 <= rb <= out["bits"]:
                raise self.err(f"{where}.range_bits", f"expected an integer in 2..{out['bits']} (bits), "
                               f"got {short(rb)}")
            out["range_bits"] = rb
        return out


FLOAT16_COMPUTE = ("float32", "float16")
FLOAT_KERNEL_WEIGHT_FORMS = ("grid", "float", "int")

_NAME_LISTS = ("per_channel_ops", "float_output_ops", "shares_input_encoding", "tie_inputs_and_output",
               "bias_add_ops", "output_q_through", "float_kernel_ops", "requantizes_float_weights",
               "symmetric_dynamic_weight_ops", "table_ops")
_BOOLS = ("quantize_data_movement_outputs", "prefold_unfused_weight_dq")


def check_profile(p: dict, source: str = "profile") -> Profile:
    """The typed Profile of `p` (edited in place: JSON slot keys made ints), every key's type and range checked;
    ConfigError names the key."""
    c = _Check(source)
    for k in ("name", "description", "base", "fusions"):
        if k in p and not isinstance(p[k], str):
            raise c.err(k, f"expected a string, got {short(p[k])}")
    if p.get("float16_compute", "float32") not in FLOAT16_COMPUTE:
        raise c.err("float16_compute", f"expected one of {', '.join(FLOAT16_COMPUTE)}, "
                    f"got {short(p['float16_compute'])}")
    p["activation"] = c.grid(p.get("activation"), "activation", ("bits", "symmetric"))
    p["weight"] = c.grid(p.get("weight"), "weight", ("bits", "symmetric", "range_bits")
                         if "range_bits" in c.mapping(p.get("weight"), "weight") else ("bits", "symmetric"))
    wab = p.get("wide_activation_bits")
    if wab is not None:
        check_bits(wab, f"{source}: wide_activation_bits")
    if "per_block_weight_bits" in p:
        pb = p["per_block_weight_bits"]
        if not isinstance(pb, list):
            raise c.err("per_block_weight_bits", f"expected a list of bit widths, got {short(pb)}")
        for i, b in enumerate(pb):
            check_bits(b, f"{source}: per_block_weight_bits[{i}]")
    weights = {}
    for op, slots in c.mapping(p.get("weights", {}), "weights").items():
        w = f"weights.{_key(op)}"
        rules = {}
        for slot, rule in c.mapping(slots, w).items():
            s = c.slot(slot, f"{w} slot")
            if rule != "gemm_transB" and (isinstance(rule, bool) or not isinstance(rule, int)
                                          or not -8 <= rule < 8):
                raise c.err(f"{w}.{_key(slot)}", f"expected an axis (-8..7) or 'gemm_transB', got {short(rule)}")
            rules[s] = rule
        weights[op] = rules
    p["weights"] = weights
    p["bias"] = {op: c.slot(s, f"bias.{_key(op)}") for op, s in c.mapping(p.get("bias", {}), "bias").items()}
    for k in _NAME_LISTS:
        if k in p:
            p[k] = c.names(p[k], k)
    for k in _BOOLS:
        if k in p:
            c.boolean(p[k], k)
    if "float_outputs" in p:
        fo = {}
        for op, slots in c.mapping(p["float_outputs"], "float_outputs").items():
            w = f"float_outputs.{_key(op)}"
            if not isinstance(slots, list):
                raise c.err(w, f"expected a list of output slots, got {short(slots)}")
            fo[op] = [c.slot(s, w) for s in slots]
        p["float_outputs"] = fo
    if "fixed_output_range" in p:
        for op, r in c.mapping(p["fixed_output_range"], "fixed_output_range").items():
            w = f"fixed_output_range.{_key(op)}"
            if not isinstance(r, list) or len(r) != 2:
                raise c.err(w, f"expected [min, max], got {short(r)}")
            lo, hi = c.number(r[0], w), c.number(r[1], w)
            if not lo < hi:
                raise c.err(w, "min must be below max")
    for op, m in c.mapping(p.get("split_fused_above_macs", {}), "split_fused_above_macs").items():
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise c.err(f"split_fused_above_macs.{_key(op)}", f"expected a whole number >= 0, got {short(m)}")
    if "fused_activations" in p:
        fa = p["fused_activations"]
        if not isinstance(fa, list) or not all(isinstance(x, list) and len(x) == 2
                                               and all(isinstance(y, str) for y in x) for x in fa):
            raise c.err("fused_activations", f"expected a list of [producer op, activation op] pairs, "
                        f"got {short(fa)}")
    if "integer_weight_kernels" in p:
        for op, rule in c.mapping(p["integer_weight_kernels"], "integer_weight_kernels").items():
            w = f"integer_weight_kernels.{_key(op)}"
            rule = c.mapping(rule, w)
            for k, v in rule.items():
                if k == "act_bits":
                    check_bits(v, f"{source}: {w}.act_bits")
                elif k == "output_q":
                    c.boolean(v, f"{w}.output_q")
                else:
                    raise c.err(f"{w}.{_key(k)}", "unknown key (allowed: act_bits, output_q)")
    if p.get("weight_only") is not None:
        p["weight_only"] = _weight_only(c, p["weight_only"])
    for objective, form in c.mapping(p.get("float_kernel_weights", {}), "float_kernel_weights").items():
        if objective not in OPTIMIZE:
            raise c.err(f"float_kernel_weights.{_key(objective)}", f"unknown objective (allowed: {', '.join(OPTIMIZE)})")
        if form not in FLOAT_KERNEL_WEIGHT_FORMS:
            raise c.err(f"float_kernel_weights.{objective}", f"expected one of {', '.join(FLOAT_KERNEL_WEIGHT_FORMS)}, "
                        f"got {short(form)}")
    return _typed(p)


def _weight_only(c: _Check, v) -> dict:
    d = dict(c.mapping(v, "weight_only"))
    known = ("matmul", "gather", "bits", "signed", "zero_points", "accuracy_level", "slow_level0_bits")
    for k in d:
        if k not in known:
            raise c.err(f"weight_only.{_key(k)}", f"unknown key (allowed: {', '.join(known)})")
    if d.get("matmul") not in WEIGHT_ONLY_MATMUL:
        raise c.err("weight_only.matmul", f"expected one of {', '.join(WEIGHT_ONLY_MATMUL)}, got {short(d.get('matmul'))}")
    if d.get("gather") is not None and d["gather"] not in WEIGHT_ONLY_GATHER:
        raise c.err("weight_only.gather", f"expected one of {', '.join(WEIGHT_ONLY_GATHER)} or null, "
                    f"got {short(d['gather'])}")
    bits = d.get("bits", [4, 8])
    if not isinstance(bits, list) or not bits or not all(b in (2, 3, 4, 5, 6, 7, 8) and not isinstance(b, bool)
                                                         for b in bits):
        raise c.err("weight_only.bits", f"expected a list of widths in 2..8, got {short(bits)}")
    for k in ("signed", "zero_points"):
        if k in d:
            c.boolean(d[k], f"weight_only.{k}")
    lvl = d.get("accuracy_level", 0)
    if isinstance(lvl, bool) or lvl not in (0, 1, 2, 3, 4):
        raise c.err("weight_only.accuracy_level", f"expected 0..4, got {short(lvl)}")
    slow = d.get("slow_level0_bits", [])
    if not isinstance(slow, list) or not all(b in bits and not isinstance(b, bool) for b in slow):
        raise c.err("weight_only.slow_level0_bits", f"expected a list of widths from bits, got {short(slow)}")
    d["bits"] = bits
    return d


def _typed(p: dict) -> Profile:
    """The Profile of a checked profile dict."""
    a, w = p["activation"], p["weight"]
    return Profile(
        name=p.get("name", ""), description=p.get("description", ""), base=p.get("base", ""),
        activation=Grid(a["bits"], a["symmetric"]), weight=Grid(w["bits"], w["symmetric"], w.get("range_bits")),
        weights={op: dict(rules) for op, rules in p["weights"].items()}, bias=dict(p["bias"]),
        float_outputs={op: tuple(slots) for op, slots in p.get("float_outputs", {}).items()},
        fixed_output_range={op: (float(r[0]), float(r[1])) for op, r in p.get("fixed_output_range", {}).items()},
        wide_activation_bits=p.get("wide_activation_bits"), fusions=p.get("fusions"),
        float16_compute=p.get("float16_compute", "float32"),
        fused_activations=tuple(tuple(pair) for pair in p.get("fused_activations", ())),
        split_fused_above_macs={op: int(m) for op, m in p.get("split_fused_above_macs", {}).items()},
        per_block_weight_bits=tuple(p.get("per_block_weight_bits", (4, 8))),
        integer_weight_kernels={op: KernelRule(**rule) for op, rule in p.get("integer_weight_kernels", {}).items()},
        weight_only=WeightOnlyForm(**dict(p["weight_only"], bits=tuple(p["weight_only"].get("bits", (4, 8))),
                                          slow_level0_bits=tuple(p["weight_only"].get("slow_level0_bits", ()))))
        if p.get("weight_only") is not None else None,
        float_kernel_weights=dict(p.get("float_kernel_weights", {})),
        **{k: tuple(p[k]) for k in _NAME_LISTS if k in p}, **{k: p[k] for k in _BOOLS if k in p})


def weight_axis(profile: Profile, node, slot: int, rank: int) -> Optional[int]:
    """Per-channel axis of weight input `slot` of `node` under `profile`, normalised to [0, rank)."""
    rule = profile.weights.get(node.op_type, {}).get(slot)
    if rule is None:
        return None
    if rule == "gemm_transB":
        axis = 0 if node.attr("transB", 0) else 1
    else:
        axis = int(rule)
    if axis < 0:
        axis += rank
    return axis if 0 <= axis < rank else None
