"""The pass manager: runs a pipeline and calls instrumentation hooks around each pass (as MLIR/LLVM do)."""
from __future__ import annotations

from typing import Iterable, List, Sequence

from ..errors import PassError, QCompilerError
from ..ir.model import Model
from .base import Pass, PassResult
from .registry import parse_pipeline


class Instrumentation:
    """Hooks with no-op defaults. `after_pass` or `after_pass_failed` is called for each pass, never both."""

    def before_pipeline(self, passes: Sequence[Pass], model: Model) -> None: ...

    def before_pass(self, p: Pass, model: Model) -> None: ...

    def after_pass(self, p: Pass, model: Model, result: PassResult) -> None: ...

    def after_pass_failed(self, p: Pass, model: Model, error: BaseException) -> None: ...

    def after_pipeline(self, model: Model, results: list) -> None: ...


_DEFAULT_INSTRUMENTATIONS: list = []


def add_default_instrumentation(factory) -> None:
    """Have every PassManager created from now on also run `factory()` (the test suite registers the IR
    invariant checker here, so it runs after every pass in every test, like LLVM's -verify-each)."""
    _DEFAULT_INSTRUMENTATIONS.append(factory)


class PassManager:
    """Run passes in order over a model, in place. `run` returns [(pass, PassResult), ...]."""

    def __init__(self, pipeline, instrumentations: Iterable[Instrumentation] = ()):
        self.passes: List[Pass] = parse_pipeline(pipeline)
        self.instrumentations: List[Instrumentation] = [f() for f in _DEFAULT_INSTRUMENTATIONS] + list(instrumentations)

    def add_instrumentation(self, inst: Instrumentation) -> None:
        self.instrumentations.append(inst)

    def run(self, model: Model) -> list:
        results = []
        for inst in self.instrumentations:
            inst.before_pipeline(self.passes, model)
        for i, p in enumerate(self.passes):
            for inst in self.instrumentations:
                inst.before_pass(p, model)
            try:
                r = p.run(model)
                if not isinstance(r, PassResult):
                    r = PassResult(bool(r))
            except QCompilerError:
                raise
            except Exception as e:
                for inst in reversed(self.instrumentations):
                    inst.after_pass_failed(p, model, e)
                before = ", ".join(q.name for q in self.passes[:i]) or "none"
                if isinstance(e, PassError):
                    raise
                raise PassError(f"pass '{p.name}' failed (passes run before it: {before}): "
                                f"{type(e).__name__}: {e}") from e
            # NOTE: hooks unwind like a stack, so the verifier (added first) sees the IR before printers do.
            for inst in reversed(self.instrumentations):
                inst.after_pass(p, model, r)
            results.append((p, r))
        for inst in self.instrumentations:
            inst.after_pipeline(model, results)
        return results


def run_pipeline(model: Model, pipeline, instrumentations: Iterable[Instrumentation] = ()) -> list:
    """Convenience: `PassManager(pipeline, instrumentations).run(model)`."""
    return PassManager(pipeline, instrumentations).run(model)
