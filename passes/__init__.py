"""Built-in passes. Importing this package registers them; third-party passes use the `qcompiler.passes`
entry-point group. Each module holds one pass (or one family) and a docstring that says why."""
# registration side effects
from qcompiler.passes import (  # noqa: F401
               canonicalize,
               constant_weights,
               cross_layer_equalization,
               fold_batchnorm,
               fold_constants,
               fold_conv_bias_add,
               fold_weight_layout,
               fuse_hardswish,
               inline_functions,
               scale_folding,
               shape_inference,
               shape_simplify,
               supergroups,
)

__all__ = ["canonicalize", "constant_weights", "cross_layer_equalization", "fold_batchnorm", "fold_constants",
           "fold_conv_bias_add", "fold_weight_layout", "fuse_hardswish", "inline_functions", "scale_folding",
           "shape_inference", "shape_simplify", "supergroups"]
