"""The pass registry: built-in passes register by decorator; third-party ones through the entry-point group
`qcompiler.passes` (each entry point names a Pass subclass or a factory returning a Pass)."""
from __future__ import annotations

from typing import Dict, Type

from ..errors import UnknownPassError
from .base import Pass

ENTRY_POINT_GROUP = "qcompiler.passes"
# the graph passes, and the quantization passes (imported apart: they import qcompiler.quant, which imports
# graph passes such as qcompiler.passes.supergroups)
BUILTIN_MODULES = ("qcompiler.passes", "qcompiler.passes.quantize")
_REGISTRY: Dict[str, Type[Pass]] = {}
_loaded = False


def register_pass(cls: Type[Pass]) -> Type[Pass]:
    """Class decorator: make `cls` findable by its `name`. A duplicate name is a programming error."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"pass name '{cls.name}' is already registered by {_REGISTRY[cls.name].__name__}")
    _REGISTRY[cls.name] = cls
    return cls


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    import importlib
    for module in BUILTIN_MODULES:   # built-ins register on import
        importlib.import_module(module)
    try:
        from importlib.metadata import entry_points
        eps = entry_points()
        group = eps.select(group=ENTRY_POINT_GROUP) if hasattr(eps, "select") else eps.get(ENTRY_POINT_GROUP, [])
        for ep in group:
            obj = ep.load()
            if isinstance(obj, type) and issubclass(obj, Pass):
                if not obj.name:
                    obj.name = ep.name
                _REGISTRY.setdefault(obj.name, obj)
            elif callable(obj):
                _REGISTRY.setdefault(ep.name, obj)
    except Exception:  # a broken plug-in must not break the built-ins
        pass


def available_passes() -> Dict[str, Type[Pass]]:
    _load()
    return dict(sorted(_REGISTRY.items()))


def get_pass(name: str) -> Pass:
    """Instantiate the pass registered as `name`; UnknownPassError lists the known names."""
    _load()
    cls = _REGISTRY.get(name)
    if cls is None:
        raise UnknownPassError(f"unknown pass '{name}'; known passes: {', '.join(sorted(_REGISTRY))}")
    return cls()


def parse_pipeline(spec) -> list:
    """'a,b,c' or ['a', 'b'] -> [Pass, ...]; unknown names raise before anything runs."""
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    names = [n for n in names if n]
    if not names:
        raise UnknownPassError("empty pipeline: name at least one pass (see `qcompiler list-passes`)")
    return [n if isinstance(n, Pass) else get_pass(n) for n in names]
