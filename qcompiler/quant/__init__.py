"""Post-training quantization: `quantize()` and the pieces it is built from (plan, profiles, encodings)."""
from qcompiler.quant.api import QuantizeResult, quantize
from qcompiler.quant.core.encoding import (
           Encoding,
           compute_encoding,
           quantize_dequantize,
)
from qcompiler.quant.core.plan import QuantPlan, QuantSpec
from qcompiler.quant.targets.profiles import PROFILES, get_profile

__all__ = ["Encoding", "compute_encoding", "quantize_dequantize", "QuantizeResult", "quantize", "QuantPlan",
           "QuantSpec", "PROFILES", "get_profile"]
