"""qcompiler: a compiler for ONNX models built from graph-rewriting passes; post-training quantization to QDQ."""
from qcompiler.debugger import DebugResult, debug
from qcompiler.ir import Graph, Model, Node, Value, verify
from qcompiler.onnx_io import load_model, model_from_proto, model_to_proto, save_model

__version__ = "0.1.0"
__all__ = ["Graph", "Model", "Node", "Value", "verify", "load_model", "save_model", "model_from_proto",
           "model_to_proto", "debug", "DebugResult"]
