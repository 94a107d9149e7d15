"""The pass manager: runs a pipeline and calls instrumentation hooks around each pass (as MLIR/LLVM do)."""
from __future__ import annotations

from typing import Iterable, List, Sequence

from qcompiler.errors import PassError, QCompilerError
from qcompiler.ir.model import Model
from qcompiler.passmanager.base import Pass, PassResult
from qcompiler.passmanager.facts import START_FACTS, check_contracts
from qcompiler.passmanager.registry import parse_pipeline


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

    def __init__(self, pipeline, instrumentations: Iterable[Instrumentation] = (), start=START_FACTS):
        """`start`: the facts that hold before the first pass (passmanager.facts); the pipeline's contracts are
        checked against them now, so a pass out of order fails before the model is read."""
        self.passes: List[Pass] = parse_pipeline(pipeline)
        check_contracts(self.passes, start)
        self.instrumentations: List[Instrumentation] = [f() for f in _DEFAULT_INSTRUMENTATIONS] + list(instrumentations)

    def add_instrumentation(self, inst: Instrumentation) -> None:
        self.instrumentations.append(inst)

    def run(self, model: Model, context=None) -> list:
        """Run every pass on `model` (and `context`, for passes that work on one: Pass.apply)."""
        results = []
        for inst in self.instrumentations:
            inst.before_pipeline(self.passes, model)
        for i, p in enumerate(self.passes):
            for inst in self.instrumentations:
                inst.before_pass(p, model)
            try:
                r = p.apply(model, context)
                if not isinstance(r, PassResult):
                    r = PassResult(bool(r))
            except Exception as e:
                # hooks unwind on every failure, a user error (QCompilerError) included
                for inst in reversed(self.instrumentations):
                    inst.after_pass_failed(p, model, e)
                if isinstance(e, QCompilerError):
                    raise
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
