"""The pass registry: built-in passes register by decorator; third-party ones through the entry-point group
`qcompiler.passes` (each entry point names a Pass subclass or a factory returning a Pass)."""
from __future__ import annotations

import importlib
from typing import Dict, Type

from qcompiler.errors import UnknownPassError
from qcompiler.shorten import did_you_mean, short_text
from qcompiler.passmanager.base import Pass

ENTRY_POINT_GROUP = "qcompiler.passes"
# the graph passes, and the quantization passes (imported apart: they import qcompiler.quant, which imports
# graph passes such as qcompiler.passes.supergroups)
BUILTIN_MODULES = ("qcompiler.passes", "qcompiler.passes.quantize")
_REGISTRY: Dict[str, Type[Pass]] = {}
BROKEN_PLUGINS: Dict[str, str] = {}   # entry-point name -> why it did not load
_loaded = 0   # how many of the stages below have run


def _known(limit: int = 400) -> str:
    """The registered names for a message, cut at `limit` characters (`qcompiler list-passes` lists them all)."""
    text = ", ".join(sorted(_REGISTRY))
    return text if len(text) <= limit else text[:text.rfind(", ", 0, limit)] + ", ... (qcompiler list-passes)"


def register_pass(cls: Type[Pass]) -> Type[Pass]:
    """Class decorator: make `cls` findable by its `name`. A duplicate name is a programming error."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"pass name '{cls.name}' is already registered by {_REGISTRY[cls.name].__name__}")
    _REGISTRY[cls.name] = cls
    return cls


def _load(stages: int = 3) -> None:
    """Register passes in stages, up to `stages`: the graph passes, the quantization passes, the plug-ins.

    NOTE: a pipeline of graph passes (`qcompiler run --pipeline canonicalize`) is found in the first stage and
    never imports the quantizer or onnxruntime; the names each stage adds are the same whatever stage a lookup
    stops at (a plug-in never replaces a built-in), so stopping early changes no result.
    """
    global _loaded
    while _loaded < stages:
        _loaded += 1
        if _loaded <= len(BUILTIN_MODULES):   # built-ins register on import
            importlib.import_module(BUILTIN_MODULES[_loaded - 1])
        else:
            _load_plugins()


def _load_plugins() -> None:
    try:
        from importlib.metadata import entry_points
        eps = entry_points()
        group = eps.select(group=ENTRY_POINT_GROUP) if hasattr(eps, "select") else eps.get(ENTRY_POINT_GROUP, [])
    except Exception as e:   # noqa: BLE001 - broken package metadata must not break the built-ins
        BROKEN_PLUGINS["<entry points>"] = _reason(e)
        return
    for ep in group:
        # NOTE: a plug-in that fails to import must not break the built-ins, but it is never silent either:
        # list-passes shows it and naming it in a pipeline says why it is missing
        try:
            obj = ep.load()
        except Exception as e:   # noqa: BLE001 - third-party code raises anything
            BROKEN_PLUGINS[ep.name] = _reason(e)
            continue
        if isinstance(obj, type) and issubclass(obj, Pass):
            if not obj.name:
                obj.name = ep.name
            _REGISTRY.setdefault(obj.name, obj)
        elif callable(obj):
            _REGISTRY.setdefault(ep.name, obj)
        else:
            BROKEN_PLUGINS[ep.name] = f"{type(obj).__name__} is neither a Pass subclass nor a factory"


def _reason(e: BaseException) -> str:
    text = (str(e).strip().splitlines() or [""])[0][:160]
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def available_passes() -> Dict[str, Type[Pass]]:
    _load()
    return dict(sorted(_REGISTRY.items()))


def get_pass(name: str) -> Pass:
    """Instantiate the pass registered as `name`; UnknownPassError lists the known names."""
    stage = 1
    _load(stage)
    while name not in _REGISTRY and stage < 3:
        stage += 1
        _load(stage)
    cls = _REGISTRY.get(name)
    if cls is None:
        if name in BROKEN_PLUGINS:
            raise UnknownPassError(f"pass '{name}' is a plug-in that failed to load ({BROKEN_PLUGINS[name]})")
        raise UnknownPassError(f"unknown pass '{short_text(name)}'{did_you_mean(name, _REGISTRY)}; known passes: "
                               f"{_known()}")
    return cls()


def parse_pipeline(spec) -> list:
    """'a,b,c' or ['a', 'b'] -> [Pass, ...]; unknown names raise before anything runs."""
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    names = [n for n in names if n]
    if not names:
        raise UnknownPassError("empty pipeline: name at least one pass (see `qcompiler list-passes`)")
    return [n if isinstance(n, Pass) else get_pass(n) for n in names]
