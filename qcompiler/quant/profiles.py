"""Backend profiles as data: which ops carry quantized tensors, which share encodings, axes and fixed ranges.

A profile is a plain dict read by generic placement code (no `if target == ...` anywhere). Keys:

- `activation`: default activation grid `{bits, symmetric}`; `weight`: `{bits, symmetric, range_bits}` where
  `range_bits` < `bits` narrows the weight grid (ort_cpu: 7, because u8 x s8 pairs summed into int16 saturate on
  AVX2 CPUs without VNNI under ORT's default optimization level; anchors F, as ORT's `reduce_range`).
- `weights`: op -> {input slot: per-channel axis rule}; an axis rule is an int (negative counts from the end),
  or `"gemm_transB"` (transB=1: axis 0, else axis 1). `bias`: op -> input slot stored as int32 with
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
- `bias_add_ops`: linear ops whose product, read only by an Add of a constant (an exported Linear's bias),
  goes on to that Add unquantized (the runtime takes the bias into the kernel; placement._mark_bias_adds).
- `per_block_weight_bits`: weight bit widths that may be per-block (default 4 and 8); others fall back to
  per-channel and say so.
- `prefold_unfused_weight_dq`: store a weight whose node cannot fuse its DQ into an integer kernel as float
  values on its int grid (quant/prefold.py), so no DequantizeLinear runs per inference. `integer_weight_kernels`:
  op -> {act_bits, output_q} says when the runtime fuses DQ(weight) (output_q: only with a Q on the output,
  possibly behind `output_q_through` ops); other weighted ops (LSTM/GRU/RNN) never do.
  `requantizes_float_weights`: ops whose float weight the runtime re-quantizes itself (keep their DQ).
- `float_kernel_ops`: ops that always run a float kernel on the target (they dequantize their inputs): a
  data-movement output read only by them needs no quantizer of its own (it is on its input's grid already).
- `max_opset_int8` is implicit: per-channel Q/DQ needs opset 13, int16/int4 need opset 21 (anchors B).
"""
from __future__ import annotations

import copy
from typing import Optional

from ..errors import ConfigError

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
_BIAS = {"Conv": 2, "ConvTranspose": 2, "Gemm": 2}
_FIXED = {"Sigmoid": [0.0, 1.0], "Softmax": [0.0, 1.0], "Tanh": [-1.0, 1.0], "HardSigmoid": [0.0, 1.0]}
_FUSED = [["Conv", "Relu"], ["Conv", "Clip"], ["Conv", "LeakyRelu"], ["Conv", "HardSwish"],
          ["Gemm", "Relu"], ["Gemm", "Clip"], ["MatMul", "Relu"], ["Add", "Relu"], ["Add", "Clip"],
          ["ConvTranspose", "Relu"], ["BatchNormalization", "Relu"], ["Conv", "BatchNormalization"]]

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
        "fused_activations": _FUSED,
        "bias_add_ops": ["MatMul", "Gemm"],
        # anchors B, checked on ORT 1.31: Conv->QLinearConv needs an output Q (Relu/Clip before it fold into
        # the Q); MatMul->MatMulIntegerToFloat and Gemm->QGemm take a float output; int16 inputs never fuse
        "prefold_unfused_weight_dq": True,
        "integer_weight_kernels": {"Conv": {"act_bits": 8, "output_q": True},
                                   "MatMul": {"act_bits": 8, "output_q": False},
                                   "Gemm": {"act_bits": 8, "output_q": False}},
        "output_q_through": ["Relu", "Clip"],
        "float_kernel_ops": ["LSTM", "GRU", "RNN"],
        "requantizes_float_weights": ["Conv", "ConvTranspose", "Gemm"],   # prefold.py: WeightBiasQuantization
    },
    "trt": {
        "description": "TensorRT explicit quantization: s8 symmetric activations and weights, bias float",
        "activation": {"bits": 8, "symmetric": True},
        "weight": {"bits": 8, "symmetric": True, "range_bits": 8},
        "wide_activation_bits": None,
        "weights": _WEIGHTS, "bias": {},
        "per_channel_ops": ["Conv", "ConvTranspose", "Gemm", "MatMul"],
        "float_output_ops": NOT_QUANTIZABLE,
        "float_outputs": {"LSTM": [2]},
        "shares_input_encoding": DATA_MOVEMENT,
        "quantize_data_movement_outputs": True,
        "tie_inputs_and_output": ["Concat"],
        "fixed_output_range": {"Sigmoid": [0.0, 1.0], "Tanh": [-1.0, 1.0]},
        "fused_activations": _FUSED,
        "bias_add_ops": ["MatMul", "Gemm"],
    },
    "qnn_htp": {
        "description": "Qualcomm QNN HTP (as AIMET's htp_quantsim_config_v75): u8 asymmetric activations, s8 "
                       "symmetric per-channel Conv weights, per-tensor Gemm/MatMul, int32 bias, data-movement "
                       "outputs unquantized",
        "activation": {"bits": 8, "symmetric": False},
        "weight": {"bits": 8, "symmetric": True, "range_bits": 8},
        "wide_activation_bits": 16,
        "weights": _WEIGHTS, "bias": _BIAS,
        "per_channel_ops": ["Conv", "ConvTranspose", "LSTM", "GRU", "RNN"],
        "float_output_ops": NOT_QUANTIZABLE,
        "float_outputs": {"LSTM": [2]},
        "shares_input_encoding": DATA_MOVEMENT,
        "quantize_data_movement_outputs": False,
        "tie_inputs_and_output": ["Concat"],
        "fixed_output_range": _FIXED,
        "fused_activations": _FUSED + [["Conv", "PRelu"], ["Gemm", "PRelu"]],
    },
}


def get_profile(target) -> dict:
    """The profile named `target` (a deep copy, safe to edit), or a dict/YAML file path given by the user."""
    if isinstance(target, dict):
        base_name = target.get("base", "ort_cpu")
        if base_name not in PROFILES:
            raise ConfigError(f"profile: unknown base '{base_name}'; known targets: {', '.join(PROFILES)}")
        base = copy.deepcopy(PROFILES[base_name])
        unknown = sorted(k for k in target if k not in base and k not in ("base", "name"))
        if unknown:  # a typo must not be silently ignored
            raise ConfigError(f"profile: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(base))}")
        base["name"] = base_name + "+custom"
        base.update(copy.deepcopy(target))
        return base
    if target in PROFILES:
        prof = copy.deepcopy(PROFILES[target])
        prof["name"] = target
        return prof
    if isinstance(target, str) and target.endswith((".yaml", ".yml", ".json")):
        import yaml
        try:
            with open(target) as f:
                data = yaml.safe_load(f)
        except OSError as e:
            raise ConfigError(f"profile '{target}': {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"profile '{target}': not valid YAML ({str(e).splitlines()[0]})") from None
        if not isinstance(data, dict):
            raise ConfigError(f"profile '{target}': expected a mapping at top level")
        return get_profile(data)
    raise ConfigError(f"unknown target '{target}'; known targets: {', '.join(PROFILES)}")


def weight_axis(profile: dict, node, slot: int, rank: int) -> Optional[int]:
    """Per-channel axis of weight input `slot` of `node` under `profile`, normalised to [0, rank)."""
    rule = profile["weights"].get(node.op_type, {}).get(slot)
    if rule is None:
        return None
    if rule == "gemm_transB":
        axis = 0 if node.attr("transB", 0) else 1
    else:
        axis = int(rule)
    if axis < 0:
        axis += rank
    return axis if 0 <= axis < rank else None
