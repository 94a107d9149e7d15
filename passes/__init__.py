"""Built-in passes. Importing this package registers them; third-party passes use the `qcompiler.passes`
entry-point group. Each module holds one pass (or one family) and a docstring that says why."""
from . import canonicalize, fold_constants, shape_inference  # noqa: F401  (registration side effects)

__all__ = ["canonicalize", "fold_constants", "shape_inference"]
