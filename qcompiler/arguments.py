"""Argument checks for the Python API: a wrong type or an out-of-range value is one ArgumentError line.

The CLI's options are typed by click; a Python caller can pass anything (`quantize(None, ...)`,
`weight_bits=8.0`, `per_channel='no'`, `save_model('str', path)`), and without these checks that surfaced as an
AttributeError or TypeError deep inside. Each message names the argument, what it got (its type, or a short
repr) and what it accepts.
"""
from __future__ import annotations

import os

from qcompiler.errors import ArgumentError
from qcompiler.input_files import check_path_text
from qcompiler.ir.model import Model
from qcompiler.shorten import (
    short_argument as got,  # what a caller passed, in a few words (qcompiler/shorten.py)
)


def require_model(value, what: str = "model"):
    """`value` must be a qcompiler IR Model; returns it."""
    if not isinstance(value, Model):
        hint = ""
        if isinstance(value, (str, os.PathLike)):
            hint = " (load it with qcompiler.onnx_io.load_model)"
        elif hasattr(value, "SerializeToString"):
            hint = " (convert it with qcompiler.onnx_io.model_from_proto)"
        raise ArgumentError(f"{what} must be a qcompiler Model, got {got(value)}{hint}")
    return value


def require_bool(value, what: str) -> bool:
    if not isinstance(value, bool):
        raise ArgumentError(f"{what} must be True or False, got {got(value)}")
    return value


def require_choice(value, what: str, choices) -> str:
    """One of the names in `choices` (a str: never a number or a list that happens to compare equal)."""
    if not isinstance(value, str) or value not in choices:
        raise ArgumentError(f"{what} must be one of {', '.join(choices)}, got {got(value)}")
    return value


def require_int(value, what: str, lo: "int | None" = None, hi: "int | None" = None, choices=None) -> int:
    """An int (never a bool, a float or a str) in [lo, hi] or among `choices`."""
    ok_type = isinstance(value, int) and not isinstance(value, bool)
    if choices is not None:
        if not ok_type or value not in choices:
            raise ArgumentError(f"{what} must be one of {', '.join(map(str, choices))}, got {got(value)}")
        return value
    if not ok_type or (lo is not None and value < lo) or (hi is not None and value > hi):
        if lo is not None and hi is not None:
            want = f"an integer in {lo}..{hi}"
        elif lo is not None:
            want = "a positive integer" if lo == 1 else f"an integer >= {lo}"
        else:
            want = "an integer"
        raise ArgumentError(f"{what} must be {want}, got {got(value)}")
    return value


def require_path(value, what: str) -> str:
    """A str or os.PathLike naming a file (not empty, no NUL byte); returns it as a str."""
    if not isinstance(value, (str, bytes, os.PathLike)):
        raise ArgumentError(f"{what} must be a path (str or os.PathLike), got {got(value)}")
    return check_path_text(value, what, ArgumentError)
