"""The weight-only plan: which weights become 4/8-bit blocks, read by which nodes, and what stays float and why.

Weight-only quantization (`--weight-only`, the `w4a16` preset) keeps every activation float and stores the
weights of MatMul/Gemm, in the main graph and in If/Loop/Scan bodies (and embedding Gathers, where the target
has a kernel) as integer blocks: onnxruntime's CPU runs them as com.microsoft MatMulNBits and GatherBlockQuantized,
TensorRT reads a blocked DequantizeLinear before the float MatMul (the profile's `weight_only` form). The passes
share this plan:

    plan-weights       which weights, in which orientation, tied heads found (passes/quantize/plan_weights.py)
    awq                optional: per-input-channel scales folded where the graph allows, then clipped grids
    weight-grid        the best round-to-nearest grid of each weight not yet gridded (block_grid.py)
    gptq               optional: GPTQ codes instead of round-to-nearest (after weight-grid, from its grids' scheme)
    weight-mixed-precision  with --max-drop: each weight at 4 bits, 8 bits or float by measured output error
    measure-head-bits  with calibration data: the head and embedding at --weight-bits only where it costs little
    check-accuracy-level  MatMulNBits' int8 activations (level 4) only where they cost little
    write-weights      the grids written in the target's form (MatMulNBits, GatherBlockQuantized or DQ)

Every weight is seen as W [N, K]: one row per output channel (N), blocks along the reduction axis K. A MatMul
reads B [K, N] (W = B^T); Gemm with transB=1 and a tied head `x @ Transpose(E)` read [N, K] as stored; an
embedding E [V, H] gathered by token id is W = E (rows = tokens, blocks along H), which is why a tied
embedding and head can share one packed tensor.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

# how a job reads its weight (the orientation rule above)
KINDS = ("matmul", "gemm", "gather", "head")


@dataclass
class WeightJob:
    """One weight tensor to quantize and every node that reads it (a tied embedding: the Gather and the head)."""

    weight: str                     # the initializer's name
    n: int                          # rows (output channels; an embedding's vocabulary)
    k: int                          # the reduction axis, blocked
    bits: int
    block_size: int
    symmetric: bool
    readers: List[tuple] = field(default_factory=list)   # (node name, kind) in graph order
    rows_axis: int = 0              # the stored tensor's axis holding N: 0 -> stored [N, K], 1 -> stored [K, N]
    grid: object = None             # block_grid.BlockGrid once assigned (dropped once written)
    sqnr_db: Optional[float] = None  # the weight's own SQNR on its grid (the report)
    algorithm: str = ""             # "rtn", "gptq", "awq+rtn", ... (the report)
    input_scale: Optional[np.ndarray] = None   # AWQ: W's columns were multiplied by this (inputs divided)
    accuracy_level: Optional[int] = None       # MatMulNBits' accuracy_level, when measured per node
    body: str = ""                  # the If/Loop/Scan node(s) whose body reads it ("" in the main graph)
    end: bool = False               # the logits head or token embedding, widened by the head rule (head_bits)
    per_channel: bool = False       # one block over the whole reduction axis (`--per-channel`, no block size)
    notes: List[str] = field(default_factory=list)

    @property
    def kinds(self) -> tuple:
        return tuple(kind for _, kind in self.readers)

    @property
    def tied(self) -> bool:
        """Read both as an embedding and as a linear layer: one stored copy serves both."""
        return "gather" in self.kinds and len(self.readers) > 1

    def float_bytes(self) -> int:
        return 4 * self.n * self.k

    def stored_bytes(self) -> int:
        """Bytes of the integer codes plus a float32 scale (and a zero point) per block, as written."""
        nb = -(-self.k // self.block_size)
        codes = self.n * nb * (self.block_size * self.bits // 8)
        zp = 0 if self.symmetric else self.n * -(-nb * self.bits // 8)
        return codes + 4 * self.n * nb + zp


@dataclass
class WeightOnlyPlan:
    """What the weight-only passes share: the jobs, keyed by weight name, and the weights left float (why)."""

    form: object                                       # profiles.WeightOnlyForm
    jobs: Dict[str, WeightJob] = field(default_factory=dict)
    left_float: Dict[str, str] = field(default_factory=dict)   # weight (or node) name -> reason
    layer_order: List[str] = field(default_factory=list)       # MatMul/Gemm weights in graph order

    def job_of_node(self, node_name: str) -> Optional[WeightJob]:
        for job in self.jobs.values():
            if any(r == node_name for r, _ in job.readers):
                return job
        return None

    def summary(self) -> dict:
        """The report's `weight_only` section: small whatever the model (per-block scales go to the encodings)."""
        jobs = list(self.jobs.values())
        fb = sum(j.float_bytes() for j in jobs)
        sb = sum(j.stored_bytes() for j in jobs)
        by_alg: Dict[str, int] = {}
        for j in jobs:
            by_alg[j.algorithm or "none"] = by_alg.get(j.algorithm or "none", 0) + 1
        return {"form": {"matmul": self.form.matmul, "gather": self.form.gather},
                "weights": len(jobs), "algorithms": by_alg,
                "tied": sorted(j.weight for j in jobs if j.tied),
                "float_bytes_of_quantized": fb, "stored_bytes": sb,
                "left_float": dict(self.left_float),
                "layers": {j.weight: _layer_entry(j) for j in jobs}}


def default_accuracy_level(settings, form) -> int:
    """MatMulNBits' accuracy_level when no measure decided it: `--accuracy-level`, else 0 under `--optimize
    accuracy` (float activations: level 4's int8 rounding trades accuracy for one-token speed, and is slower for
    long prompts), else the target's."""
    if settings.accuracy_level is not None:
        return settings.accuracy_level
    return 0 if settings.optimize == "accuracy" else form.accuracy_level


def _layer_entry(j: WeightJob) -> dict:
    e = {"readers": [r for r, _ in j.readers], "shape_nk": [j.n, j.k], "bits": j.bits, "block_size": j.block_size,
         "symmetric": j.symmetric, "algorithm": j.algorithm}
    if j.per_channel:
        e["per_channel"] = True
    if j.sqnr_db is not None:
        e["weight_sqnr_db"] = round(float(j.sqnr_db), 2)
    if j.accuracy_level is not None:
        e["accuracy_level"] = j.accuracy_level
    if j.body:
        e["body"] = j.body
    if j.notes:
        e["notes"] = list(j.notes)
    return e
