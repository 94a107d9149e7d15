"""annotate-supergroups, fuse-layernorm, fuse-gelu: turn the pattern library's matches into IR facts.

A *supergroup* is an annotation (qcompiler/ir/annotations.py lists every key): every member node gets
`supergroup = "<group>:<k>"`, every value computed inside it (not one of its outputs) gets `supergroup_interior`,
and its structural constants (a GELU's 0.5, a LayerNorm's epsilon) get `protected`. The quantization plan reads
these: quantizers sit only at a supergroup's boundary (field notes §2), and scale folding refuses protected
constants (field notes §4). A *fusion* is an actual rewrite into one ONNX op, done only where the opset has it
(LayerNormalization from opset 17, Gelu from opset 20); elsewhere the structure stays a supergroup.
"""
from __future__ import annotations

import numpy as np
from qcompiler.patterns import find_matches
from qcompiler.patterns.layernorm import layernorm_axes
from qcompiler.patterns.supergroups import (  # noqa: F401
    DEFAULT_GROUPS,
    FLOAT_INTERIOR_KINDS,
    SUPERGROUP_KINDS,
    annotate_graph,
    annotate_supergroups,
    supergroups_in,
)

from qcompiler.passmanager import Pass, PassResult, register_pass


@register_pass
class AnnotateSupergroups(Pass):
    name = "annotate-supergroups"
    description = "mark LayerNorm/RMSNorm/GELU/SiLU/HardSwish/HardSigmoid-gate/Conv+BN+act/MatMul+Add as supergroups"
    preserves_semantics = True

    def __init__(self, groups=DEFAULT_GROUPS):
        self.groups = tuple(groups)

    def run(self, model) -> PassResult:
        counts = annotate_supergroups(model, self.groups)
        # annotations do not change the ONNX graph; report them as statistics only
        return PassResult(False, {k: v for k, v in counts.items() if v})


def replace_match(g, match, op_type, inputs, attrs, name):
    """Replace a match with one node computing its (single) output; keeps the output's name."""
    out = match.outputs[0]
    anchor = match.root
    node = g.add_node(op_type, inputs, [out.name + "_fused"], attrs, name=name, before=anchor)
    node.outputs[0].type = out.type
    # the structure's own constants (epsilon, 0.5, ...) go too if nothing else reads them
    g.substitute(out, node.outputs[0], remove=list(reversed(match.nodes)))
    return node


@register_pass
class FuseLayerNorm(Pass):
    name = "fuse-layernorm"
    description = "rewrite decomposed LayerNorm into LayerNormalization (opset >= 17; otherwise left as a supergroup)"
    preserves_semantics = True

    def run(self, model) -> PassResult:
        if model.opset < 17:
            n = len(find_matches(model.graph, "layernorm"))
            return PassResult(False, {"fused": 0, "kept": n,
                                      "reason": f"opset {model.opset} < 17 has no LayerNormalization; "
                                                f"{n} kept as supergroups"} if n else {"fused": 0})
        fused, kept, reasons = 0, 0, {}
        for m in find_matches(model.graph, "layernorm"):
            g = m.root.graph
            x = m.get("x")  # the normalized input (not m.inputs[0]: a folded form may read a constant first)
            axes = layernorm_axes(m)
            rank = len(x.shape) if x is not None and x.shape is not None else None
            last = axes in ((-1,),) or (rank is not None and axes == (rank - 1,))
            gamma, beta = m.get("gamma"), m.get("beta")
            why = None
            if not last:
                why = f"reduces axes {axes}, not the last axis"
            elif gamma is None or beta is None:
                why = "no affine scale/shift"
            else:
                gv, bv = gamma.const_value(), beta.const_value()
                if gv is None or bv is None or gv.ndim != 1 or bv.shape != gv.shape:
                    why = "scale/shift are not 1-D constants of equal length"
                elif gv.dtype != np.float32:
                    why = f"dtype {gv.dtype} not fused"
            if why:
                kept += 1
                reasons[m.root.name] = why
                continue
            eps = float(np.ravel(m.const("epsilon"))[0])
            replace_match(g, m, "LayerNormalization", [x, gamma, beta], {"axis": -1, "epsilon": eps},
                           name=m.root.name + "_layernorm")
            fused += 1
        return PassResult(fused > 0, {"fused": fused, "kept": kept, "kept_reasons": reasons})


@register_pass
class FuseGelu(Pass):
    name = "fuse-gelu"
    description = "rewrite erf/tanh GELU decompositions into Gelu (opset >= 20; otherwise left as a supergroup)"
    preserves_semantics = True

    def run(self, model) -> PassResult:
        matches = find_matches(model.graph, "gelu")
        if model.opset < 20:
            return PassResult(False, {"fused": 0, "kept": len(matches),
                                      "reason": f"opset {model.opset} < 20 has no Gelu; kept as supergroups"}
                              if matches else {"fused": 0})
        fused = 0
        for m in matches:
            approx = "tanh" if m.pattern == "gelu_tanh" else "none"
            replace_match(m.root.graph, m, "Gelu", [m.inputs[0]], {"approximate": approx},
                           name=m.root.name + "_gelu")
            fused += 1
        return PassResult(fused > 0, {"fused": fused})
