"""Inline model-local functions (`model.functions`) into the graphs that call them.

torch.onnx's dynamo exporter (torch 2.1-2.4 `dynamo_export`, and `export(dynamo=True)` without its optimizer)
writes every nn.Module as a model-local function (`pkg.torch.2.3::torch_nn_modules_linear_Linear_fc1_1`) whose
weights come in as function inputs. To every pass that looks at the graph such a call is one opaque node: its
MatMul/Conv are never quantized, its LayerNorm is never seen as one, and onnx's version converter (the
`convert-opset` pass) drops the functions, after which onnxruntime refuses the model ("... is not a registered
function/op"). Inlining first (onnx.inliner, bodies of If/Loop/Scan too) makes the graph the one the exporter
traced; node and value names inside a call get a unique suffix (`aten::mm_1__1`), graph inputs, outputs and
initializer names do not change.

Only functions called from the model are inlined (a FunctionProto nobody calls is kept verbatim); a call to a
function that another one calls is inlined all the way down. The inliner works on the graph only: initializers
go to it as stubs (qcompiler/onnx_io/rewrite.py) (name, type, shape, no data) and the model keeps its own tensors, so no weight is
copied or decoded.
"""
from __future__ import annotations

import onnx.inliner

from qcompiler.onnx_io.rewrite import rewrite_in_place
from qcompiler.passmanager import Pass, PassResult, register_pass


def _called(model) -> set:
    """(domain, name) of the local functions some node of the model calls."""
    local = {(f.domain, f.name) for f in model.functions}
    return {(n.domain, n.op_type) for g in model.graphs() for n in g.nodes
            if (n.domain, n.op_type) in local}


def inline_local_functions(model) -> int:
    """Inline the called local functions of `model` in place; the number of call sites inlined."""
    called = _called(model)
    if not called:
        return 0
    sites = sum(1 for g in model.graphs() for n in g.nodes if (n.domain, n.op_type) in called)
    rewrite_in_place(model, onnx.inliner.inline_local_functions, "inline the model's local functions")
    return sites


@register_pass
class InlineFunctions(Pass):
    """Calls of model-local functions (torch dynamo's one function per module) replaced by their bodies."""

    name = "inline-functions"
    description = "inline model-local functions (torch dynamo exports: one per module) into their callers"
    preserves_semantics = True

    def run(self, model) -> PassResult:
        n = inline_local_functions(model)
        return PassResult(n > 0, {"inlined": n})
