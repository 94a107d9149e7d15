"""IR lookups placement needs: constants (without decoding external weights), the nodes whose weights it
considers (bodies included) and the resolver of the plan's (node name, slot) keys."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Dict, List, Optional

import ml_dtypes
import numpy as np
import onnx


def _const(v) -> Optional[np.ndarray]:
    return None if v is None else v.const_value()


def _const_kind(v):
    """What build_plan reads of a weight (dtype, ndim), without decoding one still in its external-data file
    (a 2 GB model's weights would all be read and cached here); else `_const(v)`."""
    t = getattr(v, "tensor", None)
    if t is not None and not v.is_input and t.is_external:
        try:
            return SimpleNamespace(dtype=np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.dtype)), ndim=len(t.dims))
        except Exception:   # noqa: BLE001 - an element type numpy has no dtype for: decode as before
            pass
    return _const(v)


def weight_nodes(g) -> List:
    """Nodes whose weights placement considers: the main graph's, then those of every If/Loop/Scan body
    (recursively). Body nodes whose name repeats one seen before are left out: plan keys are node names.

    Field notes §1: bodies are graphs like any other, and their weights need no calibration. A body node reading
    a weight captured from an outer graph counts as a use like any other (qdq.apply_plan gives it its own DQ
    inside the body).
    """
    out = list(g.nodes)
    seen = {n.name for n in out}
    for body in g.subgraphs(recursive=True):
        for n in body.nodes:
            if n.name and n.name not in seen:
                seen.add(n.name)
                out.append(n)
    return out


def nodes_by_name(g) -> Dict[str, object]:
    """name -> node over the main graph and every body (the first of a repeated name wins, as in
    `weight_nodes`), for resolving the plan's (node name, slot) keys."""
    return {n.name: n for n in weight_nodes(g)}


# float types a Q/DQ can meet (qdq.float_route); ml_dtypes' bfloat16 when onnxruntime hands one back
QUANTIZABLE_FLOATS = frozenset({np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16)})


def float_check(dtypes: Dict[str, np.dtype]):
    """`is float(v)` for values calibration saw as float32, float16 or bfloat16 at run time (qdq.float_route
    gives each its Q/DQ; on a profile computing in float32, upcast-float16 lifted a float16 model first). Others
    are never quantized: QuantizeLinear takes no float64 (a double island stays float)."""
    return lambda v: v is not None and v.name in dtypes and dtypes[v.name] in QUANTIZABLE_FLOATS
