from .encoding import Encoding, compute_encoding, quantize_dequantize
from .api import QuantizeResult, quantize
from .plan import QuantPlan, QuantSpec
from .profiles import PROFILES, get_profile
