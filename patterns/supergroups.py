"""Supergroups: the one list of kinds and the annotation that records each pattern match on the IR.

Every member node gets `supergroup = "<group>:<k>"`, every value computed inside it gets `supergroup_interior`,
its structural constants get `protected` (qcompiler/ir/annotations.py). The `annotate-supergroups` pass
(passes/supergroups.py) and quantizer placement both call `annotate_graph`; placement reads the kinds here.
"""
from __future__ import annotations

from qcompiler.patterns.matcher import find_matches

from qcompiler.ir.annotations import annotate, annotation

# The one list of supergroup kinds: kind -> whether quantization keeps its interior float by default
# (qcompiler/quant/placement.py reads FLOAT_INTERIOR_KINDS from here). Order matters: a node belongs to the first
# group that claims it (norms and activations before linear+bias).
# NOTE: HardSigmoid gates are recognised but their interior is not kept float by default: the gate's [0, 1] output
# quantizes well, and on ppocr_cls keeping it float lowered agreement from 0.9925 to 0.9875 (configs can ask for
# it by name). Conv+BN+act and MatMul+Add pairs get their fused-pair treatment from the target profile instead.
SUPERGROUP_KINDS = {"layernorm": True, "rmsnorm": True, "gelu": True, "silu": True, "hardswish": True,
                    "hardsigmoid_gate": False, "conv_bn_act": False, "matmul_add": False}
DEFAULT_GROUPS = tuple(SUPERGROUP_KINDS)
FLOAT_INTERIOR_KINDS = tuple(k for k, keep_float in SUPERGROUP_KINDS.items() if keep_float)


def annotate_supergroups(model, groups=DEFAULT_GROUPS) -> dict:
    """Mark every match of `groups` in the model (bodies too) as a supergroup; returns {group: count}."""
    return annotate_graph(model.graph, groups)


def annotate_graph(graph, groups=DEFAULT_GROUPS, recurse: bool = True) -> dict:
    """Mark every match of `groups` in `graph` as a supergroup; returns {group: new count}. Idempotent: nodes
    already in a supergroup are never claimed again, so a second call adds nothing."""
    counts = {}
    for group in groups:
        n = 0
        taken = {annotation(node, "supergroup") for g in ([graph] + (graph.subgraphs(True) if recurse else []))
                 for node in g if annotation(node, "supergroup", "").startswith(group + ":")}
        k = len(taken)
        for m in find_matches(graph, group, recurse=recurse):
            if any(annotation(node, "supergroup") for node in m.nodes):
                continue
            sg = f"{group}:{k}"
            k += 1
            outs = {id(v) for v in m.outputs}
            for node in m.nodes:
                annotate(node, "supergroup", sg)
                annotate(node, "supergroup_pattern", m.pattern)
                for v in node.outputs:
                    if v is not None and id(v) not in outs:
                        annotate(v, "supergroup_interior", sg)
            for c in m.constants.values():
                annotate(c, "protected")
                if c.producer is not None:
                    annotate(c.producer, "protected")
            n += 1
        counts[group] = n
    return counts


def supergroups_in(graph) -> dict:
    """{supergroup id: [nodes in graph order]} as annotated in one graph."""
    out: dict = {}
    for node in graph:
        sg = annotation(node, "supergroup")
        if sg:
            out.setdefault(sg, []).append(node)
    return out


