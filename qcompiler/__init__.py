"""qcompiler: a compiler for ONNX models built from graph-rewriting passes; post-training quantization to QDQ."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from qcompiler.ir import Graph, Model, Node, Value, verify
    from qcompiler.onnx_io import load_model, model_from_proto, model_to_proto, save_model

__version__ = "0.1.0"
__all__ = ["Graph", "Model", "Node", "Value", "verify", "load_model", "save_model", "model_from_proto",
           "model_to_proto"]   # and debug, DebugResult


def __getattr__(name: str):
    """The public names load on first use: the command line starts without onnx and numpy (`qcompiler --help`
    imports this package first), and `import qcompiler` does not load the debugger (and onnxruntime's users)."""
    if name in ("Graph", "Model", "Node", "Value", "verify"):
        from qcompiler import ir
        return getattr(ir, name)
    if name in ("load_model", "save_model", "model_from_proto", "model_to_proto"):
        from qcompiler import onnx_io
        return getattr(onnx_io, name)
    if name in ("debug", "DebugResult"):
        from qcompiler import debugger
        return getattr(debugger, name)
    raise AttributeError(f"module 'qcompiler' has no attribute {name!r}")
