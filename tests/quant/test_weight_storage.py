"""Weight storage is decided in the plan (placement.decide_storage) and written once by qdq.apply_plan.

The reference is the rule read from the lowered graph, as the old `prefold_unfused_param_dq` applied it after
QDQ insertion: lower with every DQ explicit (`prefold_unfused_weight_dq: False`), then fold the DQs of weights
and biases whose reader runs a float kernel. The plan-decided model must list the same parameters with the same
reasons, keep the same initializers and give bit-identical outputs (graph optimizations off).
"""
from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper

from qcompiler import model_to_proto
from qcompiler.quant.api import quantize
from qcompiler.quant.core.encoding import dequantize_linear
from qcompiler.quant.core.plan import FLOAT_ON_GRID, INT
from tests.corpus import CORPUS
from tests.helpers import make_model, run, tinfo
from tests.quant.test_quantize_bodies import if_model, loop_model
from tests.quant.test_quantize_fieldnotes import init, samples
from tests.quant.test_quantize_latency_shape import _conv_model, _rnn_model

EXPLICIT = {"base": "ort_cpu", "prefold_unfused_weight_dq": False}
EIGHT = (np.dtype(np.int8), np.dtype(np.uint8))
FOLDABLE = EIGHT + (np.dtype(np.int16), np.dtype(np.uint16), np.dtype(np.int32))


# --- the reference: the rule read from an explicit-DQ graph, folding DQs in graph order ----------------------
def _zp_dtype(dq):
    zp = dq.inputs[2] if len(dq.inputs) > 2 else None
    arr = zp.const_value() if zp is not None else None
    return np.dtype(np.uint8) if arr is None else np.asarray(arr).dtype


def _is_8bit_dq(v):
    p = v.producer if v is not None else None
    return p is not None and p.op_type == "DequantizeLinear" and _zp_dtype(p) in EIGHT


def _feeds_8bit_q(node, through):
    v = node.outputs[0] if node.outputs else None
    while v is not None:
        users = v.uses()
        if len(users) != 1 or users[0].is_graph_output:
            return False
        user = users[0].user
        if user.op_type == "QuantizeLinear":
            return _zp_dtype(user) in EIGHT
        if user.op_type not in through or users[0].index != 0:
            return False
        v = user.outputs[0]
    return False


def _graph_reason(node, profile):
    rule = profile.integer_weight_kernels.get(node.op_type)
    if rule is None:
        return f"{node.op_type} has no integer kernel on this target"
    bits = rule.act_bits
    if not _is_8bit_dq(node.inputs[0]):
        return f"{node.op_type} activation input is not {bits}-bit quantized"
    if not _is_8bit_dq(node.inputs[1] if len(node.inputs) > 1 else None):
        return f"{node.op_type} weight is not {bits}-bit"
    if rule.output_q and not _feeds_8bit_q(node, set(profile.output_q_through)):
        return f"{node.op_type} output is not {bits}-bit quantized"
    return None


def _requantizes(node, profile):
    if node.op_type not in profile.requantizes_float_weights:
        return False
    p = node.inputs[0].producer if node.inputs[0] is not None else None
    if p is None or p.op_type != "DequantizeLinear" or np.size(p.inputs[1].const_value()) != 1:
        return False
    return any(getattr(u.user, "op_type", None) == "QuantizeLinear" for u in node.outputs[0].uses())


def reference_fold(model, profile):
    """Fold, in place, every constant DQ read by a float-kernel node; {parameter name: reason}."""
    done = {}
    for g in model.graph.all_graphs():
        for dq in list(g.nodes_by_op("DequantizeLinear")):
            q, scale = dq.inputs[0], dq.inputs[1]
            zp = dq.inputs[2] if len(dq.inputs) > 2 else None
            qarr = q.const_value()
            if qarr is None or dq.attr("block_size", 0) or np.asarray(qarr).dtype not in FOLDABLE:
                continue
            out = dq.outputs[0]
            unfused = [(u.user, u.index, r) for u in out.uses() if not u.is_graph_output
                       for r in [_graph_reason(u.user, profile)] if r is not None and not _requantizes(u.user, profile)]
            if not unfused:
                continue
            arr = dequantize_linear(qarr, scale.const_value(), zp.const_value(), int(dq.attr("axis", 1)))
            folded = g.add_constant(arr, f"{out.name}_prefolded")
            for node, slot, _ in unfused:
                g.set_input(node, slot, folded)
            done[out.name[:-len("_dequantized")] if out.name.endswith("_dequantized") else out.name] = unfused[0][2]
            if not out.uses():
                g.remove_node(dq)
                g.drop_if_unused([q, scale, zp])
    return done


def _compare(proto, calib, feeds, **kw):
    new = quantize(proto, calib, **kw, optimize="accuracy")
    old = quantize(proto, calib, target=EXPLICIT, **kw, optimize="accuracy")
    from qcompiler.quant.targets.profiles import get_profile
    expected = reference_fold(old.model, get_profile("ort_cpu"))
    assert new.report["prefolded_params"] == expected
    pn, po = model_to_proto(new.model), model_to_proto(old.model)
    assert sorted(i.name for i in pn.graph.initializer) == sorted(i.name for i in po.graph.initializer)
    assert sorted(n.op_type for n in pn.graph.node) == sorted(n.op_type for n in po.graph.node)
    for f in feeds:
        for x, y in zip(run(pn, f, ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
                        run(po, f, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)):
            np.testing.assert_array_equal(x, y)
    return new


def test_conv_fused_and_unfused_match_the_graph_rule():
    proto, shape = _conv_model()
    res = _compare(proto, samples(shape, 8), samples(shape, 2, seed=5))
    storage = {(n, s): spec.storage for (n, s), spec in res.plan.uses.items() if spec.kind == "weight"}
    assert sorted(storage.values()) == [FLOAT_ON_GRID, INT]       # one Conv fuses, the other is stored on grid


def test_rnn_and_int16_matmul_match_the_graph_rule():
    proto, shape = _rnn_model()
    res = _compare(proto, samples(shape, 8), samples(shape, 2, seed=5))
    assert all(s.storage == FLOAT_ON_GRID and "no integer kernel" in s.storage_reason
               for s in res.plan.uses.values() if s.kind == "weight")
    rng = np.random.default_rng(2)
    proto = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [tinfo("x", [2, 8])], [tinfo("y", [2, 5])],
                       [init("w", rng.normal(0, 0.3, (8, 5)).astype(np.float32))])
    _compare(proto, samples([2, 8], 8), samples([2, 8], 2, seed=5), act_bits=16)


def test_conv_bias_of_a_weight_on_grid_is_on_grid_too():
    """Conv -> HardSwish (no output Q): weight and int32 bias both stored on the grid, as the graph rule did
    (the bias's reason reads the weight as not 8-bit: its DQ was folded first)."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSwish", ["c"], ["y"])]
    proto = make_model(nodes, [tinfo("x", [1, 3, 8, 8])], [tinfo("y", [1, 4, 8, 8])],
                       [init("w", rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)),
                        init("b", rng.normal(0, 0.1, (4,)).astype(np.float32))], opset=17)
    res = _compare(proto, samples([1, 3, 8, 8], 8), samples([1, 3, 8, 8], 2, seed=5))
    assert set(res.report["prefolded_params"]) == {"w", "b"}


@pytest.mark.parametrize("make", [if_model, loop_model])
def test_body_weights_match_the_graph_rule(make):
    proto = make()
    feeds = [{i.name: (np.ones([d.dim_value for d in i.type.tensor_type.shape.dim], np.float32)
                       if i.type.tensor_type.elem_type == 1 else np.array(True)) for i in proto.graph.input}]
    rng = np.random.default_rng(0)
    calib = [{k: (rng.normal(0, 1, v.shape).astype(np.float32) if v.dtype == np.float32 else v)
              for k, v in feeds[0].items()} for _ in range(4)]
    _compare(proto, calib, feeds)


@pytest.mark.parametrize("name", ["digits_cnn", "char_rnn"])
def test_corpus_model_matches_the_graph_rule(name):
    folder = os.path.join(CORPUS, name)
    if not os.path.isfile(os.path.join(folder, "model.onnx")):
        pytest.skip("corpus not present")
    d = np.load(os.path.join(folder, "eval.npz"))
    feeds = [{k: d[k][i] for k in d.files if k != "labels"} for i in range(2)]
    import onnx
    _compare(onnx.load(os.path.join(folder, "model.onnx")), os.path.join(folder, "calib.npz"), feeds)


def test_apply_plan_inserts_no_dq_it_would_remove(monkeypatch):
    """Lowering writes the storage decision: no DequantizeLinear is removed while quantizing."""
    from qcompiler.ir.graph import Graph
    removed = []
    orig = Graph.remove_node

    def spy(self, node, *a, **k):
        removed.append(node.op_type)
        return orig(self, node, *a, **k)

    monkeypatch.setattr(Graph, "remove_node", spy)
    proto, shape = _rnn_model()
    res = quantize(proto, samples(shape, 8), optimize="accuracy")   # balanced keeps an LSTM's weights float
    assert res.report["prefolded_params"] and "DequantizeLinear" not in removed
