"""The annotations one pass leaves on nodes and values for later passes (`node.meta` / `value.meta`), in one table.

`node.meta` and `value.meta` are free-form dicts in the IR; this module closes the protocol: every key a pass
writes or reads is listed in KEYS with what it means, and `annotate` refuses a key that is not (a typo would
otherwise be a silent no-op in the pass that reads it). Annotations do not survive export/import: they are
facts about this IR instance (placement re-annotates supergroups when it needs them: annotation is idempotent).
"""
from __future__ import annotations

from typing import Any

KEYS = {
    # written by annotate-supergroups (passes/supergroups.py); read by placement and scale folding
    "supergroup": "node: '<kind>:<k>', the supergroup it belongs to (quantizers only at its boundary)",
    "supergroup_pattern": "node: the pattern-library pattern that matched its supergroup",
    "supergroup_interior": "value: '<kind>:<k>', computed inside that supergroup (not one of its outputs)",
    "protected": "value or node: a structure's own constant (a GELU's 0.5, a LayerNorm epsilon); never rescaled",
}


def annotate(obj, key: str, value: Any = True) -> None:
    """Set annotation `key` on a node or value."""
    if key not in KEYS:
        raise KeyError(f"unknown IR annotation '{key}' (known: {', '.join(KEYS)})")
    if obj.meta is None:
        obj.meta = {}
    obj.meta[key] = value


def annotation(obj, key: str, default: Any = None) -> Any:
    """Annotation `key` of a node or value (`default` when absent; None objects have none)."""
    if key not in KEYS:
        raise KeyError(f"unknown IR annotation '{key}' (known: {', '.join(KEYS)})")
    meta = getattr(obj, "meta", None) if obj is not None else None
    return meta.get(key, default) if meta else default
