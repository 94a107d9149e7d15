"""Reading untrusted config-like files: short renderings of values for messages, bounded YAML and JSON.

No message ever formats a whole value taken from a file: `short(v)` (qcompiler/shorten.py `short_value`) shows at
most ~60 characters and never walks a container (a YAML alias bomb rendered with `repr` was 6 GB). YAML is composed with bounds on nesting
depth, composed nodes and alias expansion (the size a node would have with every alias expanded), so a
"billion laughs" document is refused after a few hundred nodes, in milliseconds and little memory; JSON is
checked for depth after parsing (json's decoder already stops a deeply nested document with RecursionError).
"""
from __future__ import annotations

import json
from typing import Type

import yaml

from qcompiler.errors import ConfigError
from qcompiler.shorten import short_value as short  # noqa: F401 - the name every config reader imports

MAX_DEPTH = 32              # real configs and profiles nest 4-6 levels
# NOTE: PyYAML's safe loader is pure Python, ~40-80 us per node and ~1 us per character here: a 0.8 MB config
# of 20000 rules took 21 s and the 16 MB a config may be (input_files.MAX_BYTES) would take minutes. Real
# configs and profiles hold hundreds of nodes and a few KB; JSON (a C parser) keeps the file-size limit.
MAX_NODES = 100_000         # composed YAML nodes (scalars included)
MAX_EXPANDED = 1_000_000    # nodes of the document with every alias expanded
MAX_YAML_CHARS = 2_000_000  # characters of YAML text


class BoundedSafeLoader(yaml.SafeLoader):
    """yaml.SafeLoader with duplicate keys rejected and depth, node count and alias expansion bounded."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0
        self._sizes = {}   # id(node) -> size with aliases expanded (nodes stay alive in the tree)

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise ConfigError(f"nested deeper than {MAX_DEPTH} levels "
                                  f"(line {self.peek_event().start_mark.line + 1})")
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        size = self._sizes.get(id(node))
        if size is None:
            self._nodes += 1
            if self._nodes > MAX_NODES:
                raise ConfigError(f"more than {MAX_NODES} YAML nodes (line {node.start_mark.line + 1})")
            if isinstance(node, yaml.SequenceNode):
                size = 1 + sum(self._sizes.get(id(c), 1) for c in node.value)
            elif isinstance(node, yaml.MappingNode):
                size = 1 + sum(self._sizes.get(id(k), 1) + self._sizes.get(id(v), 1) for k, v in node.value)
            else:
                size = 1
            self._sizes[id(node)] = size
        if size > MAX_EXPANDED:
            raise ConfigError(f"YAML aliases expand to more than {MAX_EXPANDED} nodes "
                              f"(line {node.start_mark.line + 1})")
        return node

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                dup = key in seen
            except TypeError:
                raise ConfigError(f"unhashable mapping key {short(key)} (line {key_node.start_mark.line + 1})") \
                    from None
            if dup:
                raise ConfigError(f"duplicate key {short(key)} (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep)


def parse_yaml(text: str, path: str, error: Type[Exception] = ConfigError):
    """YAML text -> Python data through `BoundedSafeLoader`; every failure is one line naming `path`."""
    if len(text) > MAX_YAML_CHARS:
        raise error(f"{path}: YAML of {len(text)} characters is over the {MAX_YAML_CHARS}-character limit for "
                    f"YAML (write a larger config as JSON)")
    try:
        return yaml.load(text, Loader=BoundedSafeLoader)  # noqa: S506 - a SafeLoader subclass
    except ConfigError as e:
        raise error(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        what = getattr(e, "problem", None) or str(e).splitlines()[0] if str(e) else type(e).__name__
        raise error(f"{path}: invalid YAML{where}: {str(what)[:120]}") from None
    except RecursionError:
        raise error(f"{path}: YAML nested too deeply") from None
    except (ValueError, TypeError, OverflowError) as e:   # a constructor's own failure: 5000-digit int, bad date
        raise error(f"{path}: invalid YAML value ({type(e).__name__}: {str(e)[:80]})") from None


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


def parse_json(text: str, path: str, error: Type[Exception] = ConfigError, check_depth: bool = True):
    """JSON text -> Python data: duplicate keys and nesting past MAX_DEPTH refused (NaN is left to field checks)."""
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except _DuplicateKey as e:
        raise error(f"{path}: duplicate key {short(e.args[0])}") from None
    except json.JSONDecodeError as e:
        raise error(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise error(f"{path}: JSON nested too deeply") from None
    except ValueError as e:   # a 5000-digit integer (int's string-conversion limit)
        raise error(f"{path}: invalid JSON value ({str(e)[:80]})") from None
    if check_depth:
        check_nesting(data, path, error)
    return data


def check_nesting(data, path: str, error: Type[Exception] = ConfigError) -> None:
    """Refuse data nested deeper than MAX_DEPTH (iterative walk; shared or recursive containers seen once)."""
    stack, seen = [(data, 1)], set()
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            if id(v) in seen:
                continue
            seen.add(id(v))
            if d > MAX_DEPTH:
                raise error(f"{path}: nested deeper than {MAX_DEPTH} levels")
            items = v.values() if isinstance(v, dict) else v
            stack.extend((x, d + 1) for x in items if isinstance(x, (dict, list)))


def decode_text(raw: bytes, path: str, what: str, error: Type[Exception] = ConfigError) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{path}: {what} is not UTF-8 text") from None


__all__ = ["short", "BoundedSafeLoader", "parse_yaml", "parse_json", "check_nesting", "decode_text",
           "MAX_DEPTH", "MAX_NODES", "MAX_EXPANDED",
           "MAX_YAML_CHARS"]
