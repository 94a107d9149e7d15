"""The inputs of weight-only layers on calibration data, in bounded memory (GPTQ's Hessians, AWQ's samples,
the accuracy-level check).

Layers that read the same activation (q/k/v after one norm; gate and up) form one group keyed by that value: one
Hessian or one set of sampled rows serves all of them. Groups are taken a chunk at a time, each chunk as small
as `budget_bytes` of statistics allows, and each chunk costs one onnxruntime pass over the samples with only
its inputs as extra outputs (`layer_inputs.stream_values`): a decoder's every layer input is never held at once,
only one sample's inputs of one chunk. The inputs are the float model's (the layers before are not yet
quantized): one pass per chunk instead of one per layer.
"""
from __future__ import annotations

from typing import Callable, Dict, List

import numpy as np

from qcompiler.errors import DataError
from qcompiler.quant.calibration.layer_inputs import stream_values, value_session

LINEAR_KINDS = ("matmul", "gemm", "head")
DEFAULT_SAMPLES = 128


def require_samples(ctx, what: str) -> None:
    """One DataError line when an algorithm that needs data has none (exit 2 on the command line)."""
    if ctx.samples is None:
        raise DataError(f"{what} needs calibration data: give --calib (weight-only round-to-nearest needs none)")


def input_groups(ctx, jobs=None) -> Dict[str, list]:
    """activation name -> the jobs whose linear readers read it (graph order), for MatMul/Gemm/head readers of
    the main graph (a reader inside an If/Loop/Scan body reads a value onnxruntime does not return: its job
    keeps its data-free grid, as the plan's note says)."""
    g = ctx.model.graph
    nodes = {n.name: n for n in g.nodes}
    groups: Dict[str, list] = {}
    for job in (jobs if jobs is not None else ctx.weight_plan.jobs.values()):
        for node_name, kind in job.readers:
            if kind not in LINEAR_KINDS or node_name not in nodes:
                continue
            node = nodes[node_name]
            x = node.inputs[0]
            if x is None or (node.op_type == "Gemm" and node.attr("transA", 0)):   # rows are x's columns there
                continue
            members = groups.setdefault(x.name, [])
            if job not in members:
                members.append(job)
    return groups


def chunks(groups: Dict[str, list], bytes_of: Callable[[str, list], int], budget_bytes: int) -> List[list]:
    """The group names cut into runs whose statistics fit `budget_bytes` (at least one group each)."""
    out, cur, used = [], [], 0
    for name, jobs in groups.items():
        b = bytes_of(name, jobs)
        if cur and used + b > budget_bytes:
            out.append(cur)
            cur, used = [], 0
        cur.append(name)
        used += b
    if cur:
        out.append(cur)
    return out


def stream_rows(ctx, names: List[str], fn: Callable[[str, np.ndarray], None], max_samples: int = DEFAULT_SAMPLES,
                where: str = "calibration sample", session=None) -> int:
    """Call `fn(name, rows)` for each value in `names` on each calibration sample, rows as float32 [r, K]
    (every leading axis flattened); returns the samples seen. `session`: one `rows_session` made for every
    chunk (else one is built for this call)."""
    seen = 0
    for _, _, arrays in stream_values(ctx.model, ctx.samples, names, where=where, max_samples=max_samples,
                                      role="float", session=session):
        for name in names:
            a = np.asarray(arrays[name], dtype=np.float32)
            fn(name, a.reshape(-1, a.shape[-1]))
        seen += 1
    return seen


def rows_session(ctx, groups: Dict[str, list]):
    """One session that returns the inputs of every group, for all of a pass's chunks (one session load instead
    of one per chunk); each chunk's runs compute only what its own values need."""
    return value_session(ctx.model, list(groups), role="float")


def first_rows(ctx, names: List[str], max_rows: int, max_samples: int, session=None) -> Dict[str, np.ndarray]:
    """The first `max_rows` input rows of each value in `names` over at most `max_samples` calibration samples, as
    float32 [r, K] (None for a value no sample reached): one onnxruntime pass, at most `max_rows` rows kept each."""
    rows: Dict[str, list] = {n: [] for n in names}

    def keep(name, r):
        have = sum(len(a) for a in rows[name])
        if have < max_rows:
            rows[name].append(r[:max_rows - have].copy())
    stream_rows(ctx, names, keep, max_samples=max_samples, session=session)
    return {n: np.concatenate(r) if r else None for n, r in rows.items()}
