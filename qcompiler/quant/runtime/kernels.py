"""Which nodes of a QDQ model run on onnxruntime integer kernels, and why the others stay float.

`kernel_report(model, fusions="ort_cpu")` builds an onnxruntime CPU session with default optimizations, has it
write its optimized graph (`SessionOptions.optimized_model_filepath`) into a private temporary folder that is
removed afterwards (never beside the user's files; its initializers go to an external file that is not read
back), maps each optimized node to the node of the input model it came from, and returns a `KernelReport`:
one `NodeKernel` per node of the input model other than QuantizeLinear/DequantizeLinear, saying which op runs
it (`kernel`), whether that is integer arithmetic (`integer`) and, for a float one, why (`reason`), from the
fusion table (qcompiler/quant/targets/fusion_tables/ort_cpu.yaml) checked against the node's DQ inputs and Q outputs.

Mapping optimized nodes back (onnxruntime keeps no provenance; this is a heuristic, measured on onnxruntime
1.32 with the corpus models and tests/quant/test_latency_tools.py):
1. a node whose name is a node name of the input model is that node (the QDQ actions give QLinearAdd, QLinearMul,
   QLinearGlobalAveragePool, QLinearSoftmax, QLinearMatMul, ... the target node's name);
2. else the name with onnxruntime's suffixes cut (`_token_<n>` added when a name is taken again, e.g.
   QLinearConv `Conv@1_token_98` after the NHWC layout pass; `_nchwc` of the NCHWc Conv) is a node name, or
   else an output tensor name of the input model whose producer is the node (the NCHWc Conv is named after its
   Conv's output: `conv2d_53.tmp_0_nchwc`);
3. else an output of the optimized node that is a tensor of the input model maps it to that tensor's producer
   (through a QuantizeLinear to the node the Q quantizes);
4. an unnamed node onnxruntime made (HardSwish inlined as HardSigmoid + Mul) takes the node of its readers when
   they agree (a Q of the input model, or optimized nodes mapped already; walked from the outputs back).
Nodes onnxruntime adds (layout Transpose, ReorderInput/ReorderOutput) map to nothing and are only counted.
An input node with no optimized node left was removed: absorbed into its producer's kernel (Relu/Clip made
redundant by a Q, an activation fused into a float Conv), constant-folded, or dropped as a no-op; `kernel`
then says which (`absorbed by QLinearConv`, `fused into Conv`, `removed`). A data-movement op that stays is
integer when it reads an integer tensor (its Q/DQ were dropped) and float otherwise.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Optional

import onnx
from onnx import TensorProto, numpy_helper

from qcompiler.onnx_io import model_to_proto
from qcompiler.ort_session import SESSION_PREFIX, create_session
from qcompiler.quant.targets.fusions import FusionTable, load_fusions

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
# ops that move or select elements: in an optimized graph they run on whatever type they read
MOVES = {"Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Gather", "GatherElements", "Expand",
         "Tile", "MaxPool", "Split", "Resize", "Identity", "ReduceMax", "ReduceMin", "ReorderInput",
         "ReorderOutput", "NhwcMaxPool", "Pad", "DepthToSpace", "SpaceToDepth", "Concat"}
# integer kernels whose output is float (the rest output integers)
FLOAT_OUT = {"MatMulIntegerToFloat", "DynamicQuantizeMatMul", "MatMulNBits", "QAttention", "DynamicQuantizeLSTM",
             "QEmbedLayerNormalization", "ConvInteger", "MatMulInteger"}
LAYOUT_OPS = {"Transpose", "ReorderInput", "ReorderOutput"}
_SUFFIX = re.compile(r"(/[A-Za-z0-9]*Fusion|_token_\d+|_nchwc)$")
_DTYPE = {TensorProto.UINT8: "uint8", TensorProto.INT8: "int8", TensorProto.UINT16: "uint16",
          TensorProto.INT16: "int16", TensorProto.INT32: "int32", TensorProto.FLOAT: "float32",
          TensorProto.FLOAT16: "float16", getattr(TensorProto, "INT4", 22): "int4",
          getattr(TensorProto, "UINT4", 21): "uint4"}


@dataclass
class NodeKernel:
    """How one node of the input model runs in onnxruntime's optimized graph."""

    node: str                   # its name; "<unnamed Op #i>" (position i in the graph) when it has none
    op: str
    kernel: str                 # optimized op type(s) that run it, or "absorbed by X" / "fused into X" / "removed"
    integer: bool
    optimized: tuple = ()       # names of the optimized nodes mapped to it
    reason: str = ""            # why it is not on an integer kernel ("" when it is)


@dataclass
class KernelReport:
    nodes: list
    optimized_ops: dict                      # op type -> count in the optimized graph
    added_nodes: int = 0                     # optimized nodes mapped to no input node (layout, reorder)
    runtime_qdq: dict = field(default_factory=dict)   # Q/DQ left in the optimized graph: {"activation DQ": n, ...}
    shape_nodes: int = 0                     # input nodes on integer shape tensors (not listed in `nodes`)

    @property
    def integer_count(self) -> int:
        return sum(n.integer for n in self.nodes)

    @property
    def float_nodes(self) -> list:
        return [n for n in self.nodes if not n.integer and n.kernel != "removed"]

    def to_dict(self) -> dict:
        return {"integer_nodes": self.integer_count, "float_nodes": len(self.float_nodes),
                "optimized_ops": dict(self.optimized_ops), "added_nodes": self.added_nodes,
                "runtime_qdq": dict(self.runtime_qdq),
                "shape_nodes": self.shape_nodes, "nodes": [asdict(n) for n in self.nodes]}

    def reasons(self) -> Counter:
        """{reason with node names cut: count} over the float nodes, for a short summary."""
        return Counter(re.sub(r"'[^']*'", "'…'", n.reason) for n in self.float_nodes)


def _proto(model):
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    if hasattr(model, "SerializeToString"):
        return model
    return model_to_proto(model)


def optimized_graph(model, threads: Optional[int] = 1):
    """onnxruntime's optimized graph of `model` (default optimization level) as a ModelProto without weights."""
    folder = tempfile.mkdtemp(prefix=f"{SESSION_PREFIX}{os.getpid()}-opt-")
    try:
        path = os.path.join(folder, "optimized.onnx")
        create_session(model, role="quantized", threads=threads, optimized_path=path)
        return onnx.load(path, load_external_data=False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


_NON_FLOAT_OUT = {"Shape", "Size", "NonZero", "ArgMax", "ArgMin", "Equal", "Less", "Greater", "LessOrEqual",
                  "GreaterOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf", "TopK", "NonMaxSuppression",
                  "QuantizeLinear", "DynamicQuantizeLinear"}
_FIRST_INPUT_DECIDES = {"Gather", "GatherElements", "GatherND", "Reshape", "Expand", "Slice", "Tile", "Pad",
                        "Squeeze", "Unsqueeze", "Transpose", "Flatten", "Identity", "Split", "Resize", "ScatterND",
                        "ScatterElements"}
_FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16)


def _float_tensors(g) -> set:
    """Names of the floating-point tensors of a graph (one forward pass in node order; no weight decoded)."""
    fl = {t.name for t in g.initializer if t.data_type in _FLOAT_TYPES}
    fl |= {i.name for i in g.input if i.type.tensor_type.elem_type in _FLOAT_TYPES}
    for n in g.node:
        op = n.op_type
        if op in _NON_FLOAT_OUT:
            continue
        if op == "DequantizeLinear":
            out = True
        elif op == "Cast":
            out = any(a.name == "to" and a.i in _FLOAT_TYPES for a in n.attribute)
        elif op == "ConstantOfShape":
            out = not any(a.name == "value" and a.t.data_type not in _FLOAT_TYPES for a in n.attribute)
        elif op == "Constant":
            out = any(a.name in ("value_float", "value_floats") or (a.name == "value" and a.t.data_type in
                                                                     _FLOAT_TYPES) for a in n.attribute)
        elif op in _FIRST_INPUT_DECIDES:
            out = bool(n.input) and n.input[0] in fl
        elif op == "Where":
            out = any(i in fl for i in n.input[1:3])
        else:
            out = any(i in fl for i in n.input if i) or not any(n.input)
        if out:
            fl.update(o for o in n.output if o)
    return fl


class _Graph:
    """Producer/consumer maps and tensor types of a GraphProto (metadata only: no weight is decoded)."""

    def __init__(self, g):
        self.g = g
        self.nodes = {n.name: n for n in g.node if n.name}
        self.producer, self.consumers = {}, {}
        for n in g.node:
            for o in n.output:
                if o:
                    self.producer[o] = n
            for i in n.input:
                if i:
                    self.consumers.setdefault(i, []).append(n)
        self.inits = {t.name: t for t in g.initializer}
        self.graph_outputs = {o.name for o in g.output}
        self.graph_inputs = {i.name for i in g.input}

    def qdq_dtype(self, node) -> str:
        """The integer type a Q produces or a DQ reads."""
        if node.op_type == "DequantizeLinear":
            x = node.input[0]
            if x in self.inits:
                return _DTYPE.get(self.inits[x].data_type, "?")
            p = self.producer.get(x)
            if p is not None and p.op_type == "QuantizeLinear":
                return self.qdq_dtype(p)
        for a in node.attribute:
            if a.name == "output_dtype" and a.i:
                return _DTYPE.get(a.i, "?")
        zp = node.input[2] if len(node.input) > 2 and node.input[2] else None
        if zp and zp in self.inits:
            return _DTYPE.get(self.inits[zp].data_type, "?")
        return "uint8"

    def scalar(self, name):
        """The value of a scalar initializer (a scale or zero point), else None."""
        t = self.inits.get(name)
        if t is None or len(t.dims) > 1 or (t.dims and t.dims[0] != 1):
            return None
        return numpy_helper.to_array(t).reshape(-1)[0].item()


def _int_tensors(g) -> set:
    """Names of the integer-typed activations of an optimized graph (forward over the topological order)."""
    ints = {t.name for t in g.initializer if t.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16,
                                                                  TensorProto.DOUBLE)}
    for n in g.node:
        op = n.op_type
        if op in ("QuantizeLinear", "DynamicQuantizeLinear") or (
                op.startswith("QLinear") or op in ("QGemm", "NhwcMaxPool")) and op not in FLOAT_OUT:
            if op == "QGemm" and len(n.input) < 8:   # no y_scale: float output
                continue
            ints.add(n.output[0])
        elif op in MOVES and n.input and n.input[0] in ints:
            ints.update(o for o in n.output if o)
    return ints


def _is_integer(n, ints: set, table: FusionTable) -> bool:
    if table.is_integer_kernel(n.op_type):
        return True
    return n.op_type in MOVES and bool(n.input) and n.input[0] in ints


def _map(nodes: list, orig: _Graph) -> dict:
    """{index in `nodes` (the optimized graph's): input-model node name} (see the module docstring)."""
    out = {}
    for k, n in enumerate(nodes):
        if n.op_type in QDQ_OPS and n.name in orig.nodes:
            continue
        cand = n.name
        hit = None
        for _ in range(4):
            if not cand:
                break
            if cand in orig.nodes:
                hit = cand
                break
            p = orig.producer.get(cand)
            if p is not None and p.name and p.op_type not in QDQ_OPS:
                hit = p.name
                break
            cut = _SUFFIX.sub("", cand)
            if cut == cand:
                break
            cand = cut
        if hit is None and n.op_type not in LAYOUT_OPS:
            for o in n.output:
                p = orig.producer.get(o)
                if p is not None and p.op_type == "QuantizeLinear":
                    p = orig.producer.get(p.input[0])
                if p is not None and p.name and p.op_type not in QDQ_OPS:
                    hit = p.name
                    break
        if hit is not None and orig.nodes[hit].op_type not in QDQ_OPS:
            out[k] = hit
    # 4. unnamed nodes onnxruntime made (a function body inlined: HardSwish -> HardSigmoid + Mul) take the node
    # of their readers when those agree: the Q that reads them, or optimized nodes mapped already
    readers = {}
    for k, n in enumerate(nodes):
        for i in n.input:
            readers.setdefault(i, []).append(k)
    for k in range(len(nodes) - 1, -1, -1):
        n = nodes[k]
        if n.name or n.op_type in LAYOUT_OPS or k in out:
            continue
        hits = set()
        for o in n.output:
            for c in readers.get(o, []):
                cn = nodes[c]
                if cn.op_type == "QuantizeLinear" and cn.name in orig.nodes:
                    p = orig.producer.get(orig.nodes[cn.name].input[0])
                    hits.add(p.name if p is not None and p.op_type not in QDQ_OPS else None)
                else:
                    hits.add(out.get(c))
        if len(hits) == 1 and None not in hits:
            out[k] = hits.pop()
    return out


def _why(node, g: _Graph, table: FusionTable) -> str:
    """Why `node` of the QDQ model is not on an integer kernel, from the fusion table; "" when it cannot tell."""
    op = node.op_type
    recs = [r for r in table.for_op(op) if r.action in ("replace", "drop_qdq")]
    if not recs:
        dq_in = sum(1 for i in node.input if i and getattr(g.producer.get(i), "op_type", "") == "DequantizeLinear")
        q_out = sum(1 for o in node.output for c in g.consumers.get(o, []) if c.op_type == "QuantizeLinear")
        cost = f"; it reads {dq_in} DQ and feeds {q_out} Q of its own" if dq_in or q_out else ""
        return f"onnxruntime CPU has no integer kernel for {op}{cost}"
    r = recs[0]
    kernel = r.kernel_for(op) or f"{op} on integers"
    slots = [i for i, x in enumerate(node.input) if x]
    if r.dq_inputs == "first":
        slots = slots[:1]
    elif r.dq_inputs == "values":
        slots = [i for i in slots if i in (1, 2)]
    dqs, why = {}, []
    for i in slots:
        x = node.input[i]
        p = g.producer.get(x)
        if p is not None and p.op_type == "DequantizeLinear":
            dqs[i] = p
        elif x in g.inits:
            what = "weight" if i == 1 and op in ("Conv", "MatMul", "Gemm", "ConvTranspose") else \
                "bias" if i == 2 and op in ("Conv", "Gemm") else "constant"
            why.append(f"input {i} '{x[:60]}' is a float {what} initializer, not read through DequantizeLinear")
        elif p is not None:
            why.append(f"input {i} comes from float {p.op_type} '{p.name[:60]}' with no Q/DQ between")
        else:
            why.append(f"input {i} '{x[:60]}' is a float graph input with no Q/DQ")
    if why:
        why[-1] += f" ({kernel} needs {'each input' if r.dq_inputs != 'first' else 'its input'} through a DQ)"
    act = g.qdq_dtype(dqs[slots[0]]) if slots and slots[0] in dqs else None
    for i, d in dqs.items():
        dt = g.qdq_dtype(d)
        allowed = r.weight_dtypes if (i == 1 and r.weight_dtypes) else r.act_dtypes
        if i == 2 and r.bias_dtype:
            if dt != r.bias_dtype:
                why.append(f"bias DQ reads {dt}, {kernel} takes {r.bias_dtype} only")
        elif allowed and dt not in allowed:
            bits = "16-bit" if "16" in dt else "4-bit" if "4" in dt else dt
            why.append(f"input {i} is {bits} ({dt}): {kernel} takes {'/'.join(allowed)} only")
    if r.int8_act_needs_int8_weight and act == "int8" and 1 in dqs and g.qdq_dtype(dqs[1]) != "int8":
        why.append(f"int8 activations with {g.qdq_dtype(dqs[1])} weights: {kernel} needs int8 weights then")
    if r.output_q == "required" or (r.output_q == "optional" and r.kernel_without_q is None):
        why.extend(_why_output(node, g, r, kernel, act, dqs.get(slots[0]) if slots else None))
    if r.int8_act == "x86" and act == "int8":
        q = g.producer.get(dqs[slots[0]].input[0])
        if q is not None and q.op_type == "QuantizeLinear" and _readers_through_dq(g, q) > 1:
            why.append("int8 activation read by several nodes: onnxruntime gives each reader its own DQ "
                       "(EnsureUniqueDQForNodeUnit), so its Q feeds several DQs and the x86 S8->U8 rewrite (one "
                       f"Q->DQ pair only) leaves it int8, which {kernel} takes only on ARM")
    return "; ".join(why)


_QMIN = {"uint8": 0, "int8": -128, "uint16": 0, "int16": -32768, "uint4": 0, "int4": -8}


def _relu_redundant(g: _Graph, q) -> bool:
    """onnxruntime's IsClipMadeRedundantByQ for Relu: the Q's zero point is its type's minimum."""
    zp = g.scalar(q.input[2]) if len(q.input) > 2 and q.input[2] else 0
    return zp is None or zp == _QMIN.get(g.qdq_dtype(q), zp)


def _readers_through_dq(g: _Graph, q) -> int:
    """How many nodes read `q`'s output through a DequantizeLinear (after onnxruntime duplicates shared DQs)."""
    n = 0
    for d in g.consumers.get(q.output[0], []):
        n += len(g.consumers.get(d.output[0], [])) if d.op_type == "DequantizeLinear" else 1
    return n


def _why_output(node, g: _Graph, r, kernel: str, act, dq) -> list:
    """Why the output side of `node` keeps it off `kernel` (missing, mixed, mistyped or unequal Q)."""
    for o in (o for o in node.output if o):
        if o in g.graph_outputs:
            return [f"its output '{o[:60]}' is a graph output (no Q can follow; {kernel} needs one)"]
        cons = g.consumers.get(o, [])
        if not cons:
            return []
        if len(cons) == 1 and cons[0].op_type in r.absorbs:
            nxt = g.consumers.get(cons[0].output[0], [])
            if len(nxt) == 1 and nxt[0].op_type == "QuantizeLinear":
                if cons[0].op_type == "Relu" and not _relu_redundant(g, nxt[0]):
                    return [f"the Relu '{cons[0].name[:60]}' before its output Q is not made redundant by the Q "
                            f"(zero point is not the type's minimum), so {kernel} cannot absorb it"]
                cons = nxt
        bad = [c for c in cons if c.op_type != "QuantizeLinear"]
        if bad:
            c = bad[0]
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            return [f"its output feeds float {c.op_type} '{c.name[:60]}'{more} with no QuantizeLinear between: "
                    f"{kernel} needs a Q on its output"]
        qdt = {g.qdq_dtype(c) for c in cons}
        if r.same_dtype and act is not None and qdt != {act}:
            return [f"its output Q is {'/'.join(sorted(qdt))} but its input is {act} ({kernel} needs one type)"]
        if r.equal_qparams and dq is not None:
            s_in, z_in = g.scalar(dq.input[1]), g.scalar(dq.input[2]) if len(dq.input) > 2 else 0
            for c in cons:
                s_out, z_out = g.scalar(c.input[1]), g.scalar(c.input[2]) if len(c.input) > 2 else 0
                if s_in is None or s_out is None:
                    return ["its input DQ or output Q has a per-channel or non-constant scale (a drop needs scalars)"]
                if s_in != s_out or (z_in or 0) != (z_out or 0):
                    return [f"its input and output encodings differ (scale {s_in:.3g} vs {s_out:.3g}): onnxruntime "
                            f"drops the Q/DQ around {node.op_type} only when they are equal"]
                if r.positive_scale and s_in <= 0:
                    return ["its scale is not positive"]
    return []


def _fallback(node, g: _Graph) -> str:
    """The reason when the table's limits all hold: int8 activations on x86, else 'kept float'."""
    for i in node.input:
        p = g.producer.get(i)
        if p is not None and p.op_type == "DequantizeLinear" and g.qdq_dtype(p) == "int8" and i not in g.inits \
                and p.input[0] not in g.inits:
            return ("int8 activation: on x86 onnxruntime fuses int8 only after rewriting its Q->DQ pair to uint8 "
                    "(QDQS8ToU8Transformer), which it did not do here")
    return "fits the fusion table's limits, but onnxruntime kept it float"


def _nearby(orig: _Graph, name: str, kinds: dict) -> Optional[str]:
    """The optimized kernel of the nearest input-model producer of `name` that kept a kernel."""
    n = orig.nodes[name]
    for x in n.input:
        p = orig.producer.get(x)
        while p is not None and p.op_type in QDQ_OPS:
            p = orig.producer.get(p.input[0])
        if p is not None and p.name in kinds:
            return kinds[p.name]
    return None


BIAS_FUSERS = {"QGemm", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "Gemm", "FusedGemm"}
FUSES_ACTIVATION = {"Conv", "FusedConv", "Gemm", "FusedGemm", "MatMul", "FusedMatMul"}
ACTIVATIONS = {"Relu", "Clip", "HardSwish", "HardSigmoid", "Sigmoid", "LeakyRelu", "Tanh", "Gelu"}


def kernel_report(model, fusions="ort_cpu", threads: Optional[int] = 1) -> KernelReport:
    """Per node of the QDQ `model` (IR, ModelProto or bytes): the kernel onnxruntime runs it on and why not integer.

    `fusions`: a fusion table name or path (fusions.load_fusions) or a FusionTable. onnxruntime refusing the
    model raises OnnxRuntimeError (ort_session.create_session).
    """
    table = fusions if isinstance(fusions, FusionTable) else load_fusions(fusions)
    proto = _proto(model)
    opt = optimized_graph(proto, threads=threads)
    orig = _Graph(proto.graph)
    ints = _int_tensors(opt.graph)
    opt_nodes = list(opt.graph.node)
    mapping = _map(opt_nodes, orig)
    by_orig = {}
    added = 0
    for i, n in enumerate(opt_nodes):
        k = mapping.get(i)
        if k is None:
            if n.op_type not in QDQ_OPS:
                added += 1
            continue
        by_orig.setdefault(k, []).append(n)
    kinds = {}
    for k, ns in by_orig.items():
        main = [n for n in ns if n.op_type not in LAYOUT_OPS] or ns
        kinds[k] = "+".join(sorted({n.op_type for n in main}))
    rows = []
    floats = _float_tensors(proto.graph)
    shape_nodes = 0
    for idx, n in enumerate(proto.graph.node):
        if n.op_type in QDQ_OPS or n.op_type == "Constant":
            continue
        if not any(o in floats for o in n.output if o):
            shape_nodes += 1   # integer shape arithmetic (Shape -> Gather -> Concat): nothing to quantize
            continue
        name = n.name or f"<unnamed {n.op_type} #{idx}>"   # NOTE: unique, so callers can key rows by node
        ns = by_orig.get(n.name, []) if n.name else []
        if ns:
            main = [m for m in ns if m.op_type not in LAYOUT_OPS] or ns
            integer = any(_is_integer(m, ints, table) for m in main)
            row = NodeKernel(name, n.op_type, kinds[n.name], integer, tuple(m.name for m in ns if m.name))
        else:
            near = _nearby(orig, n.name, kinds) if n.name in orig.nodes else None
            if near and table.is_integer_kernel(near) and (n.op_type in ("Relu", "Clip") or (
                    n.op_type == "Add" and near.split("+")[0] in BIAS_FUSERS)):
                row = NodeKernel(name, n.op_type, f"absorbed by {near}", True)
            elif near and n.op_type in ACTIVATIONS and near.split("+")[0] in FUSES_ACTIVATION:
                row = NodeKernel(name, n.op_type, f"fused into {near}", table.is_integer_kernel(near))
            else:
                row = NodeKernel(name, n.op_type, "removed", False)
        if not row.integer and row.kernel != "removed":
            row.reason = _why(n, orig, table) or _fallback(n, orig)
            if row.kernel.startswith("fused into"):
                row.reason = f"fused into a float kernel; {row.reason}"
        rows.append(row)
    qdq = Counter()
    opt_inits = {t.name for t in opt.graph.initializer}
    for n in opt.graph.node:
        if n.op_type == "DequantizeLinear":
            qdq["weight DQ" if n.input[0] in opt_inits else "activation DQ"] += 1
        elif n.op_type == "QuantizeLinear":
            qdq["Q"] += 1
    return KernelReport(rows, dict(Counter(n.op_type for n in opt.graph.node)), added, dict(qdq), shape_nodes)


__all__ = ["NodeKernel", "KernelReport", "kernel_report", "optimized_graph"]
