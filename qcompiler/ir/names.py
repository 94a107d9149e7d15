"""Collision-free name generation.

Field notes §3: AIMET confused `hidden_output` with `hidden_output_1`. Here a name is an exact key and a fresh
name is checked against every name in use in the whole model (subgraphs included), so a generated name can
never collide with or shadow an existing one.
"""
from __future__ import annotations


class NameScope:
    """The set of names in use in one model, and a generator of fresh ones."""

    __slots__ = ("_used", "_next")

    def __init__(self) -> None:
        self._used: set[str] = set()
        self._next: dict[str, int] = {}

    def __contains__(self, name: str) -> bool:
        return name in self._used

    def reserve(self, name: str) -> None:
        self._used.add(name)

    def release(self, name: str) -> None:
        self._used.discard(name)

    def fresh(self, hint: str) -> str:
        """Return `hint` if unused, else the first unused `hint_N`; the result is reserved."""
        hint = hint or "v"
        if hint not in self._used:
            self._used.add(hint)
            return hint
        n = self._next.get(hint, 1)
        while f"{hint}_{n}" in self._used:
            n += 1
        self._next[hint] = n + 1
        name = f"{hint}_{n}"
        self._used.add(name)
        return name
