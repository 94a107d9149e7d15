"""Post-training quantization: `quantize()` and the pieces it is built from (plan, profiles, encodings)."""
from .encoding import Encoding, compute_encoding, quantize_dequantize
from .api import QuantizeResult, quantize
from .plan import QuantPlan, QuantSpec
from .profiles import PROFILES, get_profile

__all__ = ["Encoding", "compute_encoding", "quantize_dequantize", "QuantizeResult", "quantize", "QuantPlan",
           "QuantSpec", "PROFILES", "get_profile"]
