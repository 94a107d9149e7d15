"""Pattern building: a pattern body is straight-line calls on an op builder, as in the onnxscript rewriter.

    def pattern(self, op, x):
        d = op.Or(op.Div(x, op.Const(SQRT2)), op.Mul(x, op.Const(1 / SQRT2)), name="scaled")
        return op.Mul(op.Mul(x, op.Add(op.Erf(d), op.Const(1.0))), op.Const(0.5))

The builder records a small graph of pattern values:
- `Var(name)`: any value; the same name must bind the same graph value everywhere (`x` read twice).
- `Const(...)`: a constant (initializer or Constant-node output) that meets predicates on value (with
  tolerance), scalar-ness, shape or rank, or a callable. `structural=True` marks constants that belong to the
  supergroup (a GELU's 0.5, a LayerNorm's epsilon) so later passes refuse to fold into them (field notes §4).
- `NodeOut`: output `index` of a `PatternNode` (op-type alternatives, attribute constraints, commutative inputs).
- `OrValue`: alternatives, tried in order.
- `Optional(p)`: the input slot may be absent (empty or missing); otherwise it must match `p`.
- `Through(p)` (`op.Bcast(p)`): `p`, or `p` behind a chain of broadcast-only shape ops (Reshape, Expand,
  Unsqueeze) whose other inputs are constants; tf2onnx and Paddle2ONNX put these between a reduction and its
  use. The shape ops join the match (exclusive use applies to them) without a pattern node of their own.

`Add`, `Mul`, `Max`, `Min`, `Sum`... are matched in both input orders unless `_commute=False`
(MLIR asks for commutativity explicitly; exporters commute freely, so we default to it for these ops).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence, Union
from typing import Optional as Opt

import numpy as np

from qcompiler.errors import PatternError

COMMUTATIVE_OPS = frozenset({"Add", "Mul", "Max", "Min", "Sum", "Mean", "And", "Or", "Xor", "Equal"})


class PatternValue:
    """Base of the pattern-side values."""

    name: Opt[str] = None


class Var(PatternValue):
    """Any graph value; bound under `name` (same name, same value)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"Var({self.name})"


class Const(PatternValue):
    """A constant meeting every given predicate; `value` is compared elementwise (broadcast) with tolerance."""

    def __init__(self, value: Any = None, *, name: Opt[str] = None, rtol: float = 1e-3, atol: float = 1e-6,
                 scalar: Opt[bool] = None, shape: Opt[Sequence[int]] = None, rank: Opt[int] = None,
                 pred: Opt[Callable[[np.ndarray], bool]] = None, structural: Opt[bool] = None):
        self.value = None if value is None else np.asarray(value, dtype=np.float64)
        self.name, self.rtol, self.atol = name, rtol, atol
        self.scalar = scalar if scalar is not None else (True if value is not None and np.ndim(value) == 0 else None)
        self.shape = None if shape is None else tuple(shape)
        self.rank, self.pred = rank, pred
        # a constant pinned to a value (or declared scalar) belongs to the structure by default
        self.structural = structural if structural is not None else (value is not None or scalar is True)

    @property
    def needs_values(self) -> bool:
        """True if matching must decode the tensor (a value or a predicate); shape checks read dims only."""
        return self.value is not None or self.pred is not None

    def test_shape(self, shape: tuple) -> Opt[str]:
        """None if a constant of this shape can satisfy the shape predicates, else the reason."""
        size = 1
        for n in shape:
            size *= n
        if self.scalar and size != 1:
            return f"expected a scalar constant, got shape {list(shape)}"
        if self.scalar is False and size == 1:
            return "expected a non-scalar constant"
        if self.shape is not None and tuple(shape) != self.shape:
            return f"expected shape {list(self.shape)}, got {list(shape)}"
        if self.rank is not None and len(shape) != self.rank:
            return f"expected rank {self.rank}, got {len(shape)}"
        return None

    def test(self, arr: np.ndarray) -> Opt[str]:
        """None if `arr` satisfies the predicates, else the reason."""
        why = self.test_shape(arr.shape)
        if why is not None:
            return why
        if self.value is not None:
            if arr.size == 1 and self.value.size == 1 and arr.dtype.kind in "fiu":
                got, want = float(arr.reshape(-1)[0]), float(self.value.reshape(-1)[0])
                if abs(got - want) > self.atol + self.rtol * abs(want):
                    return f"expected {want:g} (rtol={self.rtol}), got {got:g}"
            elif arr.dtype.kind not in "fiub":
                return f"expected a numeric constant, got dtype {arr.dtype}"
            else:
                try:
                    ok = np.allclose(arr.astype(np.float64), self.value, rtol=self.rtol, atol=self.atol)
                except ValueError:
                    ok = False
                if not ok:
                    got = arr.reshape(-1)[:4].tolist()
                    return f"expected {self.value.tolist()} (rtol={self.rtol}), got {got}"
        if self.pred is not None and not self.pred(arr):
            return f"constant fails predicate {getattr(self.pred, '__name__', 'pred')}"
        return None

    def __repr__(self) -> str:
        v = "" if self.value is None else self.value.tolist()
        return f"Const({v}{' ' + self.name if self.name else ''})"


class Optional(PatternValue):
    """An input that may be absent; when present it must match `inner`."""

    def __init__(self, inner: PatternValue):
        self.inner = inner
        self.name = None

    def __repr__(self) -> str:
        return f"Optional({self.inner!r})"


class OrValue(PatternValue):
    """The first alternative (in order) that matches; `name` binds the matched graph value."""

    def __init__(self, alternatives: Sequence[PatternValue], name: Opt[str] = None):
        if len(alternatives) < 2:
            raise PatternError("OrValue needs at least two alternatives")
        self.alternatives = list(alternatives)
        self.name = name

    def __repr__(self) -> str:
        return "Or(" + " | ".join(map(repr, self.alternatives)) + ")"


BROADCAST_OPS = ("Reshape", "Expand", "Unsqueeze")


class Through(PatternValue):
    """`inner`, directly or behind any chain of `ops` whose other inputs are constant (`broadcast_only`)."""

    def __init__(self, inner: PatternValue, ops: Sequence[str] = BROADCAST_OPS):
        self.inner = inner
        self.ops = frozenset(ops)
        self.name = None

    @property
    def marker(self) -> "PatternNode":
        """Stands for every skipped shape op in a match's node map (its step name in explain); one for all
        Through values, so a shape op shared by two uses of a statistic is skipped by both."""
        return _BROADCAST_STEP

    def __repr__(self) -> str:
        return f"Through({self.inner!r})"


def broadcast_only(node) -> Opt[str]:
    """None if `node` (Reshape/Expand/Unsqueeze) can be skipped as a broadcast: a data input and every other
    input constant, else the reason. Whether its output lines up with the tensor it is used against needs the
    pattern's axes: patterns/stats.py `check_stats` checks that where shapes are known."""
    ins = node.inputs
    if not ins or ins[0] is None:
        return "no data input"
    for v in ins[1:]:
        if v is not None and not v.is_constant():
            return f"its input '{v.name}' is not a constant"
    return None


class PatternNode:
    """One operator of the pattern: op-type alternatives, inputs, attribute constraints, output count."""

    def __init__(self, op_types: tuple, inputs: list, attrs: dict, name: str, domain: str, n_outputs: int,
                 commute: bool):
        self.op_types = op_types
        self.inputs = inputs
        self.attrs = attrs
        self.name = name
        self.domain = domain
        self.outputs = [NodeOut(self, i) for i in range(n_outputs)]
        self.commute = commute and len(inputs) == 2

    def __repr__(self) -> str:
        return f"{self.name}({'|'.join(self.op_types)})"


class NodeOut(PatternValue):
    """Output `index` of a pattern node."""

    def __init__(self, node: PatternNode, index: int):
        self.node, self.index = node, index
        self.name = None

    def __repr__(self) -> str:
        return f"{self.node.name}:{self.index}"


_BROADCAST_STEP = PatternNode(BROADCAST_OPS, [], {}, "broadcast", "", 1, False)


def _as_pattern_value(v: Any) -> Any:
    if v is None or isinstance(v, PatternValue):
        return v
    if isinstance(v, (int, float, np.ndarray, list)):
        return Const(v)
    raise PatternError(f"pattern input {v!r} is not a pattern value (Var, Const, node output, Or, Optional)")


class OpBuilder:
    """`op.Mul(a, b)` adds a PatternNode and returns its output (a tuple if `_outputs=n>1`).

    Keyword arguments starting with `_` configure the node: `_name` (step name shown by explain),
    `_ops` (extra op-type alternatives), `_domain`, `_outputs`, `_commute`. Other keywords constrain attributes:
    a plain value must equal the attribute (None = attribute absent), a callable receives the attribute value.
    """

    def __init__(self):
        self.nodes: list[PatternNode] = []
        self._counts: dict[str, int] = {}

    def __getattr__(self, op_type: str):
        if op_type.startswith("_") or not op_type[:1].isupper():
            raise AttributeError(op_type)
        return lambda *inputs, **kw: self.node(op_type, *inputs, **kw)

    def node(self, op_type: Union[str, Sequence[str]], *inputs, _name: Opt[str] = None, _ops: Sequence[str] = (),
             _domain: str = "", _outputs: int = 1, _commute: Opt[bool] = None, **attrs):
        ops = (op_type,) if isinstance(op_type, str) else tuple(op_type)
        ops = ops + tuple(_ops)
        if _name is None:
            base = ops[0].lower()
            k = self._counts.get(base, 0)
            self._counts[base] = k + 1
            _name = base if k == 0 else f"{base}_{k}"
        if any(n.name == _name for n in self.nodes):
            raise PatternError(f"two pattern nodes are named {_name!r}")
        commute = _commute if _commute is not None else all(o in COMMUTATIVE_OPS for o in ops)
        pn = PatternNode(ops, [_as_pattern_value(v) for v in inputs], attrs, _name, _domain, _outputs, commute)
        self.nodes.append(pn)
        return pn.outputs[0] if _outputs == 1 else tuple(pn.outputs)

    # --- value helpers, so a pattern body needs only `op` --------------------------------------------------
    @staticmethod
    def Var(name: str) -> Var:  # noqa: N802 (reads like the other builder calls)
        return Var(name)

    @staticmethod
    def Const(value: Any = None, **kw) -> Const:  # noqa: N802
        return Const(value, **kw)

    @staticmethod
    def Scalar(name: Opt[str] = None, **kw) -> Const:  # noqa: N802
        """Any scalar constant (e.g. an epsilon), bound under `name`."""
        kw.setdefault("scalar", True)
        return Const(None, name=name, **kw)

    @staticmethod
    def Or(*alternatives: PatternValue, name: Opt[str] = None) -> OrValue:  # noqa: N802
        return OrValue([_as_pattern_value(a) for a in alternatives], name)

    @staticmethod
    def Optional(inner: PatternValue) -> Optional:  # noqa: N802
        return Optional(_as_pattern_value(inner))

    @staticmethod
    def Bcast(inner: PatternValue, ops: Sequence[str] = BROADCAST_OPS) -> Through:  # noqa: N802
        """`inner`, possibly behind broadcast-only Reshape/Expand/Unsqueeze nodes."""
        return Through(_as_pattern_value(inner), ops)
