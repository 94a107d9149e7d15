"""The switchable copy of a QDQ model: chosen quantized values read through `Where(on[i], quantized, off)`.

The safety net (activations: passes/quantize/safety_net/trials.py; weights: weights.py), the latency search,
the mixed-precision sensitivity table (passes/quantize/mixed_precision/switched.py: one switch per layer) and
`qcompiler debug` (qcompiler/debugger/variants.py) measure a QDQ model under many settings of which quantizers
are on. One session runs them all when each chosen value is switched on a bool graph input `on` (one entry per
switch): its readers read `Where(on[i], value, off)`, `off` being what they read with the quantizer out (the
value the Q read, the float weight, a finer grid). A switch may carry a 16-bit alternative, picked by a second
input `wide` while the switch is on: `Where(on[i], Where(wide[i], DQ16(Q16(src)), value), off)` (the debugger's
fallback widens quantizers it took out: there `wide[i]` wins whatever `on[i]` says). switch_pool.py runs the
result for many settings on an executor.

`add_switches` edits a ModelProto's graph (and its bodies); `switchable_model` builds the copy of an IR model
without copying a weight: the builder gets the graph with its large initializers as stubs and the new model
takes the old Tensor objects back (onnx_io/rewrite.py), and the sites' large constants (the weights phase's
float or finer weights) are attached as the caller's arrays. A session over it costs the IR plus the session,
not the IR, a ModelProto, its serialized bytes and the session, and a model over one protobuf's worth
(ONE_PROTO_MAX_BYTES) goes to onnxruntime with external data like any other session's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qcompiler.ir.tensor import Tensor
from qcompiler.onnx_io.graph_protos import graph_protos
from qcompiler.onnx_io.rewrite import STUB_BYTES, rewritten_copy

ON_INPUT = "qcompiler_switch_on"       # bool [switches]: quantized (True) or `off` (False)
WIDE_INPUT = "qcompiler_switch_wide"   # bool [switches]: the 16-bit alternative, where the switch is on
PREFIX = "qcompiler_sw"


@dataclass
class Wide:
    """A switch's 16-bit alternative: `source` through a Q16 -> DQ16 pair on (scale, zero_point)."""

    source: str
    scale: np.ndarray
    zero_point: np.ndarray
    axis: Optional[int] = None   # a per-channel grid's axis
    domain: str = ""             # "com.microsoft": 16-bit Q/DQ at any opset


@dataclass
class Site:
    """Where switch `index` acts: the readers of `value` (a DequantizeLinear's output, or a weight stored on its
    grid) read `Where(on[index], value, off)`. Several sites may share one switch."""

    index: int
    value: str
    off: Union[str, np.ndarray]   # a value's name in scope, or a constant (added as a main-graph initializer)
    off_op: Optional[Callable[[str, str], onnx.NodeProto]] = None   # (off name, output name) -> the node that
    #                                                                  computes the off value from `off`
    wide: Optional[Wide] = None
    path: tuple = ()              # the body holding `value` (resolved by add_switches' `body_at`); () main graph
    reader: Optional[Tuple[str, int]] = None   # only this (node name, input slot) reads the switch


@dataclass
class Switches:
    """The switch inputs of a switchable model and their length (the order is the caller's site indices)."""

    on: str
    wide: Optional[str]
    count: int

    def feed(self, on: np.ndarray, wide: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
        feed = {self.on: np.asarray(on, bool)}
        if self.wide is not None and wide is not None:
            feed[self.wide] = np.asarray(wide, bool)
        return feed


def rename_reads(graph, rename: Dict[str, str]) -> None:
    """Rename read values in `graph` and in every body below it (a body reads outer values by name)."""
    for g in graph_protos(graph):
        for n in g.node:
            for s, x in enumerate(n.input):
                if x in rename:
                    n.input[s] = rename[x]


class _Builder:
    def __init__(self, graph, count: int, wide: bool, wide_over_off: bool, prefix: str, arrays: Optional[dict]):
        self.prefix, self.wide_over_off, self.arrays = prefix, wide_over_off, arrays
        self.first: list = []      # the switch Gathers: main graph, before every node (a body reads them by name)
        self.inits: list = []
        self.gathered: set = set()
        self.indexed: set = set()
        graph.input.append(helper.make_tensor_value_info(ON_INPUT, onnx.TensorProto.BOOL, [count]))
        if wide:
            graph.input.append(helper.make_tensor_value_info(WIDE_INPUT, onnx.TensorProto.BOOL, [count]))

    def switch(self, which: str, i: int) -> str:
        """The bool scalar `which[i]` (one Gather per switch and input)."""
        tag = "w" if which == WIDE_INPUT else "on"
        idx, out = f"{self.prefix}{i}_idx", f"{self.prefix}{i}_{tag}"
        if out not in self.gathered:
            if i not in self.indexed:
                self.indexed.add(i)
                self.inits.append(numpy_helper.from_array(np.asarray(i, np.int64), idx))
            self.gathered.add(out)
            self.first.append(helper.make_node("Gather", [which, idx], [out], name=f"{out}_g"))
        return out

    def where(self, which: str, i: int, yes: str, no: str, out: str, name: str):
        return helper.make_node("Where", [self.switch(which, i), yes, no], [out], name=name)

    def const(self, arr, name: str) -> str:
        arr = np.asarray(arr)
        if self.arrays is not None and arr.nbytes > STUB_BYTES and arr.dtype.kind in "biuf":
            self.arrays[name] = arr     # a stub here; the caller attaches the array itself
            self.inits.append(onnx.TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(arr.dtype),
                                               dims=arr.shape))
        else:
            self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def graph(self, graph, sites: List[Tuple[int, Site]]) -> None:
        """Switch the `sites` of one graph (every site's value lives in `graph`) and rebuild its node list."""
        producer = {o: j for j, n in enumerate(graph.node) for o in n.output if o}
        by_name = {n.name: j for j, n in enumerate(graph.node) if n.name}
        after: Dict[int, list] = {}
        before: Dict[int, list] = {}
        head: list = []
        rename: Dict[str, str] = {}
        for k, s in sites:
            t = f"{self.prefix}s{k}"
            off = s.off if isinstance(s.off, str) else self.const(s.off, f"{t}_off")
            nodes = []
            if s.off_op is not None:
                nodes.append(s.off_op(off, f"{t}_fo"))
                off = f"{t}_fo"
            j = producer.get(s.value)
            if s.reader is not None:
                r = by_name[s.reader[0]]
                graph.node[r].input[s.reader[1]] = out = f"{t}_sel"
                quant, place = s.value, before.setdefault(r, [])
            elif j is not None:
                outs = graph.node[j].output
                quant = f"{t}_q"
                outs[list(outs).index(s.value)] = quant
                out, place = s.value, after.setdefault(j, [])
            else:   # an initializer or input: its readers read the switch instead
                out = rename[s.value] = f"{t}_sel"
                quant, place = s.value, head
            if s.wide is None:
                nodes.append(self.where(ON_INPUT, s.index, quant, off, out, f"{t}_where"))
            else:
                w = s.wide
                sc, zp = self.const(w.scale, f"{t}_s16"), self.const(w.zero_point, f"{t}_z16")
                kw = {"axis": w.axis} if w.axis is not None else {}
                nodes += [helper.make_node("QuantizeLinear", [w.source, sc, zp], [f"{t}_q16"], name=f"{t}_q16",
                                           domain=w.domain, **kw),
                          helper.make_node("DequantizeLinear", [f"{t}_q16", sc, zp], [f"{t}_dq16"],
                                           name=f"{t}_dq16", domain=w.domain, **kw)]
                if self.wide_over_off:    # Where(wide, DQ16, Where(on, DQ, off))
                    nodes += [self.where(ON_INPUT, s.index, quant, off, f"{t}_sel", f"{t}_where"),
                              self.where(WIDE_INPUT, s.index, f"{t}_dq16", f"{t}_sel", out, f"{t}_wwhere")]
                else:                     # Where(on, Where(wide, DQ16, DQ), off)
                    nodes += [self.where(WIDE_INPUT, s.index, f"{t}_dq16", quant, f"{t}_wq", f"{t}_wwhere"),
                              self.where(ON_INPUT, s.index, f"{t}_wq", off, out, f"{t}_where")]
            place.extend(nodes)
        if rename:
            rename_reads(graph, rename)    # before the Where nodes that read the old names go in
        nodes = list(graph.node)
        del graph.node[:]
        graph.node.extend(head)
        for j, n in enumerate(nodes):
            graph.node.extend(before.get(j, ()))
            graph.node.append(n)
            graph.node.extend(after.get(j, ()))


def add_switches(mp: onnx.ModelProto, sites: Sequence[Site], count: int, wide: bool = False,
                 wide_over_off: bool = False, body_at: Optional[Callable] = None, prefix: str = PREFIX,
                 arrays: Optional[dict] = None) -> Switches:
    """Switch the `sites` in `mp` (in place; module docstring): bool inputs ON_INPUT (and WIDE_INPUT with `wide`)
    of `count` entries, site.index picking the entry. A wide alternative counts while its switch is on, or with
    `wide_over_off` whatever the switch says (the debugger widens quantizers it turned off). `body_at(graph,
    path)`: the body GraphProto of a site's `path` (sites in bodies only). `arrays`: constants over STUB_BYTES go
    into `mp` as stubs (no data) and into this dict by name, for a caller that attaches them (switchable_model)."""
    g = mp.graph
    b = _Builder(g, count, wide, wide_over_off, prefix, arrays)
    by_path: Dict[tuple, list] = {}
    for k, s in enumerate(sites):
        by_path.setdefault(tuple(s.path), []).append((k, s))
    # NOTE: bodies first, the deepest first: a body's GraphProto is reached through its parent's node list by
    # index, before that list is rebuilt
    for path in sorted(by_path, key=lambda p: -len(p)):
        b.graph(body_at(g, path) if path else g, by_path[path])
    if () not in by_path:
        b.graph(g, [])
    nodes = list(g.node)
    del g.node[:]
    g.node.extend(b.first)
    g.node.extend(nodes)
    g.initializer.extend(b.inits)
    del g.value_info[:]    # values were renamed; onnxruntime infers the rest
    return Switches(ON_INPUT, WIDE_INPUT if wide else None, count)


def switchable_model(model, sites: Sequence[Site], count: int, wide: bool = False):
    """(IR Model, Switches): `model` with the `sites` switched (add_switches), sharing `model`'s weights and the
    sites' constant arrays (neither is copied); `model` is unchanged.

    NOTE: minilm_l6 at --min-sqnr 40: the copy costs 5 MB of RSS where the ModelProto copy cost 56 MB (and its
    serialized bytes 37 MB more while the session was made); the net's first pass peaks 66 MB over the model
    instead of 93 MB, and the second starts 50 MB lower."""
    out: list = []
    arrays: dict = {}

    def build(proto):
        out.append(add_switches(proto, sites, count, wide, arrays=arrays))
        return proto

    new = rewritten_copy(model, build, "build the switchable copy")
    for name, arr in arrays.items():
        new.graph.initializers[name].tensor = Tensor.from_array(arr)   # the stub's, before anyone reads it
    return new, out[0]


__all__ = ["ON_INPUT", "WIDE_INPUT", "Site", "Switches", "Wide", "add_switches", "rename_reads", "switchable_model"]
