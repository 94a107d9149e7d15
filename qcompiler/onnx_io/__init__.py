"""ONNX import/export and safe file handling."""
from .exporter import graph_to_proto, model_to_proto
from .files import load_model, load_proto, save_model, write_atomic
from .importer import model_from_proto

__all__ = ["graph_to_proto", "model_to_proto", "load_model", "load_proto", "save_model", "write_atomic",
           "model_from_proto"]
