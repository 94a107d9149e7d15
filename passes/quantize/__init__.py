"""The quantization passes: each step of `quantize` as one registered pass on the shared QuantContext
(qcompiler/quant/core/context.py), each algorithm whole in its module. The default order is
`qcompiler.quant.core.pipeline.DEFAULT_PIPELINE` (weight-only: `WEIGHT_ONLY_PIPELINE`); importing this package
registers every pass."""
from qcompiler.passes.quantize import (  # noqa: F401  (registration)
    adaround,
    awq,
    bias_correction,
    calibrate,
    check_accuracy_level,
    convert_opset,
    encodings,
    float16_islands,
    gptq,
    head_bits,
    initializer_inputs,
    insert_qdq,
    latency_search,
    measure_latency,
    measure_sqnr,
    mixed_precision,
    narrow_float_weights,
    place,
    plan_weights,
    reference_outputs,
    safety_net,
    seq_mse,
    smoothquant,
    untaken_branches,
    upcast_float16,
    weight_grid,
    weight_mixed_precision,
    write_weights,
)
