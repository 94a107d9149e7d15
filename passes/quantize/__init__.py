"""The quantization passes: each step of `quantize` as one registered pass on the shared QuantContext
(qcompiler/quant/context.py). The default order is `qcompiler.quant.pipeline.DEFAULT_PIPELINE`; the algorithms
they call live in qcompiler/quant/ (calibrate.py, placement/, qdq.py, ...), one module per job."""
from . import (adaround, bias_correction, calibrate, convert_opset, encodings, float16_islands,  # noqa: F401
               initializer_inputs, insert_qdq, latency_search, measure_latency, measure_sqnr,
               mixed_precision, place, safety_net, seq_mse, smoothquant, untaken_branches, upcast_float16)  # registration

__all__ = ["adaround", "bias_correction", "calibrate", "convert_opset", "encodings", "float16_islands",
           "initializer_inputs", "insert_qdq", "latency_search", "measure_latency", "measure_sqnr",
           "mixed_precision", "place", "safety_net", "seq_mse", "smoothquant", "untaken_branches", "upcast_float16"]
