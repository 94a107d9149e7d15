"""Output-aware rounding of the mixed-precision search's weights: GPTQ on each layer's own grid.

Round-to-nearest on a min/max grid is what made every 4-bit candidate useless on small CNNs (digits_cnn: each
Conv alone at W4A8 dropped 1.9 to 8 %) and cost the 8-bit plain run most of its drop (1.46 % against a 1 %
budget). Each quantized Conv/ConvTranspose/Gemm/MatMul weight of a candidate is instead rounded by GPTQ
(gptq.py's `gptq_quantize`, the numerics of `--recipe gptq`) against the Gram matrix of its input rows
(adaround.py's linear forms and its one-run capture: im2col patches for a Conv), on the grid the plan already
gave it (its scales, zero points and range, so the file and the kernels are unchanged): on digits_cnn the plain
W8A8 run drops 0.9 % instead of 1.46 % and the largest Conv at W4A8 costs about half a point instead of two.

The Gram matrices come from ONE float run over the search's own samples (never the held-out ones, so the
verification stays honest), captured the first time a plan asks for a layer; each (layer, grid) is rounded
once and cached, so the search's many lowerings of the same layer at the same candidate cost nothing more.
The integers go on the plan as learned roundings (`QuantSpec.rounded`, frozen: assign-encodings keeps them and
insert-qdq writes them), the contract adaround already uses. A weight this cannot express as a linear map
(adaround's skip reasons), a per-block grid, one whose grid is not one scale per output row, or a Conv of more
than MAX_GROUPS groups keeps round-to-nearest. GPTQ's loss is the layer's, not the model's: on ppocr_cls a third
of the layers measured a larger drop alone with it than with round-to-nearest, so the search measures both
(search.py: each sensitivity round of an integer candidate twice) and each layer keeps the better
(`keep_nearest`). A layer with far fewer input rows than inputs (MIN_ROWS_PER_INPUT; a Gemm after a Flatten reads
one row per sample: 16 samples for 512 inputs) keeps round-to-nearest too: GPTQ would move its error into the
directions the samples never showed, where other inputs find it.
"""
from __future__ import annotations

import contextlib
import time
from typing import Dict, List, Optional

import numpy as np
from threadpoolctl import threadpool_limits

from qcompiler.passes.quantize.adaround import AdaRoundOptions, _capture, _targets, qrange
from qcompiler.passes.quantize.gptq import gptq_quantize
from qcompiler.quant.core.encoding import broadcast_qparams
from qcompiler.quant.core.qdq import storage_dtype


# the clipping of a narrow grid (NARROW_BITS or fewer): each output row keeps the scale, among these fractions of
# its min/max one, whose GPTQ rounding has the least error on the layer output (a per-tensor grid keeps its own)
CLIP_FRACTIONS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7)
NARROW_BITS = 4
# a grouped Conv with more groups (a wide depthwise one) keeps round-to-nearest: GPTQ runs once per group (every
# depthwise layer of ppocr_cls: 1,800 calls, most of the rounding's time); digits_cnn's 32-channel depthwise Conv
# gains from it (W8A8 alone 0.45 -> 0.26 %)
MAX_GROUPS = 32
# a layer whose calibration rows number fewer than this many per input keeps round-to-nearest: its Gram matrix is
# far from full rank (digits_cnn's last Conv, 256 rows for 288 inputs, still gains from GPTQ: the damping covers it)
MIN_ROWS_PER_INPUT = 0.5


class WeightRounding:
    """GPTQ integers for the weight uses of any plan of `model` (the float model), from `feeds`' input rows."""

    def __init__(self, model, feeds: List[dict]):
        self.model, self.feeds = model, feeds
        self.grams: Dict[str, Optional[List[np.ndarray]]] = {}   # node -> H per group, None: not rounded
        self.cache: Dict[tuple, np.ndarray] = {}
        self.seconds = 0.0
        self.rounded = 0          # weight uses given GPTQ integers (cache hits included)
        self.keep_nearest: set = set()   # (node, weight bits) the search measured better at round-to-nearest
        self.uses: set = set()           # (node, weight bits) given GPTQ integers at least once
        # (node, weight bits) -> the layer output error of GPTQ's integers over round-to-nearest's (0..1, on the
        # search's samples): far below 1, GPTQ clearly wins on the layer (search.py then skips measuring both)
        self.ratio: Dict[tuple, float] = {}
        self.off = False

    def worth_measuring(self, name: str, bits: int) -> bool:
        """Whether the search should also measure layer `name` at `bits` with round-to-nearest weights: not when
        that is the model it just measured (GPTQ kept round-to-nearest's integers, or an earlier round already
        chose round-to-nearest for this layer and width). A smaller GPTQ layer error is no shortcut: on a small
        CNN a layer with a tenth of round-to-nearest's error measured a 16 % larger drop, and skipping it changed
        the plan."""
        return (name, bits) not in self.keep_nearest and self.ratio.get((name, bits), 1.0) < 1.0 - 1e-9

    @contextlib.contextmanager
    def nearest(self):
        """Every weight at round-to-nearest inside the block (the search measures both roundings)."""
        self.off = True
        try:
            yield
        finally:
            self.off = False

    def _capture(self, targets) -> None:
        """The Gram matrices of the targets not seen yet, from one float run."""
        new = [t for t in targets if t[0].name not in self.grams]
        if not new:
            return
        quads, mismatch = _capture(self.model, self.feeds, new, AdaRoundOptions())
        for (node, _, _, _), quad, why in zip(new, quads, mismatch):
            gram = None if why or quad is None else quad.gram
            if gram is None and quad is not None and not why and quad.rows is not None:
                r = np.asarray(quad.rows, np.float64)
                gram = np.matmul(r.transpose(0, 2, 1), r) / max(quad.count, 1)
            if gram is not None and quad.count < MIN_ROWS_PER_INPUT * gram.shape[-1]:
                gram = None     # far fewer input rows than inputs (module docstring)
            self.grams[node.name] = None if gram is None else list(gram)

    def apply(self, model, plan) -> int:
        """Give every eligible weight use of `plan` (of `model`, after assign-encodings) its GPTQ integers;
        returns how many."""
        if self.off:
            return 0
        t0 = time.perf_counter()
        targets, _ = _targets(model, plan)
        targets = [t for t in targets if (t[0].name, int(t[1].encoding.bits)) not in self.keep_nearest]
        with threadpool_limits(1, "blas"):
            self._capture(targets)
            done = 0
            for node, spec, layer, _ in targets:
                grams = self.grams.get(node.name)
                if grams is None:
                    continue
                got = self._round(node.name, spec.encoding, layer, grams)
                if got is None:
                    continue
                self.uses.add((node.name, int(spec.encoding.bits)))
                spec.rounded, spec.encoding.scale, ratio = got
                self.ratio[(node.name, int(spec.encoding.bits))] = ratio
                spec.frozen = True
                spec.encoding.frozen = True
                spec.encoding.meta["gptq"] = True
                done += 1
        self.rounded += done
        self.seconds += time.perf_counter() - t0
        return done

    def _round(self, name: str, enc, layer, grams) -> Optional[tuple]:
        """(integers in the weight's layout, the encoding's scale with the chosen clipping, their layer output error
        over round-to-nearest's), None: not rounded."""
        if enc.block_size or len(grams) > MAX_GROUPS:
            return None
        qlo, qhi = qrange(enc)
        bits = int(np.ceil(np.log2(qhi - qlo + 1)))
        key = (name, qlo, qhi, enc.axis, np.asarray(enc.scale).tobytes(), np.asarray(enc.zero_point).tobytes())
        if key in self.cache:
            return self.cache[key]
        self.cache[key] = None      # below: the rounding, when this grid has one
        if not 1 <= bits <= 8:
            return None
        scale, zp = broadcast_qparams(enc, layer.weight.shape)
        full = layer.weight.shape
        s_lin = layer.to_lin(np.broadcast_to(scale, full))
        z_lin = layer.to_lin(np.broadcast_to(zp, full))
        if not (np.all(s_lin == s_lin[..., :1]) and np.all(z_lin == z_lin[..., :1])):
            return None     # not one grid per output row: GPTQ's column loop assumes one
        w_lin = layer.to_lin(layer.weight)
        per_row = enc.axis is not None
        fractions = CLIP_FRACTIONS if bits <= NARROW_BITS and per_row else (1.0,)
        out = np.empty(w_lin.shape, np.float64)
        scales = np.empty(w_lin.shape[:2], np.float64)
        err_gptq = err_nearest = 0.0
        for g in range(w_lin.shape[0]):
            w = np.asarray(w_lin[g], np.float64)
            s_row = s_lin[g, :, 0].astype(np.float64)
            zp_row = z_lin[g, :, 0].astype(np.float64) - qlo
            h = np.asarray(grams[g], np.float64)
            # every fraction at once: GPTQ's rows are independent, so the candidates are rows of one stacked call
            f = np.repeat(np.asarray(fractions, np.float64), len(s_row))
            s_all, z_all = np.tile(s_row, len(fractions)) * f, np.tile(zp_row, len(fractions))

            def grid(_block, s=s_all.astype(np.float32), z=z_all):
                return s, z
            try:
                codes, _, _, _ = gptq_quantize(np.tile(w, (len(fractions), 1)).astype(np.float32), h, bits, None,
                                               grid_fn=grid)
            except (ValueError, np.linalg.LinAlgError):
                return None
            # round-to-nearest on the plan's grid is a candidate too: no row ends worse than it on its own loss
            q = np.concatenate([np.clip(codes.astype(np.float64) + qlo, qlo, qhi),
                                np.clip(np.rint(w / s_row[:, None]) + zp_row[:, None] + qlo, qlo, qhi)])
            s_all = np.concatenate([s_all, s_row])
            e = np.tile(w, (len(fractions) + 1, 1)) - (q - np.concatenate([z_all, zp_row])[:, None] - qlo) * \
                s_all[:, None]
            loss = np.sum((e @ h) * e, axis=1).reshape(len(fractions) + 1, -1)   # each row's output error
            pick = np.argmin(loss, axis=0)                 # ties: the first, the min/max grid itself
            rows = pick * len(s_row) + np.arange(len(s_row))
            out[g], scales[g] = q[rows], s_all[rows]
            err_gptq += float(np.sum(loss[pick, np.arange(len(s_row))]))
            err_nearest += float(np.sum(loss[-1]))
        ints = layer.from_lin(out).astype(storage_dtype(enc))
        # the chosen clipping, per output row, back in the encoding's own layout
        scale = np.asarray(layer.from_lin(scales[..., None] * np.ones_like(w_lin)), np.float64)
        if enc.axis is not None:
            other = tuple(i for i in range(scale.ndim) if i != enc.axis)
            scale = scale.max(axis=other) if other else scale
        else:
            scale = scale.ravel()[0]
        ratio = err_gptq / err_nearest if err_nearest > 0 else 1.0
        self.cache[key] = (ints, np.asarray(scale, np.asarray(enc.scale).dtype).reshape(np.shape(enc.scale)), ratio)
        return self.cache[key]

