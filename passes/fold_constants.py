"""fold-constants: evaluate nodes whose inputs are all constants and replace them by initializers.

Evaluated with onnx's reference evaluator, one node at a time. Skipped: nodes with subgraphs, random ops,
non-default domains, and results above `max_elements` (folding must not blow up the model, e.g. a
ConstantOfShape of 1e9 elements). Constants that belong to a recognised structure are left alone by later passes,
not here: folding a node whose inputs are all constant is always exact.
"""
from __future__ import annotations

import numpy as np
from onnx import helper

from qcompiler.onnx_io.exporter import node_attr_protos
from qcompiler.passmanager import Pass, PassResult, register_pass

_NEVER = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli",
          "Constant", "If", "Loop", "Scan", "SequenceConstruct", "SequenceEmpty", "Optional", "QuantizeLinear",
          "DequantizeLinear", "DynamicQuantizeLinear"}


def _output_size_bound(node, arrays) -> float:
    """An upper bound on the output element count of shape-producing ops, known before evaluating them.

    NOTE: a hostile model can ask ConstantOfShape/Expand/Tile/Range for 10^12 elements; evaluating first and
    checking after would already have allocated them.
    """
    op = node.op_type
    try:
        if op == "ConstantOfShape":
            return float(np.prod(np.asarray(arrays[0], np.float64)))
        if op == "Expand":
            return float(np.prod(np.maximum(np.asarray(arrays[1], np.float64), 1))) * max(arrays[0].size, 1)
        if op == "Tile":
            return float(arrays[0].size) * float(np.prod(np.asarray(arrays[1], np.float64)))
        if op == "Range":
            start, limit, delta = (float(np.ravel(a)[0]) for a in arrays[:3])
            return abs((limit - start) / delta) if delta else float("inf")
        if op in ("Resize", "Upsample", "Pad", "OneHot", "EyeLike", "RandomNormal"):
            return float("inf")  # sizes depend on several inputs; never folded
    except Exception:
        return float("inf")
    return 0.0


def _evaluate(node, arrays, opset: int):
    in_names = [f"i{k}" if a is not None else "" for k, a in enumerate(arrays)]
    out_names = [f"o{k}" if v is not None else "" for k, v in enumerate(node.outputs)]
    p = helper.make_node(node.op_type, in_names, out_names, domain=node.domain)
    p.attribute.extend(node_attr_protos(node))
    # NOTE: imported on the first fold: onnx's reference evaluator is ~10% of `qcompiler run`'s start-up, and
    # every pipeline registers this pass
    from onnx.reference import ReferenceEvaluator
    ev = ReferenceEvaluator(p, opsets={"": opset})
    feeds = {n: a for n, a in zip(in_names, arrays) if n}
    return ev.run(None, feeds)


@register_pass
class FoldConstants(Pass):
    name = "fold-constants"
    description = "evaluate nodes whose inputs are all constant and store the results as initializers"
    preserves_semantics = True
    max_elements = 1 << 20

    def run(self, model) -> PassResult:
        folded, skipped = 0, 0
        for g in model.graphs():
            for node in g.nodes:
                if node.op_type in _NEVER or node.domain not in ("", "ai.onnx") or node.subgraphs():
                    continue
                if not node.inputs or any(v is not None and not v.is_constant() for v in node.inputs):
                    continue
                if any(v is not None and v.is_output_of_any_graph() for v in node.outputs):
                    continue
                arrays = [None if v is None else v.const_value() for v in node.inputs]
                if any(a is not None and (a.dtype == object or a.size > self.max_elements) for a in arrays) \
                        or _output_size_bound(node, arrays) > self.max_elements:
                    skipped += 1
                    continue
                try:
                    results = _evaluate(node, arrays, model.opset)
                except Exception:
                    skipped += 1
                    continue
                if any(np.asarray(r).size > self.max_elements for r in results):
                    skipped += 1
                    continue
                for v, r in zip(node.outputs, results):
                    if v is None:
                        continue
                    r = np.asarray(r)
                    c = g.add_constant(r, v.name + "_folded")
                    g.replace_all_uses(v, c)
                inputs = list(node.inputs)
                g.remove_node(node)
                g.drop_if_unused(inputs)  # constants only the folded node read
                folded += 1
        return PassResult(folded > 0, {"folded": folded, "skipped": skipped})
