"""The quantization passes: each step of `quantize` as one registered pass on the shared QuantContext
(qcompiler/quant/context.py). The default order is `qcompiler.quant.pipeline.DEFAULT_PIPELINE`; the algorithms
they call live in qcompiler/quant/ (calibrate.py, placement/, qdq.py, ...), one module per job."""
from . import adaround  # noqa: F401  (issue 15: learned weight rounding)
from . import (bias_correction, calibrate, convert_opset, encodings, float16_islands,  # noqa: F401
               insert_qdq, measure_latency, measure_sqnr, place, safety_net, smoothquant)  # registration

__all__ = ["bias_correction", "calibrate", "convert_opset", "encodings", "float16_islands", "insert_qdq",
           "measure_latency", "measure_sqnr", "place", "safety_net", "smoothquant"]
