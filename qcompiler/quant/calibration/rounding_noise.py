"""What MatMulNBits' int8 activations (accuracy_level 4) would add to a layer's input, gathered during calibration.

At accuracy_level 4 onnxruntime's CPU kernel rounds each input row to int8 per block of the reduction axis
(scale max|x|/127) before the integer dot products. The rounding error e of each input channel k is nearly
independent of the others', so the layer's output error power is Σ_k E[e_k²]·‖w_k‖² (w_k: the weights that
channel k multiplies): two numbers per input channel, E[e_k²] and E[x_k²], tell how much level 4 costs a layer,
for whatever weights a later pass gives it. Calibration gathers them for the inputs a pass asks for
(`rounding_noise_request`) on the float model it already runs, so no second session of a large model has to
capture those inputs again (on a 0.5 B decoder that session was the run's memory peak, +2 GB).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

MAX_ROWS = 2048        # input rows accumulated per value (the first ones: as many as the capture kept)


def emulate_level4(x: np.ndarray, block: int) -> np.ndarray:
    """`x` [r, K] as accuracy_level 4 sees it: symmetric int8 per block of `block` along K, scale max|x|/127."""
    r, k = x.shape
    nb = -(-k // block)
    pad = np.zeros((r, nb * block), np.float32)
    pad[:, :k] = x
    b = pad.reshape(r, nb, block)
    scale = np.abs(b).max(axis=2, keepdims=True) / 127.0
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(b / scale), -127, 127) * scale
    return q.reshape(r, nb * block)[:, :k]


class RoundingNoise:
    """Per input channel: Σ e_k² (level-4 rounding error) and Σ x_k² over the first MAX_ROWS rows of a value."""

    def __init__(self, block: int, max_rows: int = MAX_ROWS):
        self.block, self.max_rows = int(block), int(max_rows)
        self.noise: Optional[np.ndarray] = None
        self.power: Optional[np.ndarray] = None
        self.rows = 0

    def update(self, arr) -> None:
        a = np.asarray(arr)
        if self.rows >= self.max_rows or a.ndim == 0 or not a.size or a.dtype.kind != "f":
            return
        x = a.reshape(-1, a.shape[-1])[:self.max_rows - self.rows].astype(np.float32, copy=False)
        if not np.isfinite(x).all():
            return
        if self.noise is None:
            self.noise = np.zeros(x.shape[1], np.float64)
            self.power = np.zeros(x.shape[1], np.float64)
        elif self.noise.shape[0] != x.shape[1]:
            return
        e = emulate_level4(x, self.block) - x
        self.noise += np.einsum("rk,rk->k", e, e, dtype=np.float64)
        self.power += np.einsum("rk,rk->k", x, x, dtype=np.float64)
        self.rows += len(x)

    def output_db(self, w: np.ndarray, output_mean_sq: Optional[float] = None) -> Optional[float]:
        """SQNR of the level-4 product with `w` [N, K] against the float-activation one: noise Σ_k E[e_k²]‖w_k‖²
        per output row, signal N·E[y²] from the layer output's own statistics (`output_mean_sq`), else
        Σ_k E[x_k²]‖w_k‖² (independent channels). None when nothing was gathered or `w` does not fit."""
        if not self.rows or self.noise is None or w.ndim != 2 or w.shape[1] != self.noise.shape[0]:
            return None
        col = np.einsum("nk,nk->k", w, w, dtype=np.float64)
        noise = float(self.noise @ col) / self.rows
        signal = w.shape[0] * float(output_mean_sq) if output_mean_sq is not None and output_mean_sq > 0 \
            else float(self.power @ col) / self.rows
        if noise <= 0:
            return float("inf")
        return float(10 * np.log10(signal / noise)) if signal > 0 else float("-inf")
