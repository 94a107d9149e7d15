"""fold-weight-layout: Transpose/Reshape/Squeeze/Unsqueeze/Flatten/float Cast of a constant, evaluated.

Exporters leave layout ops on weights when constant folding is off or not theirs to do: torch's dynamo exporter
writes `aten::t` (Transpose of `fc1.weight`) before every Linear's MatMul, TorchScript exports with
`do_constant_folding=False` keep `Transpose`/`Unsqueeze` on parameters, tf2onnx leaves `Reshape`s of
depthwise kernels, fp16-stored weights come through a `Cast` to float. The MatMul/Conv then reads an activation,
not an initializer: its weight gets no per-channel grid and stays float (the layer runs on a float kernel), and
nothing says so. Folding those nodes makes the weight an initializer again.

Only ops that move or relabel elements (and a Cast between float types) are folded, so a result is never larger
than its input: no size bound is needed and nothing a hostile constant asks for is allocated. When nothing
else reads the original initializer it goes and the folded one takes its name (`fc1.weight`: the parameter's
name, which encodings files and reports then show); a shared one stays unchanged and the folded copy is
`<output>_folded`. Nodes whose output is a graph output, and constants that are graph inputs
(overridable), are left alone; Identity is canonicalize's (it runs first). fold-constants is the general pass (any op, reference evaluator, size-bounded).
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

from qcompiler.passmanager import Pass, PassResult, register_pass

LAYOUT_OPS = ("Transpose", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Cast")   # Identity: canonicalize
_FLOATS = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE}


def _axes(node, arrays, name="axes"):
    """Axes from the second input (opset >= 13) or the attribute (older opsets)."""
    if len(arrays) > 1 and arrays[1] is not None:
        return [int(a) for a in np.ravel(arrays[1])]
    a = node.attrs.get(name)
    return None if a is None else [int(x) for x in a.value]


def _fold(node, arrays):
    """The node's result on constant `arrays`, or None when it is not folded here."""
    x = arrays[0]
    op = node.op_type
    if op == "Transpose":
        perm = node.attrs.get("perm")
        return np.transpose(x, None if perm is None else [int(p) for p in perm.value])
    if op == "Reshape":
        if len(arrays) < 2 or arrays[1] is None:
            return None
        shape = [int(s) for s in np.ravel(arrays[1])]
        allowzero = node.attrs.get("allowzero")
        if not (allowzero is not None and int(allowzero.value)):
            shape = [x.shape[i] if s == 0 and i < x.ndim else s for i, s in enumerate(shape)]
        return x.reshape(shape)
    if op == "Flatten":
        a = node.attrs.get("axis")
        axis = int(a.value) if a is not None else 1
        axis = axis + x.ndim if axis < 0 else axis
        return x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)
    if op == "Squeeze":
        axes = _axes(node, arrays)
        return np.squeeze(x) if axes is None else np.squeeze(x, axis=tuple(axes))
    if op == "Unsqueeze":
        axes = _axes(node, arrays)
        if axes is None:
            return None
        r = x.ndim + len(axes)
        return np.expand_dims(x, tuple(sorted(a + r if a < 0 else a for a in axes)))
    if op == "Cast":
        to = node.attrs.get("to")
        if to is None or int(to.value) not in _FLOATS or x.dtype.kind != "f":
            return None
        return x.astype(helper.tensor_dtype_to_np_dtype(int(to.value)))
    return None


@register_pass
class FoldWeightLayout(Pass):
    """Layout ops (Transpose, Reshape, Squeeze, Unsqueeze, Flatten) and float Casts of constants
    folded into initializers, so the weights behind them are weights again."""

    name = "fold-weight-layout"
    description = "fold Transpose/Reshape/Squeeze/Unsqueeze/Flatten/float-Cast of constants (weights again)"
    preserves_semantics = True

    def run(self, model) -> PassResult:
        folded = 0
        for g in model.graphs():
            changed = True
            while changed:   # a chain (Transpose of a Reshape of a weight) folds one link per sweep
                changed = False
                for node in [n for n in g.nodes if n.op_type in LAYOUT_OPS]:
                    if node.graph is g and _fold_node(g, node):
                        folded += 1
                        changed = True
        return PassResult(folded > 0, {"folded": folded})


def _fold_node(g, node) -> bool:
    if node.domain not in ("", "ai.onnx") or not node.inputs or node.inputs[0] is None or len(node.outputs) != 1:
        return False
    if any(v is not None and not v.is_constant() for v in node.inputs):
        return False
    out = node.outputs[0]
    if out is None or out.is_output_of_any_graph():
        return False
    arrays = [None if v is None else v.const_value() for v in node.inputs]
    if arrays[0] is None or arrays[0].dtype == object:
        return False
    try:
        r = _fold(node, arrays)
    except (ValueError, TypeError, IndexError):
        return False   # a malformed node: onnxruntime says why, in its own words
    if r is None:
        return False
    src = node.inputs[0]
    c = g.add_constant(np.ascontiguousarray(r), out.name + "_folded")
    g.substitute(out, c, remove=[node])
    if src.graph is g and g.initializers.get(src.name) is not src and src.name not in g.names:
        g.rename_value(c, src.name)   # the weight read nowhere else: its (exporter's parameter) name
    return True
