from .encoding import Encoding, compute_encoding, quantize_dequantize
