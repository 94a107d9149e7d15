"""Signal-to-quantization-noise ratio: the one definition the verifier, the report and the tests share.

SQNR = 10·log10(Σref² / Σ(ref − got)²) in dB; +inf when the two agree exactly, −inf when the reference is all
zeros but the other is not. Top level (not in quant/) because passmanager's verifier cannot import quant."""
from __future__ import annotations

import math

import numpy as np


def db_from_powers(signal: float, noise: float) -> float:
    """SQNR in dB from the summed signal and noise powers (sums kept while samples stream in)."""
    if noise == 0.0:
        return float("inf")
    return float(10 * math.log10(signal / noise)) if signal > 0 else float("-inf")


def powers(ref, got) -> tuple:
    """(Σref², Σ(ref − got)²) in float64, flattened; einsum, not a BLAS dot, which would spin OpenBLAS threads
    against onnxruntime's (calibrate.py)."""
    ref = np.asarray(ref, np.float64).reshape(-1)
    with np.errstate(all="ignore"):   # outputs that overflow (inf - inf): a nan SQNR, not RuntimeWarning lines
        d = ref - np.asarray(got, np.float64).reshape(-1)
        return float(np.einsum("i,i->", ref, ref)), float(np.einsum("i,i->", d, d))


def sqnr_db(ref, got) -> float:
    """SQNR of `got` against `ref` in dB."""
    return db_from_powers(*powers(ref, got))
