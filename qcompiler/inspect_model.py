"""What `qcompiler inspect` reports: op histogram, inputs/outputs, shared constants and their readers,
subgraphs and pattern matches, as a dict (for --json) and as text."""
from __future__ import annotations

from collections import Counter

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
    if with_patterns:
        info["pattern_matches"] = pattern_counts(model)
    return info


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
    pm = info.get("pattern_matches")
    if pm is not None:
        lines.append("")
        lines.append("pattern matches:" + ("" if pm else " none"))
        for k, v in pm.items():
            lines.append(f"  {k:<28}{v}")
    return "\n".join(lines)
