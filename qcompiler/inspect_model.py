"""What `qcompiler inspect` reports: op histogram, inputs/outputs, shared constants and their readers,
subgraphs and pattern matches, as a dict (for --json) and as text."""
from __future__ import annotations

from collections import Counter

import numpy as np
import onnx

from qcompiler.ir.model import Model
from qcompiler.patterns import all_patterns, find_matches

_DT = {v: k for k, v in onnx.TensorProto.DataType.items()}


def _vinfo(v) -> dict:
    return {"name": v.name, "dtype": _DT.get(v.dtype, "unknown").lower() if v.dtype else "unknown",
            "shape": None if v.shape is None else ["?" if d is None else d for d in v.shape]}


def shared_constants(model: Model) -> list:
    """Constants (initializers or Constant-node outputs) read by more than one node, with their readers."""
    out = []
    for g in model.graphs():
        cands = list(g.initializers.values()) + [n.outputs[0] for n in g.nodes_by_op("Constant") if n.outputs and n.outputs[0] is not None]
        for v in cands:
            if v.is_input:
                continue
            readers = [u.user.name for u in v.uses() if not u.is_graph_output]
            if len(readers) > 1:
                out.append({"name": v.name, "graph": g.name, "shape": list(v.shape or ()), "readers": readers})
    return out


def inspect_model(model: Model, with_patterns: bool = True) -> dict:
    g = model.graph
    hist = Counter(n.op_type for gg in model.graphs() for n in gg)
    info = {
        "ir_version": model.ir_version,
        "opset_imports": model.opset_imports,
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "nodes": sum(hist.values()),
        "op_histogram": dict(hist.most_common()),
        "inputs": [_vinfo(v) for v in g.inputs if v.tensor is None],
        "outputs": [_vinfo(v) for v in g.outputs],
        "initializers": len(g.initializers),
        "shared_constants": shared_constants(model),
        "subgraphs": [{"name": sg.name, "owner": sg.parent.name, "owner_op": sg.parent.op_type, "nodes": len(sg),
                       "captures": sorted({v.name for n in sg for v in n.inputs
                                           if v is not None and not sg.is_ancestor_of(v.graph)})}
                      for sg in g.subgraphs(True)],
    }
    q = quantization(model)
    if q is not None:
        info["quantization"] = q
    if with_patterns:
        info["pattern_matches"] = pattern_counts(model)
    return info


_BITS = {"INT8": 8, "UINT8": 8, "INT16": 16, "UINT16": 16, "INT4": 4, "UINT4": 4, "INT32": 32,
         "FLOAT8E4M3FN": 8, "FLOAT8E5M2": 8}
# operators that do the arithmetic: one that reads a value no DequantizeLinear produced runs on float
COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "LSTM", "GRU", "RNN", "Attention"})
ON_GRID_SUFFIX = "_prefolded"   # a weight stored on its integer grid in float (quant/core/qdq.py)
QUANT_OPS = ("MatMulNBits", "GatherBlockQuantized", "MatMulInteger", "ConvInteger", "DynamicQuantizeLinear")


def _granularity(n) -> str:
    if n.attr("block_size"):
        return f"blocked ({n.attr('block_size')}, axis {n.attr('axis', 1)})"
    scale = n.inputs[1] if len(n.inputs) > 1 else None
    size = None if scale is None or scale.shape is None else int(np.prod([d or 0 for d in scale.shape]))
    if size is None or size <= 1:
        return "per-tensor"
    return f"per-channel (axis {n.attr('axis', 1)})"


def quantization(model: Model):
    """What a quantized model holds: Q/DQ counts by grid (bits from the zero point's type, granularity), the
    compute nodes that read float values, and integer/weight-only operators; None for a model with none."""
    qdq: Counter = Counter()
    ops: Counter = Counter()
    float_compute = []
    for g in model.graphs():
        for n in g:
            if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
                zp = n.inputs[2] if len(n.inputs) > 2 else None
                dt = _DT.get(zp.dtype, "UINT8") if zp is not None and zp.dtype else "UINT8"
                weight = n.op_type == "DequantizeLinear" and n.inputs[0] is not None and n.inputs[0].is_initializer
                qdq[(n.op_type, f"{_BITS.get(dt, dt)}-bit {dt.lower()}", _granularity(n),
                     "weight" if weight else "activation")] += 1
            elif n.op_type.startswith("QLinear") or n.op_type in QUANT_OPS:
                ops[n.op_type] += 1
            elif n.op_type in COMPUTE_OPS:
                read = [v for v in n.inputs[:2] if v is not None and not v.name.endswith(ON_GRID_SUFFIX)]
                if any(v.producer is None or v.producer.op_type != "DequantizeLinear" for v in read):
                    float_compute.append({"node": n.name, "op_type": n.op_type, "graph": g.name})
    if not qdq and not ops:
        return None
    return {"qdq": [{"op": k[0], "grid": k[1], "granularity": k[2], "kind": k[3], "count": c}
                    for k, c in sorted(qdq.items())],
            "quantized_ops": dict(ops.most_common()), "float_compute": float_compute}


def pattern_counts(model: Model) -> dict:
    counts = {}
    for name in all_patterns():
        n = len(find_matches(model.graph, name))  # recurses into bodies
        if n:
            counts[name] = n
    return counts


def format_inspect(info: dict) -> str:
    lines = [f"IR version {info['ir_version']}, opsets " + ", ".join(f"{d or 'ai.onnx'}:{v}" for d, v in info["opset_imports"].items())
             + (f", producer {info['producer']}" if info["producer"] else ""),
             f"{info['nodes']} nodes, {info['initializers']} initializers", "", "inputs:"]
    for v in info["inputs"]:
        lines.append(f"  {v['name']}: {v['dtype']} {v['shape']}")
    lines.append("outputs:")
    for v in info["outputs"]:
        lines.append(f"  {v['name']}: {v['dtype']} {v['shape']}")
    lines.append("")
    lines.append("op histogram:")
    for op, c in info["op_histogram"].items():
        lines.append(f"  {op:<28}{c}")
    lines.append("")
    sc = info["shared_constants"]
    lines.append(f"shared constants: {len(sc)}")
    for c in sc[:50]:
        rd = ", ".join(c["readers"][:8]) + (f", ... ({len(c['readers'])} readers)" if len(c["readers"]) > 8 else "")
        lines.append(f"  {c['name']} {c['shape']}: read by {rd}")
    if len(sc) > 50:
        lines.append(f"  ... {len(sc) - 50} more (use --json)")
    if info["subgraphs"]:
        lines.append("")
        lines.append("subgraphs:")
        for s in info["subgraphs"]:
            cap = f", captures {', '.join(s['captures'][:6])}" if s["captures"] else ""
            lines.append(f"  {s['name']} (in {s['owner_op']} '{s['owner']}'): {s['nodes']} nodes{cap}")
    q = info.get("quantization")
    if q is not None:
        lines.append("")
        lines.append("quantization:")
        for r in q["qdq"]:
            lines.append(f"  {r['op']:<18}{r['kind']:<11}{r['grid']:<14}{r['granularity']:<28}{r['count']}")
        for op, c in q["quantized_ops"].items():
            lines.append(f"  {op:<28}{c}")
        fc = q["float_compute"]
        lines.append(f"  compute nodes reading float values: {len(fc)}"
                     + (": " + ", ".join(f"{x['node']} ({x['op_type']})" for x in fc[:12]) if fc else "")
                     + (f", ... {len(fc) - 12} more" if len(fc) > 12 else ""))
    pm = info.get("pattern_matches")
    if pm is not None:
        lines.append("")
        lines.append("pattern matches:" + ("" if pm else " none"))
        for k, v in pm.items():
            lines.append(f"  {k:<28}{v}")
    return "\n".join(lines)
