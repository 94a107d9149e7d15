"""The pattern registry: user-facing names (CLI `qcompiler match MODEL NAME`) -> lists of pattern variants.

A group name ("layernorm") lists its variants largest first; each variant is also reachable by its own name
("layernorm_pow"). Unknown names raise PatternError listing the known ones.
"""
from __future__ import annotations

from typing import Union

from qcompiler.patterns import (
    activations,
    conv,
    gelu,
    gemm,
    layernorm,
    rmsnorm,
    softmax,
)
from qcompiler.patterns.pattern import Pattern

from qcompiler.errors import PatternError
from qcompiler.shorten import short_value

_GROUPS: dict = {}
_LOADED = False


def register(group: str, *patterns: Pattern) -> None:
    """Add variants to a group (created if new); a variant's own name is registered too."""
    _GROUPS.setdefault(group, []).extend(patterns)


def _load() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for mod in (layernorm, gelu, rmsnorm, activations, conv, gemm, softmax):
        for group, variants in mod.GROUPS.items():
            register(group, *variants)


def all_patterns() -> dict:
    """Group name -> list of variants (registry order)."""
    _load()
    return {k: list(v) for k, v in _GROUPS.items()}


def known_names() -> list:
    _load()
    names = list(_GROUPS)
    for vs in _GROUPS.values():
        names.extend(p.name for p in vs if p.name not in names)
    return names


def get_pattern(name: str) -> list:
    """The variants behind a group or variant name."""
    _load()
    if name in _GROUPS:
        return list(_GROUPS[name])
    for vs in _GROUPS.values():
        for p in vs:
            if p.name == name:
                return [p]
    raise PatternError(f"unknown pattern {short_value(name)}; known: {', '.join(known_names())}")


def resolve(pattern: Union[str, Pattern, list, tuple]) -> list:
    """A name, a Pattern, or a list of them -> a list of Pattern instances."""
    if isinstance(pattern, str):
        return get_pattern(pattern)
    if isinstance(pattern, Pattern):
        return [pattern]
    if isinstance(pattern, type) and issubclass(pattern, Pattern):
        return [pattern()]
    if isinstance(pattern, (list, tuple)):
        out = []
        for p in pattern:
            out.extend(resolve(p))
        return out
    raise PatternError(f"not a pattern: {pattern!r}")
