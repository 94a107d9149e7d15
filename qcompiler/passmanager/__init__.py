"""Pass infrastructure: Pass/PassResult, the registry (with entry points), the manager and instrumentations."""
from qcompiler.passmanager.base import FunctionPass, Pass, PassResult
from qcompiler.passmanager.manager import (
           Instrumentation,
           PassManager,
           add_default_instrumentation,
           run_pipeline,
)
from qcompiler.passmanager.registry import (
           ENTRY_POINT_GROUP,
           available_passes,
           get_pass,
           parse_pipeline,
           register_pass,
)

__all__ = ["Pass", "PassResult", "FunctionPass", "Instrumentation", "PassManager", "run_pipeline", "add_default_instrumentation",
           "register_pass", "get_pass", "available_passes", "parse_pipeline", "ENTRY_POINT_GROUP"]
