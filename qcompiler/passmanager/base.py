"""What a pass is: a name, a description, whether it preserves semantics, its contract (`requires`/`ensures`,
as onnx-ir's passes declare theirs) and `run(model) -> PassResult`."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict

from qcompiler.ir.model import Model


@dataclass
class PassResult:
    """What a pass reports: whether it changed the model, and named counters (e.g. {"folded": 8})."""

    modified: bool
    stats: Dict[str, Any] = field(default_factory=dict)


class Pass:
    """Base class of every pass. Subclasses set `name`, `description`, `preserves_semantics` and define `run`.

    A pass mutates the model in place, only through the IR's mutation API, and hides no side passes:
    printing, timing and verification are instrumentations (qcompiler.passmanager.instrumentation).
    """

    name: str = ""
    description: str = ""
    preserves_semantics: bool = True
    # the contract: facts (names in passmanager.facts.FACTS) that must hold before the pass runs, and those
    # that hold after it; the manager checks a whole pipeline against them before any pass runs
    requires: tuple = ()
    ensures: tuple = ()

    def run(self, model: Model) -> PassResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def apply(self, model: Model, context=None) -> PassResult:
        """What the manager calls. A model pass ignores the context; a pass on a shared context (the
        quantization passes: qcompiler.quant.core.context.QuantPass) overrides this to run on it."""
        return self.run(model)

    def __repr__(self) -> str:
        return f"<pass {self.name}>"


class FunctionPass(Pass):
    """Wrap a function `(model) -> PassResult | bool` as a pass."""

    def __init__(self, fn: Callable, name: str, description: str = "", preserves_semantics: bool = True):
        self.fn, self.name = fn, name
        self.description = description or (fn.__doc__ or "").strip().splitlines()[0] if (description or fn.__doc__) else ""
        self.preserves_semantics = preserves_semantics

    def run(self, model: Model) -> PassResult:
        r = self.fn(model)
        return r if isinstance(r, PassResult) else PassResult(bool(r))
