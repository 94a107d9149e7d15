"""The one table of calibration schemes and their aliases: CLI `--scheme`, config `scheme:`, `quantize(scheme=)`,
the observers and the onnxruntime drop-in all resolve names here, so they accept the same names and refuse an
unknown one with the same one-line message.

- `min_max` (AIMET `post_training_tf`, `tf`; onnxruntime `MinMax`): the observed min and max.
- `tf_enhanced` (AIMET `post_training_tf_enhanced`): the range minimising expected quantization noise.
- `percentile` (AIMET `post_training_percentile`; onnxruntime `Percentile`): onnxruntime's equal-tailed interval at
  99.999 (its default): 0.0005% cut from each end, never less than one value nor less than half a grid step.
- `entropy` (`kl`; onnxruntime `Entropy`): TensorRT's KL-divergence threshold.
- `mse`: the range minimising the mean squared error of the fake-quantized values.
"""
from __future__ import annotations

from typing import Type

from qcompiler.errors import ConfigError
from qcompiler.quant.settings.untrusted import short

SCHEMES = ("min_max", "tf_enhanced", "percentile", "entropy", "mse")
DEFAULT_SCHEME = "min_max"
ALIASES = {
    "post_training_tf": "min_max", "tf": "min_max", "minmax": "min_max", "max": "min_max",
    "post_training_tf_enhanced": "tf_enhanced",
    "post_training_percentile": "percentile",
    "kl": "entropy",
}


def unknown_scheme_message(name) -> str:
    """The one-line message for a scheme name that is in neither table (the name cut to ~40 characters)."""
    return (f"unknown scheme {short(name, 40)} (known: {', '.join(SCHEMES)}; or the aliases tf, minmax, "
            f"post_training_tf*, kl)")


def canonical_scheme(name, error: Type[Exception] = ConfigError) -> str:
    """`name`'s canonical scheme (case-insensitive; aliases resolved); raises `error(unknown_scheme_message)`."""
    if not isinstance(name, str):
        raise error(unknown_scheme_message(name))
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key not in SCHEMES:
        raise error(unknown_scheme_message(name))
    return key
