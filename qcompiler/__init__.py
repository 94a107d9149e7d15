"""qcompiler: a compiler for ONNX models built from graph-rewriting passes; post-training quantization to QDQ.

The public names are `__all__`, listed once here: the IR and ONNX I/O, and the quantization API (`quantize`,
`QuantizeResult`; `debug`, `DebugResult`). Every one is imported on first use (PEP 562), so `import qcompiler`
stays cheap: `qcompiler --help` starts without onnx and numpy, and a plug-in's import pays nothing for
calibration, placement or onnxruntime.

    import qcompiler
    res = qcompiler.quantize("model.onnx", "calib.npz")
    res.save("model.qdq.onnx")
    print(res)          # a few lines: target, counts, output SQNR
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from qcompiler.debugger import DebugResult, debug  # noqa: F401
    from qcompiler.ir import Graph, Model, Node, Value, verify  # noqa: F401
    from qcompiler.onnx_io import load_model, model_from_proto, model_to_proto, save_model  # noqa: F401
    from qcompiler.quant.api import QuantizeResult, quantize  # noqa: F401

__version__ = "0.1.0"

# public name -> (module, attribute): imported on first access
_LAZY = {
    "Graph": ("qcompiler.ir", "Graph"),
    "Model": ("qcompiler.ir", "Model"),
    "Node": ("qcompiler.ir", "Node"),
    "Value": ("qcompiler.ir", "Value"),
    "verify": ("qcompiler.ir", "verify"),
    "load_model": ("qcompiler.onnx_io", "load_model"),
    "save_model": ("qcompiler.onnx_io", "save_model"),
    "model_from_proto": ("qcompiler.onnx_io", "model_from_proto"),
    "model_to_proto": ("qcompiler.onnx_io", "model_to_proto"),
    "quantize": ("qcompiler.quant.api", "quantize"),
    "QuantizeResult": ("qcompiler.quant.api", "QuantizeResult"),
    "debug": ("qcompiler.debugger", "debug"),                 # the accuracy debugger (`qcompiler debug`)
    "DebugResult": ("qcompiler.debugger", "DebugResult"),
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    entry = _LAZY.get(name)
    if entry is None:
        raise AttributeError(f"module 'qcompiler' has no attribute {name!r}")
    value = getattr(importlib.import_module(entry[0]), entry[1])
    globals()[name] = value      # later lookups skip __getattr__
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
