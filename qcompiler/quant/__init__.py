"""Post-training quantization: `quantize()` and the pieces it is built from (plan, profiles, encodings)."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from qcompiler.quant.api import QuantizeResult, quantize
    from qcompiler.quant.core.encoding import Encoding, compute_encoding, quantize_dequantize
    from qcompiler.quant.core.plan import QuantPlan, QuantSpec
    from qcompiler.quant.targets.profiles import PROFILES, get_profile

__all__ = ["Encoding", "compute_encoding", "quantize_dequantize", "QuantizeResult", "quantize", "QuantPlan",
           "QuantSpec", "PROFILES", "get_profile"]


def __getattr__(name: str):
    """The public names load on first use: a module that needs one piece of quant/ (a graph pass reading
    calibration inputs, the command line's switch table) does not import the whole quantizer and onnxruntime."""
    if name in ("quantize", "QuantizeResult"):
        from qcompiler.quant import api
        return getattr(api, name)
    if name in ("Encoding", "compute_encoding", "quantize_dequantize"):
        from qcompiler.quant.core import encoding
        return getattr(encoding, name)
    if name in ("QuantPlan", "QuantSpec"):
        from qcompiler.quant.core import plan
        return getattr(plan, name)
    if name in ("PROFILES", "get_profile"):
        from qcompiler.quant.targets import profiles
        return getattr(profiles, name)
    raise AttributeError(f"module 'qcompiler.quant' has no attribute '{name}'")
