"""Quantizers that only cost time: a Q/DQ pair between two ops that both run float kernels on the target.

On a runtime whose QDQ fusions are known (the profile's `fusions` table, qcompiler/quant/targets/fusions.py), a quantizer
earns its run time only next to an op that runs an integer kernel: the op that produces the value (a QLinearConv
needs its output Q) or one that reads it (a QLinearMatMul needs the DQ on its input), looking through ops whose
Q/DQ the runtime drops (Reshape, Transpose, MaxPool, ...: they run on the integer data). Anywhere else the pair
is a round trip to the grid that the float op after it undoes: it costs two kernels per run and some accuracy and
buys nothing (measured on ppocr_cls: 18 Conv+HardSwish units run float, and the Q/DQ pairs around them
made the model 1.45x float; without them 1.21x, with agreement 0.9925 -> 0.9950). A value 8 bits cannot carry,
widened to 16 bits for a reader that has no 16-bit integer kernel (onnxruntime CPU has none), is the same case:
float is more accurate than 16 bits and costs nothing (minilm_l6: 46 such tensors, 1.04x -> 0.94x float).

Which nodes run integer kernels is judged on the plan before this step (every quantizer still in place), and a
value keeps its quantizer when any neighbour is such a node, so no integer kernel loses an input or output it
needs. `--optimize accuracy` skips the step (every quantizer stays, for targets whose kernels are not known).

Under `--optimize latency` two cost rules of the table also make a node "float kernel" (`cost=True`):
`min_macs` (placement/cost.py: an integer region whose products do not pay for the Q, DQ and layout changes at
its border) and `inputs_from_integer` (an elementwise QLinear unit only where every input already leaves an
integer kernel); then every quantizer with no integer-kernel neighbour goes and float kernels read float
weights. Measured (onnxruntime 1.32, AVX-512 VNNI, CPU clock): ppocr_cls 1.14x -> ~0.75x float at agreement 1.0
(no region of it pays: the model comes out float, with qcompiler's HardSwish/BatchNorm folding); minilm_l6
0.95x at cosine 0.9978.

`--optimize balanced` (the default, `cost="balanced"`) takes the same rules with three limits, so that what the
default promises holds: (1) the size rule counts only borders with a float Conv (the NCHWc <-> NHWC layout
change is what sinks an island; cost.small_regions `layout_only`), never a graph input or output or a float
Gemm/Flatten/ConvTranspose: a small model whose integer kernels form one region keeps them and their Q/DQ; (2)
only 8-bit activation quantizers (and widened 16-bit ones) go: a width the user asked for stays; (3) a float
kernel's weights are exact float (the profile's `float_kernel_weights`: on their grid they bought neither size nor
speed; a MatMul's then go int8 to narrow-float-weights). `--optimize size` places activations as `balanced` and
keeps those weights int8 + DequantizeLinear (a quarter of the bytes, a DQ at run time). Measured (CPU clock, 30 runs,
2 runs): ppocr_cls 1.13x -> ~0.77x float (agreement 0.9925 -> 0.995), char_rnn 1.11x -> ~0.99x (the Q/DQ pairs
around LSTM/GRU gone, weights on their grid; drop -0.02 pt), minilm_l6 1.00x -> ~0.96x (cosine 0.9972 -> 0.9989),
mobilenet_like 1.35x -> ~0.95x.

What is left with no integer-kernel neighbour goes to plan.trim_candidates, and under `--optimize latency` the
widened values an integer kernel would read at 8 bits are narrowed and listed in plan.narrow_candidates (their
readers' float weights in plan.narrow_weights): passes/quantize/latency_search.py decides those by measurement within the
user's budget. `balanced` searches nothing: with only the trim pairs out (islands kept integer) ppocr_cls
flipped 3 of 400 eval images (agreement 0.9925 -> 0.985); with its islands float as well 0.995.
"""
from __future__ import annotations

from typing import Dict, Optional

from qcompiler.quant.core.plan import QuantPlan
from qcompiler.quant.placement.cost import small_regions
from qcompiler.quant.placement.kernels import group_bits_table
from qcompiler.quant.placement.storage import requantized_if_float

ACT_BITS = {"uint8": 8, "int8": 8, "uint16": 16, "int16": 16, "uint4": 4, "int4": 4}


def _spec_bits(plan: QuantPlan, table: Dict[str, int], node, slot: int, v) -> Optional[int]:
    """Bits the input `slot` of `node` reaches it with through a DQ, None when it arrives float."""
    spec = plan.uses.get((node.name, slot))
    if spec is not None:
        if spec.keep_float:
            return None
        if spec.kind in ("weight", "bias"):
            return spec.bits
    spec = plan.spec(v.name)
    if spec is None or spec.keep_float or spec.kind != "activation":
        return None
    return table.get(plan.find(v.name), spec.bits)


class _Kernels:
    """Which nodes of the graph will run an integer kernel, given the plan and the fusion table."""

    def __init__(self, plan: QuantPlan, table, cost=False):
        """`cost`: apply the table's cost rules (min_macs, inputs_from_integer) besides onnxruntime's own;
        "balanced": the size rule counts only borders with a float Conv (cost.small_regions `layout_only`)."""
        self.plan, self.table, self.cost = plan, table, cost
        self.bits = group_bits_table(plan)
        self.memo: Dict[int, bool] = {}
        self.through = set(plan.profile.output_q_through)
        self.small: set = set()

    def size_rule(self, g) -> "_Kernels":
        """Apply the table's `min_macs` cost rule (placement/cost.py) to the main graph `g`: the nodes of integer
        regions too small to pay for their border's Q/DQ are judged float from here on."""
        if self.cost and self.plan.node_macs and g.parent is None:
            self.small = small_regions(self, g, self.cost == "balanced")   # positional: tests patch it with a lambda
            self.memo.clear()
        return self

    def rule(self, node, action: str):
        for r in self.table.for_op(node.op_type):
            if r.action == action:
                return r
        return None

    def _accepts(self, r, bits: Optional[int]) -> bool:
        return bits is not None and bits in {ACT_BITS.get(t) for t in r.act_dtypes or ("uint8", "int8")}

    def output_quantized(self, node, r) -> bool:
        """A Q (of a width the rule takes) on the node's output, directly or behind ops the unit absorbs."""
        v = node.outputs[0] if node.outputs else None
        while v is not None:
            spec = self.plan.spec(v.name)
            if spec is not None and not spec.keep_float and spec.kind == "activation":
                return self._accepts(r, self.bits.get(self.plan.find(v.name), spec.bits))
            readers = v.consumers()
            if len(readers) != 1 or readers[0].op_type not in set(r.absorbs) | self.through \
                    or v.is_output_of_any_graph():
                return False
            v = readers[0].outputs[0] if readers[0].outputs else None
        return False

    def guarded_by(self, node) -> bool:
        """Is `node` (an Add of a constant bias) the only reader of an integer kernel whose rule says a float
        fusion would take the unit away unless `node`'s output keeps its Q (MatMulAddFusion)?"""
        def const(x) -> bool:       # without decoding the tensor
            return x is not None and ((x.tensor is not None and not x.is_input)
                                      or (x.producer is not None and x.producer.op_type == "Constant"))
        if len(node.inputs) != 2 or None in node.inputs or const(node.inputs[0]) == const(node.inputs[1]):
            return False
        x = node.inputs[1] if const(node.inputs[0]) else node.inputs[0]
        q = x.producer
        if q is None or q.graph is not node.graph or len(x.uses()) != 1 or x.is_output_of_any_graph():
            return False
        r = self.rule(q, "replace")
        return r is not None and node.op_type in r.keeps_q_after and self.integer(q)

    def weight_only(self, node, slot: int, spec) -> bool:
        """A weight-only integer kernel (MatMulNBits: blocked int4 weights, float activations) takes this weight."""
        r = self.rule(node, "weight_only")
        return r is not None and slot == 1 and spec.kind == "weight" and \
            spec.bits in {ACT_BITS.get(t) for t in r.weight_dtypes} and spec.bits != 8

    def emits_integer(self, v) -> bool:
        """Does `v` leave an integer kernel quantized (its producer, through ops whose Q/DQ the runtime drops or
        that the kernel absorbs, runs integer and writes a Q)? A graph input or a float producer's output would
        need a QuantizeLinear of its own."""
        for _ in range(16):
            p = v.producer if v is not None else None
            if p is None or p.graph is not v.graph or not p.inputs:
                return False
            r = self.rule(p, "replace")
            if r is not None:       # a MatMul writes a Q only where one follows it (else MatMulIntegerToFloat)
                return self.integer(p) and (r.output_q == "required" or self.output_quantized(p, r))
            if self.rule(p, "drop_qdq") is None and p.op_type not in self.through:
                return False
            v = p.inputs[0]
        return False

    def integer(self, node) -> bool:
        key = id(node)
        if key not in self.memo:
            self.memo[key] = self._integer(node)
        return self.memo[key]

    def _integer(self, node) -> bool:
        r = self.rule(node, "replace")
        if r is None or id(node) in self.small:
            return False
        slots = range(len(node.inputs))
        if r.dq_inputs == "first":
            slots = range(min(1, len(node.inputs)))
        elif r.dq_inputs == "values":
            slots = range(1, len(node.inputs))
        for i in slots:
            v = node.inputs[i]
            if v is None:
                continue
            bits = _spec_bits(self.plan, self.bits, node, i, v)
            use = self.plan.uses.get((node.name, i))
            if use is not None and use.kind == "bias":
                if bits is None:
                    return False
                continue
            if use is not None and use.kind == "weight":
                if bits is None or bits not in {ACT_BITS.get(t) for t in r.weight_dtypes or ("uint8", "int8")}:
                    return False
                continue
            if not self._accepts(r, bits):
                return False
            if self.cost and r.inputs_from_integer and not self.emits_integer(v):
                return False
        if r.output_q == "required":
            return self.output_quantized(node, r)
        return True


def _usefulness(plan: QuantPlan, g, k: "_Kernels"):
    """is_useful(v): does an integer-kernel neighbour (through ops whose Q/DQ the runtime drops) need v's
    quantizer?"""
    useful: Dict[str, bool] = {}

    def is_useful(v) -> bool:
        if v.name in useful:
            return useful[v.name]
        useful[v.name] = False      # a cycle through data movement proves nothing
        p = v.producer
        ok = False
        if p is not None and p.graph is g:
            r = k.rule(p, "replace")
            if r is not None and r.output_q == "required" and k.integer(p):
                ok = True
            elif p.op_type in k.through and p.inputs and p.inputs[0] is not None \
                    and p.inputs[0].producer is not None:
                q = p.inputs[0].producer     # a Relu/Clip behind an integer Conv: the Q the unit needs
                rq = k.rule(q, "replace")
                ok = rq is not None and p.op_type in rq.absorbs and k.integer(q)
            if not ok:
                ok = k.guarded_by(p)
        if not ok:
            for u in v.uses():
                if u.is_graph_output:
                    continue
                reader = u.user
                if reader.graph is not g:      # read inside an If/Loop/Scan body: its own placement decides
                    ok = True
                    break
                if k.integer(reader):
                    ok = True
                elif k.rule(reader, "drop_qdq") is not None and u.index == 0 and reader.outputs \
                        and reader.outputs[0] is not None and is_useful(reader.outputs[0]):
                    ok = True
                if ok:
                    break
        useful[v.name] = ok
        return ok
    return is_useful


def _narrow_widened(plan: QuantPlan, g, table, cost: bool = False) -> None:
    """`--optimize latency`: every value placement widened to 16 bits goes back to 8 bits where an integer kernel
    then reads or writes it (plan.narrow_candidates: the latency search keeps each at 8 bits only while the output
    SQNR stays within the budget, else it goes float), and float where none does (as `balanced`)."""
    wide = {v.name: plan.spec(v.name).bits for v in list(g.inputs) + [o for n in g.nodes for o in n.outputs
                                                                       if o is not None]
            if (s := plan.spec(v.name)) is not None and s.kind == "activation" and not s.keep_float and s.widened
            and s.bits > 8}
    if not wide:
        return
    for name in wide:
        plan.spec(name).bits = 8
    k = _Kernels(plan, table, cost).size_rule(g)
    is_useful = _usefulness(plan, g, k)
    values = {v.name: v for v in list(g.inputs) + [o for n in g.nodes for o in n.outputs if o is not None]}
    narrowed = [name for name in wide if is_useful(values[name])]
    for name in wide:
        spec = plan.spec(name)
        if name in narrowed:
            spec.source = (spec.source + "; " if spec.source else "") + \
                f"narrowed to 8 bits for an integer kernel (--optimize latency; was {wide[name]} bits: {spec.widened})"
            spec.widened = None
        else:
            spec.bits = wide[name]
    # a tie group carries its widest member's bits (calibrate.py): every member of a narrowed group is now 8-bit
    # and switches with it (latency_search groups them by plan.find)
    roots = {plan.find(name) for name in narrowed}
    plan.narrow_candidates = [name for name, s in plan.values.items()
                              if s.kind == "activation" and not s.keep_float and plan.find(name) in roots]
    # the float weights of the kernels that become integer only through a narrowed value: where the search
    # keeps that value float, the kernel is float again and reads them as `balanced` does (float, not the
    # integer kernel's reduced grid: minilm_l6's FFN down projection fell to 3.3 dB on it)
    for name in narrowed:
        for u in values[name].uses():
            node = u.user
            if u.is_graph_output or node.graph is not g or not k.integer(node):
                continue
            for slot, x in enumerate(node.inputs):
                spec = plan.uses.get((node.name, slot))
                arr = x.const_value() if x is not None and spec is not None and spec.kind == "weight" else None
                if arr is not None:
                    plan.narrow_weights[(node.name, slot)] = (plan.find(name), arr)


def _enters_a_body(v) -> bool:
    """`v` is an input of an If/Loop/Scan (its encoding is tied to the body's side by body_float_regions): the
    latency search, which measures the main graph only, leaves it as placement decided."""
    return any(u.user is not None and u.user.subgraphs() for u in v.uses())


# objectives that place activations as `balanced` (size differs in how weights are stored, not in quantizers)
ACTIVATIONS_AS_BALANCED = ("balanced", "size")


def drop_float_region_quantizers(plan: QuantPlan, g, table, everywhere: bool = False, narrow: bool = False,
                                 cost=False) -> int:
    """Mark float the main-graph activation quantizers with no integer-kernel neighbour: those placement widened
    beyond 8 bits (`balanced`: float is more accurate than 16 bits and costs nothing; a width the user asked for
    stays), or all of them (`everywhere`: on ppocr_cls 1.45x -> 1.21x float, agreement 0.9925 -> 0.9875 on its
    400 images, where one image is 0.25 points); and the weights and biases of main-graph nodes that run float
    kernels where the profile's `float_kernel_weights` says "float" for `plan.optimize`. `cost` "size" places
    activations as "balanced". Returns how many specs it marked."""
    cost = "balanced" if cost in ACTIVATIONS_AS_BALANCED else cost
    if narrow:
        _narrow_widened(plan, g, table, cost)
    k = _Kernels(plan, table, cost).size_rule(g)
    is_useful = _usefulness(plan, g, k)

    balanced = cost == "balanced"

    def candidate(v, s) -> bool:
        bits = k.bits.get(plan.find(v.name), s.bits)
        if s.widened and bits > 8:
            return True
        # balanced: the 8-bit quantizers (the width integer kernels take); a width the user asked for stays
        return everywhere and (not balanced or bits == 8)

    candidates = [v for v in list(g.inputs) + [o for n in g.nodes for o in n.outputs if o is not None]
                  if (s := plan.spec(v.name)) is not None and s.kind == "activation" and not s.keep_float
                  and candidate(v, s)]
    verdict = {v.name: is_useful(v) for v in candidates}
    dropped = 0
    for v in candidates:
        if not verdict[v.name]:
            spec = plan.spec(v.name)
            what = "16-bit " if spec.bits > 8 else ""
            why = f" (widened: {spec.widened})" if spec.widened and spec.bits > 8 else ""
            spec.float_(f"no integer kernel on {plan.profile.name} reads or writes it: a {what}"
                        f"Q/DQ pair here would only cost time (--optimize accuracy keeps it){why}")
            dropped += 1
    # a weight of a node that runs a float kernel is multiplied in float whatever its grid: on the grid it buys
    # neither size (stored float) nor speed and costs accuracy (three stacked LSTMs on their 7-bit grid: embedding
    # cosine 0.9998 -> 0.987, where onnxruntime's own quantizer leaves them float). The profile says per objective
    # whether such a weight is exact float or stored narrow (Profile.float_kernel_weight_form: `size` keeps it
    # int8 + DQ, a MatMul's goes to narrow-float-weights); `--optimize accuracy` never gets here (on the grid)
    # A grid the user asked for (a config rule's, not the target's default width, or per-block) stays, with
    # its node's bias.
    asked = {n for (n, _), spec in plan.uses.items() if spec.kind == "weight" and not spec.keep_float
             and (spec.asked or spec.bits != plan.profile.weight.bits or spec.block_size)}
    for (node_name, slot), spec in plan.uses.items():
        node = plan.nodes.get(node_name)
        if spec.kind not in ("weight", "bias") or spec.keep_float or node is None or node.graph is not g \
                or node_name in asked:
            continue
        if plan.profile.float_kernel_weight_form(plan.optimize, node.op_type) != "float":
            continue
        if not k.integer(node) and not k.weight_only(node, slot, spec) and not requantized_if_float(plan, node):
            spec.float_(f"{node.op_type} runs a float kernel on {plan.profile.name}: its {spec.kind} on an "
                        f"integer grid would only cost accuracy (--optimize accuracy keeps it, --optimize size "
                        f"stores it int8)")
            dropped += 1
    # what is left with no integer-kernel neighbour: the latency search's candidates (judged with every
    # quantizer still in place, so taking any of them out leaves every integer kernel its Q/DQ)
    plan.trim_candidates = [v.name for v in list(g.inputs) + [o for n in g.nodes for o in n.outputs if o is not None]
                            if (s := plan.spec(v.name)) is not None and s.kind == "activation" and not s.keep_float
                            and not is_useful(v) and not _enters_a_body(v)]
    return dropped
