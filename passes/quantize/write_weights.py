"""`write-weights`: the weight-only grids written in the target's form (the profile's `weight_only`).

- MatMulNBits (onnxruntime CPU/CUDA, com.microsoft): each MatMul/Gemm/head reading a planned weight becomes one
  MatMulNBits on the packed codes, its scales and (asymmetric grids) packed zero points, with the job's
  `accuracy_level`; a Gemm's bias becomes an Add after it. An embedding Gather becomes GatherBlockQuantized. A tied
  embedding and head read ONE packed tensor (qcompiler/quant/core/nbits.py says how onnxruntime takes it).
- DequantizeLinear (TensorRT, AIMET): the weight becomes integer codes in its stored layout and one blocked
  opset-21 DequantizeLinear (signed, no zero point) that every reader reads instead of the float tensor.

The float initializer goes once its readers are rewritten (`Graph.substitute` / `drop_if_unused`), so the file
holds each weight once, narrow. Int8 weight-only is stored int8 too (MatMulNBits bits=8), never float on a grid.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx

from qcompiler.ir import verify
from qcompiler.passes.quantize.plan_weights import weight_value
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.core import nbits
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.core.encoding import Encoding
from qcompiler.quant.core.weight_only import default_accuracy_level

MS = "com.microsoft"


def _scale_dtype(value):
    """The scales' float type: the weight's own (a float16 model keeps float16 scales, as MatMulNBits requires)."""
    return np.float16 if value.dtype == onnx.TensorProto.FLOAT16 else np.float32


def write_nbits(ctx, job) -> int:
    """Rewrite the readers of `job` as MatMulNBits / GatherBlockQuantized; returns the nodes written. A reader
    inside an If/Loop/Scan body is rewritten in its body; the packed tensors live where the weight lived (the
    body reads them from the outer scope)."""
    value = weight_value(ctx.model.graph, job.weight)
    g = value.graph
    dt = _scale_dtype(value)
    level = job.accuracy_level if job.accuracy_level is not None else \
        default_accuracy_level(ctx.settings, ctx.profile.weight_only)
    name, grid = job.weight, job.grid
    linear = any(kind != "gather" for _, kind in job.readers)
    packed = nbits.pack_matmul_nbits(grid) if linear else None
    consts: dict = {}

    def const(key, arr):
        if key not in consts:
            consts[key] = g.add_constant(arr, f"{name}_{key}")
        return consts[key]
    written = 0
    nodes = {n.name: n for b in g.all_graphs() for n in b.nodes}
    for node_name, kind in job.readers:
        node = nodes[node_name]
        ng = node.graph
        if kind == "gather":
            attrs = {"bits": grid.bits, "block_size": grid.block_size, "gather_axis": 0, "quantize_axis": 1}
            if linear:      # tied: the head's packed table, viewed 2-D ([V, nb * blob]) for the lookup
                b = const("nbits", packed["B"])
                shape = const("table_shape", np.array([b.shape[0], b.shape[1] * b.shape[2]], np.int64))
                table = ng.add_node("Reshape", [b, shape], [f"{name}_table"], name=f"{name}_table",
                                   before=node).outputs[0]
                scales = const("scales", packed["scales"].astype(dt))
                zps = None if packed["zero_points"] is None else const("zero_points", packed["zero_points"])
            else:
                gq = nbits.pack_gather_block_quantized(grid)
                table = const("gather", gq["data"])
                scales = const("scales", gq["scales"].astype(dt))
                zps = None if gq["zero_points"] is None else const("zero_points", gq["zero_points"])
            padded = linear and job.k != grid.n_blocks * grid.block_size
            new = ng.add_node("GatherBlockQuantized", [table, node.inputs[1], scales] + ([zps] if zps is not None
                                                                                        else []),
                             [node.outputs[0].name + ("_padded" if padded else "_q")], attrs=attrs,
                             name=f"{node.name}_gbq", domain=MS, before=node)
            out = new.outputs[0]
            if padded:      # the lookup is nb * block_size wide: cut it to K
                cut = [const(k, np.array([x], np.int64)) for k, x in (("start", 0), ("end", job.k), ("axis", -1))]
                out = ng.add_node("Slice", [out] + cut, [node.outputs[0].name + "_q"], name=f"{node.name}_slice",
                                 before=node).outputs[0]
            ng.substitute(node.outputs[0], out, remove=[node])
        else:
            transpose = node.inputs[1].producer if kind == "head" else None
            b = const("nbits", packed["B"])
            scales = const("scales", packed["scales"].astype(dt))
            zps = None if packed["zero_points"] is None else const("zero_points", packed["zero_points"])
            attrs = dict(packed["attrs"])
            if level:
                attrs["accuracy_level"] = int(level)
            a = node.inputs[0]
            if kind == "gemm" and node.attr("transA", 0):
                a = ng.add_node("Transpose", [a], [a.name + "_t"], attrs={"perm": [1, 0]}, name=f"{node.name}_a_t",
                                before=node).outputs[0]
            new = ng.add_node("MatMulNBits", [a, b, scales] + ([zps] if zps is not None else []),
                              [node.outputs[0].name + "_q"], attrs=attrs, name=f"{node.name}_nbits", domain=MS,
                              before=node)
            out = new.outputs[0]
            macs = ctx.plan.macs if ctx.plan is not None else {}
            if node.name in macs:       # the summary's integer share follows the node to its new name
                macs[new.name] = macs.pop(node.name)
            if kind == "gemm":
                out = _gemm_epilogue(ng, node, out, dt)
            ng.substitute(node.outputs[0], out, remove=[node])
            if transpose is not None and not transpose.outputs[0].uses():
                transpose.graph.remove_node(transpose)
        written += 1
    g.drop_if_unused([value])
    return written


def _gemm_epilogue(g, node, out, dt):
    """What a Gemm adds to x @ W^T: alpha (a Mul), then beta * C (an Add; C of any shape Gemm broadcasts to
    [M, N], which Add broadcasts the same way; beta folded into a constant C, else a Mul)."""
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    if alpha != 1.0:
        out = g.add_node("Mul", [out, g.add_constant(np.array(alpha, dt), f"{node.name}_alpha")],
                         [node.outputs[0].name + "_alpha"], name=f"{node.name}_alpha", before=node).outputs[0]
    c = node.inputs[2] if len(node.inputs) > 2 else None
    if c is None or beta == 0.0:
        return out
    if beta != 1.0:
        if c.tensor is not None:
            c = g.add_constant(np.asarray(c.tensor.numpy() * beta).astype(c.tensor.numpy().dtype), f"{c.name}_beta")
        else:
            c = g.add_node("Mul", [c, g.add_constant(np.array(beta, dt), f"{node.name}_beta")],
                           [c.name + "_beta"], name=f"{node.name}_beta", before=node).outputs[0]
    return g.add_node("Add", [out, c], [node.outputs[0].name + "_bias"], name=f"{node.name}_bias",
                      before=node).outputs[0]


def dq_form(grid, signed: bool):
    """A BlockGrid as DequantizeLinear's inputs: codes [N, K] in int4/int8 (signed: q - zero point, no zero
    point input, which needs a symmetric grid) or uint4/uint8 with per-block zero points."""
    q = grid.q.astype(np.int16)
    nb = grid.scales.shape[1]
    idx = np.minimum(np.arange(q.shape[1]) // grid.block_size, nb - 1)
    zp = np.asarray(grid.zero_points)
    if signed:
        if not grid.symmetric:
            raise ValueError("a signed DequantizeLinear form takes symmetric grids only")
        codes = (q - zp[:, idx].astype(np.int16)).astype(np.int8)
        return (codes.astype(ml_dtypes.int4) if grid.bits == 4 else codes), grid.scales, None
    codes = q.astype(np.uint8)
    zero = zp.astype(np.uint8)
    if grid.bits == 4:
        return codes.astype(ml_dtypes.uint4), grid.scales, zero.astype(ml_dtypes.uint4)
    return codes, grid.scales, zero


def _node_in(g, node):
    """The node of `g` that is `node` or holds it in a body (a weight read inside an If/Loop/Scan)."""
    while node.graph is not g:
        node = node.graph.parent
    return node


def write_dq(ctx, job) -> int:
    """Replace the weight by integer codes in its stored layout and one blocked DequantizeLinear."""
    value = weight_value(ctx.model.graph, job.weight)
    g = value.graph
    grid = job.grid
    signed = ctx.profile.weight_only.signed
    codes, scale, zero = dq_form(grid, signed)        # [N, K] codes, [N, nb] scales, zero points or None
    axis = 1
    if job.rows_axis == 1:                                          # stored [K, N]: blocks along axis 0
        codes, scale = codes.T, scale.T
        zero = None if zero is None else zero.T
        axis = 0
    dt = _scale_dtype(value)
    attrs = {"axis": axis, "block_size": int(grid.block_size)}
    if job.per_channel:     # one block over K: the per-axis DequantizeLinear (scales along N) every runtime reads
        n_axis = 1 - axis
        scale = np.take(scale, 0, axis=axis)
        zero = None if zero is None else np.take(zero, 0, axis=axis)
        attrs = {"axis": n_axis}
    q = g.add_constant(np.ascontiguousarray(codes), f"{job.weight}_q")
    s = g.add_constant(np.ascontiguousarray(scale.astype(dt)), f"{job.weight}_scale")
    ins = [q, s] + ([g.add_constant(np.ascontiguousarray(zero), f"{job.weight}_zero_point")] if zero is not None
                    else [])
    first = min((_node_in(g, u.user) for u in value.uses()), key=lambda n: g.nodes.index(n))
    dq = g.add_node("DequantizeLinear", ins, [job.weight + "_dq"], name=f"{job.weight}_dq",
                    attrs=attrs, before=first)
    g.replace_all_uses(value, dq.outputs[0])
    g.drop_if_unused([value])
    return 1


def job_encoding(job) -> Encoding:
    """The job's grid as a per-block Encoding in the weight's stored layout (the encodings file's entry): a
    stored [K, N] weight is blocked along axis 0 with scales [nb, N], a stored [N, K] one along axis 1."""
    grid = job.grid
    scale, zp = np.asarray(grid.scales, np.float32), np.rint(np.asarray(grid.zero_points, np.float64))
    axis = 1
    if job.rows_axis == 1:
        scale, zp, axis = scale.T, zp.T, 0
    if job.per_channel:       # one scale per output channel, along the stored N axis
        return Encoding(scale=np.ascontiguousarray(np.take(scale, 0, axis=axis)),
                        zero_point=np.ascontiguousarray(np.take(zp, 0, axis=axis).astype(np.int64)), bits=grid.bits,
                        symmetric=grid.symmetric, signed=False, axis=1 - axis,
                        meta={"weight_only": True, "algorithm": job.algorithm})
    return Encoding(scale=np.ascontiguousarray(scale), zero_point=np.ascontiguousarray(zp.astype(np.int64)),
                    bits=grid.bits, symmetric=grid.symmetric, signed=False, axis=axis, block_size=grid.block_size,
                    meta={"weight_only": True, "algorithm": job.algorithm})


@register_pass
class WriteWeights(QuantPass):
    name = "write-weights"
    description = "weight-only: the grids written as MatMulNBits/GatherBlockQuantized or blocked DequantizeLinear"
    preserves_semantics = False
    requires = ("quant-context", "weight-grids")
    ensures = ("weights-written", "quantized")

    def run(self, ctx) -> PassResult:
        plan = ctx.weight_plan
        form = plan.form
        written = 0
        for job in plan.jobs.values():
            ctx.params[job.weight] = job_encoding(job)     # the encodings file's per-block entry
            written += write_nbits(ctx, job) if form.matmul == "MatMulNBits" else write_dq(ctx, job)
            job.grid = None           # the codes are in the model now; the report keeps the job's summary
        if form.matmul == "MatMulNBits" and plan.jobs:
            ctx.model.opset_imports.setdefault(MS, 1)
        verify(ctx.model.graph)
        return PassResult(True, {"weights": len(plan.jobs), "nodes": written})
