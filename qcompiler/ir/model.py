"""A Model: the main graph plus everything else an ONNX ModelProto carries, kept for a lossless round trip."""
from __future__ import annotations

from typing import Optional

from qcompiler.ir.graph import Graph


class Model:
    """Model-level data: IR version, opset imports (custom domains too), producer, metadata, functions."""

    def __init__(self, graph: Graph, opset_imports: Optional[dict] = None, ir_version: int = 8):
        self.graph = graph
        self.opset_imports: dict[str, int] = dict(opset_imports or {"": 17})
        self.ir_version = ir_version
        self.producer_name = "qcompiler"
        self.producer_version = ""
        self.domain = ""
        self.model_version = 0
        self.doc_string = ""
        self.metadata_props: dict[str, str] = {}
        self.functions: list = []           # FunctionProtos, kept verbatim
        self.training_info: list = []       # TrainingInfoProtos, kept verbatim
        self.configuration: list = []       # DeviceConfigurationProtos (newer IR), kept verbatim
        self.base_dir: Optional[str] = None  # folder of the file it came from (external data)
        self.source_path: Optional[str] = None  # absolute path of the file load_model read it from
        self.external_files: frozenset = frozenset()  # real paths of the external-data files the import read

    @property
    def opset(self) -> int:
        """The default-domain opset version."""
        return self.opset_imports.get("", self.opset_imports.get("ai.onnx", 1))

    def graphs(self) -> list:
        """The main graph and every body, outermost first."""
        return self.graph.all_graphs()

    def __repr__(self) -> str:
        return f"Model(opset={self.opset}, {self.graph!r})"
