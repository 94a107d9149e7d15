"""The quantization debugger: per-value and per-module SQNR of a QDQ model against its float model, and the
fewest nodes to keep float for a target output SQNR (`qcompiler debug`, `qcompiler.debug()`)."""
from qcompiler.debugger.engine import debug
from qcompiler.debugger.fallback import config_text
from qcompiler.debugger.result import DebugResult

__all__ = ["debug", "DebugResult", "config_text"]
