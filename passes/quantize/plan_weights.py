"""`plan-weights`: the weight-only plan: every MatMul/Gemm weight and embedding the target can run narrow.

A weight qualifies when it is a rank-2 float initializer (of the main graph or an If/Loop/Scan body) read as the
second input of a MatMul, the weight of a Gemm (any alpha, beta, transA and bias C), through a
`Transpose(perm=[1, 0])` by a MatMul (the tied head exporters write as `MatMul(x, Transpose(embedding))`), or as
the table of a `Gather(axis=0)` (an embedding) when the target has a quantized Gather. A weight several nodes read is ONE job: a tied embedding and head share one stored copy, so the
file holds it once (onnxruntime's own quantizer leaves such a head float; folding the Transpose into a second
copy doubled it). What stays float says why: another reader that needs the float tensor, an orientation two
readers disagree on, a Gemm attribute the narrow kernel does not take, an excluded node, a width the target
does not run.

Bits, block and symmetry come from the switches (`--weight-bits`, `--block-size`: default 32 at 4 bits and 128
at 8 bits; zero points where the target allows them) and per node from a config's rules (`weights.bits`,
`weights.per_block`), so "the head and the first and last layers at 8 bits" is one rule.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from qcompiler.errors import ArgumentError
from qcompiler.passmanager import PassResult, register_pass
from qcompiler.quant.core.context import QuantPass
from qcompiler.quant.core.weight_only import WeightJob, WeightOnlyPlan

FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
DEFAULT_BLOCK = {4: 32, 8: 128}
NBITS_BLOCKS = (16, 32, 64, 128, 256)   # MatMulNBits / GatherBlockQuantized: a power of two >= 16


def _weight(v):
    """`v` when it is a rank-2 float initializer (of the main graph, or of an If/Loop/Scan body), else None."""
    if v is None or v.tensor is None or v.is_input or v.graph.initializers.get(v.name) is not v:
        return None
    shape = v.shape
    if shape is None or len(shape) != 2 or v.dtype not in FLOAT_TYPES or 0 in shape:
        return None
    return v


def _transposed_weight(v):
    """The initializer E when `v` is `Transpose(E, perm=[1, 0])` (or no perm) read only as a MatMul weight."""
    p = v.producer if v is not None else None
    if p is None or p.op_type != "Transpose" or p.domain not in ("", "ai.onnx"):
        return None
    perm = p.attr("perm")
    if perm is not None and list(perm) != [1, 0]:
        return None
    return _weight(p.inputs[0])


def weight_reads(g, bodies: bool = True):
    """(weight value, node, kind, why-not) for every candidate read in the main graph and (`bodies`) its
    If/Loop/Scan bodies, main graph first, each graph in its order; `why-not` is "" for a read the weight-only
    form can take."""
    out = []
    for node in (n for graph in (g.all_graphs() if bodies else [g]) for n in graph.nodes):
        if node.op_type == "MatMul" and node.domain in ("", "ai.onnx") and len(node.inputs) == 2:
            w = _weight(node.inputs[1])
            if w is not None:
                out.append((w, node, "matmul", ""))
                continue
            e = _transposed_weight(node.inputs[1])
            if e is not None:
                t = node.inputs[1].producer
                other = [u.user for u in node.inputs[1].uses() if u.user is not node]
                out.append((e, node, "head", "" if not other else
                            f"its Transpose '{t.name[:60]}' is read by other nodes too"))
        elif node.op_type == "Gemm" and node.domain in ("", "ai.onnx") and len(node.inputs) >= 2:
            w = _weight(node.inputs[1])
            if w is None:
                continue
            # transA, alpha, beta and a C of any broadcastable shape: the writer adds a Transpose, a Mul, an Add
            out.append((w, node, "gemm_t" if node.attr("transB", 0) else "gemm", ""))
        elif node.op_type == "Gather" and node.domain in ("", "ai.onnx") and len(node.inputs) == 2:
            w = _weight(node.inputs[0])
            if w is not None and int(node.attr("axis", 0)) in (0, -2):
                out.append((w, node, "gather", ""))
    return out


# which axis of the stored tensor is N (rows) for each kind: 1 -> stored [K, N], 0 -> stored [N, K]
ROWS_AXIS = {"matmul": 1, "gemm": 1, "gemm_t": 0, "head": 0, "gather": 0}


def _node_settings(ctx, node):
    cfg = ctx.options.config if ctx.options is not None else None
    return cfg.settings_for(node) if cfg is not None else None


def build_weight_plan(ctx) -> WeightOnlyPlan:
    plan = WeightOnlyPlan(form=ctx.profile.weight_only)
    g = ctx.model.graph
    reads = weight_reads(g)
    by_weight: dict = {}
    for w, node, kind, why in reads:
        by_weight.setdefault(w.name, (w, []))[1].append((node, kind, why))
    for name, (w, readers) in by_weight.items():
        reason = _float_reason(ctx, w, readers)
        if reason:
            plan.left_float[name] = reason
            continue
        rows_axis = ROWS_AXIS[readers[0][1]]
        n, k = int(w.shape[rows_axis]), int(w.shape[1 - rows_axis])
        bits, block, symmetric, end, per_channel = _grid_of(ctx, readers, k)
        job = WeightJob(weight=name, n=n, k=k, bits=bits, block_size=block, symmetric=symmetric,
                        readers=[(node.name, "gemm" if kind == "gemm_t" else kind) for node, kind, _ in readers],
                        rows_axis=rows_axis, end=end, per_channel=per_channel)
        bodies = sorted({f"{o.op_type} '{o.name[:60]}'" for o in map(body_owner, (r[0] for r in readers)) if o})
        if bodies:
            job.body = ", ".join(bodies)
            job.notes.append(f"read inside the body of {job.body}: gridded without data (gptq, awq and the "
                             f"accuracy_level check read main-graph activations only)")
        plan.jobs[name] = job
        if any(kind != "gather" for _, kind, _ in readers):
            plan.layer_order.append(name)
    return plan


def body_owner(node):
    """The main-graph If/Loop/Scan whose body (at any depth) holds `node`; None for a main-graph node."""
    owner = None
    while node.graph.parent is not None:
        owner = node = node.graph.parent
    return owner


def _float_reason(ctx, w, readers) -> str:
    form = ctx.profile.weight_only
    for node, kind, why in readers:
        if why:
            return f"{node.op_type} '{node.name[:60]}': {why}"
        if kind == "gather" and form.gather is None:
            return f"an embedding: {ctx.profile.name} has no quantized Gather kernel (it stays float)"
        ns = _node_settings(ctx, node)
        if ns is not None and (not ns.weight_quantized or ns.keep_float):
            return f"its reader '{node.name[:60]}' is kept float (--exclude, --op-types or the config)"
    axes = {ROWS_AXIS[kind] for _, kind, _ in readers}
    if len(axes) > 1:
        return "read in two orientations (as [K, N] and as [N, K]): one stored copy cannot serve both"
    readers_set = {node for node, _, _ in readers}
    transposes = {node.inputs[1].producer for node, kind, _ in readers if kind == "head"}
    other = [u.user for u in w.uses() if u.user not in readers_set and u.user not in transposes]
    if other:
        u = other[0]
        what = f"{u.op_type} '{u.name[:60]}'" if hasattr(u, "op_type") else "a graph output"
        return f"also read by {what}, which needs the float tensor"
    return ""


LAYOUT_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Cast", "Identity", "Flatten")


def is_head(node) -> bool:
    """A linear node whose output is a graph output, directly or through layout ops (a decoder's logits)."""
    todo, seen = [node.outputs[0]], 0
    while todo and seen < 16:
        v, seen = todo.pop(), seen + 1
        if v is None:
            continue
        if v.is_graph_output() and v.graph.parent is None:    # a body's output is not the model's
            return True
        todo.extend(u.user.outputs[0] for u in v.uses() if getattr(u.user, "op_type", None) in LAYOUT_OPS)
    return False


def _grid_of(ctx, readers, k):
    """(bits, block size, symmetric, end, per_channel) for a weight: the switches; the width of the model's ends, the logits head
    and the token embedding (`head_bits`, default 8 when the weights are narrower: on the test decoders a 4-bit
    head or embedding costs more logits SQNR than all the 4-bit layers between them, onnxruntime's quantizer
    leaves both float, and 8-bit heads are what onnxruntime-genai's mixed mode writes); then a config rule on
    any reader (the widest wins). `end`: the head/embedding rule gave its width (measure-head-bits may revise
    it on calibration data)."""
    s, form = ctx.settings, ctx.profile.weight_only
    if s.per_channel is False:
        raise ArgumentError("weight-only grids are per block (--block-size) or per channel (--per-channel): "
                            "--per-tensor has no weight-only form")
    settings = [ns for ns in (_node_settings(ctx, node) for node, _, _ in readers) if ns is not None]
    bits = max((ns.weight_bits for ns in settings), default=s.weight_bits)
    block = next((ns.weight_block for ns in settings if ns.weight_block), None) or s.weight_block
    per_channel = s.per_channel is True and block is None
    ruled = [ns for ns in settings if ns.matched_rules]
    end = False
    if ruled:          # a config rule on a reader decides (the widest reader wins)
        bits = max(ns.weight_bits for ns in ruled)
        block = next((ns.weight_block for ns in ruled if ns.weight_bits == bits and ns.weight_block), block)
    elif any(kind == "gather" or is_head(node) for node, kind, _ in readers):
        head = s.head_bits if s.head_bits is not None else max(bits, 8)
        end = s.head_bits is None and head != bits
        if head != bits:
            bits, block = head, None
    if bits not in form.bits:
        raise ArgumentError(f"weight-only weights of {bits} bits: {ctx.profile.name} runs "
                            f"{' or '.join(str(b) for b in form.bits)} bits")
    if per_channel:
        return bits, channel_block(form, k), _symmetry(ctx), end, True
    block = block or DEFAULT_BLOCK.get(bits, 32)
    if form.matmul == "MatMulNBits" and block not in NBITS_BLOCKS:
        raise ArgumentError(f"block size {block}: MatMulNBits takes a power of two from 16 to 256")
    return bits, block, _symmetry(ctx), end, False


def channel_block(form, k: int) -> int:
    """The block of a per-channel grid (one block over the whole reduction axis K): K itself for a
    DequantizeLinear form; for MatMulNBits, whose block_size is a power of two of at least 16, the next one at or
    above K (onnxruntime 1.32 runs blocks up to 4096 and longer than K, the tail padded: checked in the tests)."""
    if form.matmul != "MatMulNBits":
        return int(k)
    return max(16, 1 << (int(k) - 1).bit_length())


def _symmetry(ctx) -> bool:
    s, form = ctx.settings, ctx.profile.weight_only
    sym = s.weight_symmetric
    symmetric = (not form.zero_points) if sym is None else bool(sym)
    if not symmetric and not form.zero_points:
        raise ArgumentError(f"{ctx.profile.name} runs weight-only grids without zero points: they are symmetric")
    return symmetric


def weight_value(g, name: str):
    """The initializer `name` of the main graph `g` or of one of its bodies (value names are model-wide)."""
    v = g.initializers.get(name)
    if v is None:
        v = next(b.initializers[name] for b in g.subgraphs() if name in b.initializers)
    return v


def stored_nk(job, value) -> np.ndarray:
    """The job's weight as float32 W [N, K] (rows = output channels), whatever way it is stored: a stored [K, N]
    weight is returned as its transposed view (no copy: the grid search reads it a chunk of rows at a time)."""
    arr = np.asarray(value.tensor.numpy_uncached(), dtype=np.float32)
    return arr if job.rows_axis == 0 else arr.T


@register_pass
class PlanWeights(QuantPass):
    name = "plan-weights"
    description = "weight-only: which MatMul/Gemm weights and embeddings become narrow blocks, tied heads found"
    requires = ("quant-context",)
    ensures = ("weight-plan",)

    def run(self, ctx) -> PassResult:
        if ctx.profile.weight_only is None:
            raise ArgumentError(f"target {ctx.profile.name} has no weight-only kernel: quantize its activations "
                                f"too (W8A16: --act-bits 16) or pick --target ort_cpu or trt")
        ctx.weight_plan = build_weight_plan(ctx)
        p = ctx.weight_plan
        tied = [j.weight for j in p.jobs.values() if j.tied]
        if tied:
            ctx.notes.append(f"tied embedding and head: {', '.join(t[:60] for t in tied)} stored once, read by "
                             f"the Gather and the head")
        in_bodies = [j for j in p.jobs.values() if j.body]
        if in_bodies:
            ctx.notes.append(f"{len(in_bodies)} weights read inside If/Loop/Scan bodies "
                             f"({', '.join(sorted({j.body for j in in_bodies}))[:120]}) stored narrow too; their grids "
                             f"use no data (gptq, awq and the accuracy_level check read main-graph activations)")
        return PassResult(False, {"weights": len(p.jobs), "float": len(p.left_float), "tied": len(tied),
                                  "in_bodies": len(in_bodies)})
