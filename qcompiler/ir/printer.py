"""A readable text form of a graph, for `--print-after` and debugging: one line per node, bodies indented."""
from __future__ import annotations

import onnx

from qcompiler.ir.graph import Graph

_DT = {v: k for k, v in onnx.TensorProto.DataType.items()}


def _type(v) -> str:
    dt = v.dtype
    s = _DT.get(dt, "?").lower() if dt else "?"
    shape = v.shape
    if shape is not None:
        s += "[" + ",".join("?" if d is None else str(d) for d in shape) + "]"
    return s


def _attr_str(a) -> str:
    v = a.value
    if isinstance(v, Graph):
        return f"{a.name}=<graph {v.name}>"
    if isinstance(v, list) and v and isinstance(v[0], Graph):
        return f"{a.name}=<{len(v)} graphs>"
    if isinstance(v, onnx.TensorProto):
        return f"{a.name}=<tensor {list(v.dims)}>"
    if isinstance(v, bytes):
        v = v.decode(errors="replace")
    s = repr(v)
    return f"{a.name}={s if len(s) < 60 else s[:57] + '...'}"


def format_graph(g: Graph, indent: str = "") -> str:
    lines = [f"{indent}graph {g.name} ("]
    for v in g.inputs:
        lines.append(f"{indent}  %{v.name}: {_type(v)}")
    lines.append(f"{indent}) initializers: {len(g.initializers)} {{")
    for n in g._nodes:
        outs = ", ".join("%" + v.name if v is not None else "_" for v in n.outputs)
        ins = ", ".join("%" + v.name if v is not None else "_" for v in n.inputs)
        attrs = ", ".join(_attr_str(a) for a in n.attrs.values() if not isinstance(a.value, Graph))
        dom = f"{n.domain}::" if n.domain else ""
        lines.append(f"{indent}  {outs} = {dom}{n.op_type}({ins}){' {' + attrs + '}' if attrs else ''}  # {n.name}")
        for sg in n.subgraphs():
            lines.append(format_graph(sg, indent + "    "))
    lines.append(f"{indent}  return " + ", ".join("%" + v.name for v in g.outputs))
    lines.append(f"{indent}}}")
    return "\n".join(lines)
