"""float16 islands: nodes a config marks `precision: float16` compute in fp16 between Casts (field notes §5).

A BatchNormalization that cannot be folded (after a Relu, at the model input) is the typical case: it stays out
of the integer grid but need not run in fp32. Each chosen node gets Cast(to fp16) on its float activation inputs,
fp16 copies of its float constant inputs (the shared fp32 constant is never rewritten in place: §4), and
Cast(to fp32) after each float output, so its neighbours (and their Q/DQ) still see fp32.

Runtimes differ in their fp16 kernels: for `ort_cpu` each op type is probed once with a one-node fp16 model in
onnxruntime; an op it cannot run stays fp32 and the report says so. A node that already computes in float16 (an
fp16 model: torch `.half()`, onnxconverter-common's float16 converter) is left as it is and the report says so.

Models whose values are float16 or bfloat16 to begin with, on a profile that computes in float16
(`float16_compute: float16`), quantize through qdq.float_route (Q/DQ in float16 at opset >= 19, else between Casts
to float32). bfloat16: onnxruntime's CPU provider has no bfloat16 kernel for
MatMul, Conv, Relu, Softmax, ... (1.32), so such a model cannot be calibrated here: `check_bfloat16` turns
onnxruntime's refusal into one line naming bfloat16 (exit 2). On a profile with `float16_compute: float32` (ort_cpu,
aimet) the pass upcast-float16 (`compute_in_float32`) makes a float16 model compute in float32 inside instead, its
inputs and outputs staying float16: on onnxruntime CPU the faster choice (the function's docstring has figures).
"""
from __future__ import annotations

from functools import lru_cache
from typing import Dict, List

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from qcompiler.errors import OnnxRuntimeError
from qcompiler.ort_session import create_session
from qcompiler.quant.settings.untrusted import short

FLOAT = TensorProto.FLOAT
FLOAT16 = TensorProto.FLOAT16
BFLOAT16 = TensorProto.BFLOAT16


def float16_nodes(model, config, dtypes: Dict[str, np.dtype]) -> List[tuple]:
    """[(node, float32 input slots, float32 output values)] for main-graph nodes whose config settings say
    `precision: float16`. Call before QDQ insertion: `dtypes` (calibration's runtime dtypes) name the float
    model's values, and Q/DQ outputs inserted later have none."""
    if config is None:
        return []
    out = []
    for n in model.graph.nodes:
        if config.settings_for(n).precision != "float16":
            continue
        slots = [i for i, v in enumerate(n.inputs) if v is not None and _is_float32(v, dtypes)]
        outs = [v for v in n.outputs if v is not None and v.name in dtypes and dtypes[v.name] == np.float32]
        out.append((n, slots, outs))
    return out


def apply_float16(model, chosen: List[tuple], probe_ort: bool = True) -> Dict[str, str]:
    """Wrap each chosen node (from `float16_nodes`) in Casts so it computes in fp16; returns
    {node name: what was done}."""
    g = model.graph
    done: Dict[str, str] = {}
    for n, in_slots, out_vals in chosen:
        if not in_slots or not out_vals:
            done[n.name] = ("already float16: the model computes it in float16" if _reads_float16(n) else
                            "kept float32: no float32 inputs/outputs to convert")
            continue
        if probe_ort and not _ort_runs_fp16(n.op_type, len(n.inputs), model.opset):
            done[n.name] = f"kept float32: onnxruntime CPU has no float16 {n.op_type} kernel"
            continue
        for i in in_slots:
            v = n.inputs[i]
            arr = v.const_value()
            if arr is not None:
                g.set_input(n, i, g.add_constant(np.asarray(arr).astype(np.float16), f"{v.name}_fp16"))
                g.drop_if_unused([v])     # the float32 original would stay in the file beside its copy
            else:
                g.insert_before(n, i, "Cast", attrs={"to": FLOAT16}, name=f"{n.name}_in{i}_to_fp16")
        for v in out_vals:
            shape = v.shape
            g.insert_after(v, "Cast", attrs={"to": FLOAT}, name=f"{n.name}_out_to_fp32")
            v.set_tensor_type(FLOAT16, list(shape) if shape is not None else None)
        done[n.name] = "float16 (Cast to fp16 before, back to fp32 after)"
    return done


def _reads_float16(n) -> bool:
    return any(v is not None and v.dtype == FLOAT16 for v in list(n.inputs) + list(n.outputs))


def bfloat16_value(model):
    """The first bfloat16 value of the main graph's interface, initializers or declared types, or a Cast to
    bfloat16 (its output); None. O(values); reads no tensor data."""
    g = model.graph
    for v in list(g.inputs) + list(g.outputs) + list(g.initializers.values()) + g.local_values():
        if v is not None and v.dtype == BFLOAT16:
            return v.name
    for n in g.nodes:
        if n.op_type == "Cast" and n.attr("to") == BFLOAT16 and n.outputs and n.outputs[0] is not None:
            return n.outputs[0].name
    return None


def check_bfloat16(model) -> None:
    """A model holding bfloat16 values that onnxruntime's CPU provider refuses: one OnnxRuntimeError line naming
    bfloat16 and the value (instead of onnxruntime's "no implementation for MatMul(13)" alone). A float model
    without bfloat16 costs one pass over its values; one with bfloat16 one session creation."""
    name = bfloat16_value(model)
    if name is None:
        return
    try:
        create_session(model, threads=None)
    except OnnxRuntimeError as e:
        err = OnnxRuntimeError(f"{e} (the model computes in bfloat16, e.g. value {short(name)}, and onnxruntime's "
                               f"CPU provider has no bfloat16 kernel for that op: export it in float16 or float32)")
        err.reason = getattr(e, "reason", str(e))
        raise err from None


def _is_float32(v, dtypes) -> bool:
    arr = v.const_value()
    if arr is not None:
        return arr.dtype == np.float32
    if v.name in dtypes:
        return dtypes[v.name] == np.dtype(np.float32)
    return v.dtype == FLOAT


@lru_cache(maxsize=64)
def _ort_runs_fp16(op_type: str, n_inputs: int, opset: int) -> bool:
    """Can onnxruntime's CPU EP create a session for `op_type` with all-fp16 tensors? (kernel lookup only)"""
    names = [f"i{k}" for k in range(n_inputs)]
    node = onnx.helper.make_node(op_type, names, ["y"])
    inputs = [onnx.helper.make_tensor_value_info(nm, FLOAT16, None) for nm in names]
    graph = onnx.helper.make_graph([node], "probe", inputs,
                                   [onnx.helper.make_tensor_value_info("y", FLOAT16, None)])
    m = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", max(opset, 7))])
    m.ir_version = 10
    try:
        create_session(m, threads=None)
        return True
    except Exception:  # noqa: BLE001 - NOT_IMPLEMENTED (no kernel) or a type error: both mean "not here"
        return False


# --------------------------------------------------------------------------- float32 inside a float16 model

_DTYPE_ATTRS = {"Cast": "to", "EyeLike": "dtype", "RandomNormal": "dtype", "RandomUniform": "dtype",
                "RandomNormalLike": "dtype", "RandomUniformLike": "dtype", "Multinomial": "dtype"}


def compute_in_float32(model) -> Dict[str, int]:
    """Make a float16 model compute in float32 inside while its inputs and outputs keep their float16 types
    (in place): float16 initializers, Constant values, declared types and dtype attributes (Cast `to`, ...)
    become float32 in every graph, a Cast(to float32) follows each float16 graph input and a Cast(to float16)
    feeds each float16 graph output. Returns counts {what: how many}.

    Why (the `upcast-float16` pass, on profiles whose `float16_compute` is float32): onnxruntime's CPU provider has no float16 Conv,
    MatMul or integer-kernel fusion on x86; it runs a float16 QDQ model through Casts around every op, and
    that model was slower than the float16 model itself (digits_cnn: 0.22 ms with Casts around float32 Q/DQ,
    0.53 ms with float16 Q/DQ, against 0.08 ms float16 and 0.04 ms for the float32 model quantized). Computing
    in float32 inside gives the quantized model the float32 model's integer kernels; float32 is also at least as
    accurate as float16, so the output SQNR against the float16 model does not drop.
    """
    counts = {"initializers": 0, "constants": 0, "types": 0, "attributes": 0, "edge_casts": 0}
    g = model.graph
    ins = [v for v in g.inputs if v.dtype == FLOAT16]    # overridable initializers too: their type is interface
    outs = [(i, v) for i, v in enumerate(g.outputs) if v.dtype == FLOAT16]
    for graph in g.all_graphs():
        for v in graph.local_values():
            if v.tensor is not None and v.tensor.dtype == FLOAT16:
                if v.is_input:
                    continue        # an overridable initializer keeps its interface type
                v.tensor = type(v.tensor).from_array(np.asarray(v.tensor.numpy(), np.float32))
                counts["initializers"] += 1
            if v.type is not None and v.type.HasField("tensor_type") and v.type.tensor_type.elem_type == FLOAT16:
                if graph is g and v.is_input:
                    continue        # the inputs keep float16 (the edge Casts below; the outputs get theirs)
                t = onnx.TypeProto()
                t.CopyFrom(v.type)
                t.tensor_type.elem_type = FLOAT
                v.type = t
                counts["types"] += 1
        for n in graph.nodes:
            if n.op_type in ("Constant", "ConstantOfShape") and "value" in n.attrs:
                arr = numpy_helper.to_array(n.attrs["value"].value)
                if arr.dtype == np.float16:
                    n.set_attr("value", arr.astype(np.float32))
                    if n.meta is not None:
                        n.meta.pop("_const_cache", None)
                    counts["constants"] += 1
            key = _DTYPE_ATTRS.get(n.op_type)
            if key is not None and n.attr(key) == FLOAT16:
                n.set_attr(key, FLOAT)
                counts["attributes"] += 1
    for v in ins:
        uses = [u for u in v.uses() if not u.is_graph_output]     # an input passed straight out stays float16
        if uses:
            g.insert_after(v, "Cast", attrs={"to": FLOAT}, uses=uses, name=f"{v.name}{TO_FLOAT32}")
            counts["edge_casts"] += 1
    for i, v in outs:
        if v.is_input:
            continue
        uses = [u for u in v.uses() if u.is_graph_output and u.user is g and u.index == i]
        g.insert_after(v, "Cast", attrs={"to": FLOAT16}, uses=uses, name=f"{v.name}{TO_FLOAT16}")
        counts["edge_casts"] += 1
    return counts


TO_FLOAT32, TO_FLOAT16 = "_to_float32", "_to_float16"   # the edge Casts compute_in_float32 adds: their names


def edge_cast_reason(node) -> "str | None":
    """Why the output of an edge Cast `compute_in_float32` added stays float, in terms of the user's graph (the
    input it copies, the node whose output it casts back), or None for any other node."""
    if node.op_type != "Cast" or not node.inputs or node.inputs[0] is None:
        return None
    src = node.inputs[0]
    if node.name == f"{src.name}{TO_FLOAT32}" and src.is_input:
        return f"float32 copy of the float16 input '{src.name}' (qcompiler computes in float32 inside)"
    out = node.outputs[0]
    if node.name == f"{out.name}{TO_FLOAT16}":
        p = src.producer
        by = f" of '{p.name}' ({p.op_type})" if p is not None else ""
        return f"float16 output '{out.name}'{by}, cast back from the float32 qcompiler computes in"
    return None

