"""Run an onnx ModelProto -> ModelProto function (the version converter, the inliner, the switchable copy's
builder) on an IR model, in place or into a new model.

Those functions read no initializer data but copy the model several times over (minilm's version conversion:
+540 MB for 90 MB of weights). So they get the graph with every initializer above STUB_BYTES as a stub (name,
type, shape, no data), and the new model takes the old model's Tensor objects back: no weight is copied or
decoded. In place, the Model object stays the same, so every pass and the quantization context keep their reference.
"""
from __future__ import annotations

from typing import Callable

from qcompiler.errors import QCompilerError
from qcompiler.onnx_io.exporter import model_to_proto
from qcompiler.onnx_io.importer import model_from_proto

STUB_BYTES = 4096       # initializers above this size go to the function without their data


def rewritten_copy(model, fn: Callable, what: str):
    """A new Model from `fn(proto)` of `model`'s weightless proto (module docstring), holding `model`'s own
    Tensor objects for its large initializers (none copied or decoded); `model` is unchanged. `what` names the
    step in errors ("cannot {what}: ..." when fn raises, "{what} changed initializer ..." when a large
    initializer's name, dims or type did not survive)."""
    proto = model_to_proto(model, stub_over=STUB_BYTES)
    try:
        out = fn(proto)
    except Exception as e:   # noqa: BLE001 - onnx raises anything; one line
        msg = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise QCompilerError(f"cannot {what}: {msg}") from None
    del proto
    new = model_from_proto(out, data_stubs=True)   # stubs: the weights are put back below
    del out
    for name, v in model.graph.initializers.items():
        t = v.tensor
        if t.nbytes <= STUB_BYTES:
            continue
        w = new.graph.initializers.get(name)
        if w is None or tuple(w.tensor.dims) != tuple(t.dims) or w.tensor.dtype != t.dtype:
            raise QCompilerError(f"{what} changed initializer '{name[:80]}'; cannot restore it")
        w.tensor = t   # the stub's Tensor, replaced before anyone reads it (as the importer sets it)
    return new


def rewrite_in_place(model, fn: Callable, what: str) -> None:
    """Replace `model`'s graph, opsets and functions by those of `fn(proto)` (rewritten_copy)."""
    new = rewritten_copy(model, fn, what)
    model.graph = new.graph
    model.opset_imports = dict(new.opset_imports)
    model.ir_version = max(model.ir_version, new.ir_version)
    model.functions = list(new.functions)
