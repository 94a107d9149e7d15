"""The quantization passes: each step of `quantize` as one registered pass on the shared QuantContext
(qcompiler/quant/core/context.py). The default order is `qcompiler.quant.core.pipeline.DEFAULT_PIPELINE`; the algorithms
they call live in qcompiler/quant/ (calibrate.py, placement/, qdq.py, ...), one module per job."""
from qcompiler.passes.quantize import (  # noqa: F401
               adaround,
               bias_correction,
               calibrate,
               convert_opset,
               encodings,
               float16_islands,
               initializer_inputs,
               insert_qdq,
               latency_search,
               measure_latency,
               measure_sqnr,
               mixed_precision,  # registration
               place,
               safety_net,
               seq_mse,
               smoothquant,
               untaken_branches,
               upcast_float16,
)

__all__ = ["adaround", "bias_correction", "calibrate", "convert_opset", "encodings", "float16_islands",
           "initializer_inputs", "insert_qdq", "latency_search", "measure_latency", "measure_sqnr",
           "mixed_precision", "place", "safety_net", "seq_mse", "smoothquant", "untaken_branches", "upcast_float16"]
