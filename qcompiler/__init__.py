"""qcompiler: a compiler for ONNX models built from graph-rewriting passes; post-training quantization to QDQ."""
import importlib

from qcompiler.ir import Graph, Model, Node, Value, verify
from qcompiler.onnx_io import load_model, model_from_proto, model_to_proto, save_model

__version__ = "0.1.0"
__all__ = ["Graph", "Model", "Node", "Value", "verify", "load_model", "save_model", "model_from_proto",
           "model_to_proto"]   # and, loaded on first use (__getattr__): debug, DebugResult
_LAZY = {"debug": "qcompiler.debugger", "DebugResult": "qcompiler.debugger"}


def __getattr__(name: str):
    """`qcompiler.debug` and `qcompiler.DebugResult` load the debugger (and onnxruntime's users) on first use, so
    `import qcompiler` stays as light as the IR."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'qcompiler' has no attribute {name!r}")
