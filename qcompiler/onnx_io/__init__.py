"""ONNX import/export and safe file handling."""
from qcompiler.onnx_io.exporter import graph_to_proto, model_to_proto
from qcompiler.onnx_io.files import load_model, load_proto, save_model, write_atomic
from qcompiler.onnx_io.importer import model_from_proto

__all__ = ["graph_to_proto", "model_to_proto", "load_model", "load_proto", "save_model", "write_atomic",
           "model_from_proto"]
