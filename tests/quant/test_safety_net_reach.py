"""The safety net searches only the quantizers that reach an output it must lift (Graph.outputs_reached, read
from the IR's index): a quantizer that feeds only outputs already above the floor cannot help, and a trial
spent on it is wasted."""
from onnx import helper

from qcompiler.onnx_io import model_from_proto
from qcompiler.passes.quantize.safety_net import _Quantizer, reaching
from tests.helpers import make_model, tinfo


def _two_branch_qdq():
    """x -> Relu -> Q/DQ -> Neg -> 'low' ; x -> Abs -> Q/DQ -> 'good' ; and a Q/DQ on x read by both."""
    s, z = helper.make_tensor("s", 1, [], [0.1]), helper.make_tensor("z", 2, [], [0])   # float scale, uint8 zp
    mk = helper.make_node
    nodes = [mk("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q_x"),
             mk("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dq_x"),
             mk("Relu", ["xd"], ["r"], name="relu"),
             mk("QuantizeLinear", ["r", "s", "z"], ["rq"], name="q_r"),
             mk("DequantizeLinear", ["rq", "s", "z"], ["rd"], name="dq_r"),
             mk("Neg", ["rd"], ["low"], name="neg"),
             mk("Abs", ["xd"], ["a"], name="abs"),
             mk("QuantizeLinear", ["a", "s", "z"], ["aq"], name="q_a"),
             mk("DequantizeLinear", ["aq", "s", "z"], ["good"], name="dq_a")]
    return model_from_proto(make_model(nodes, [tinfo("x", [4])], [tinfo("low", [4]), tinfo("good", [4])],
                                       initializers=[s, z], opset=13))


def test_only_quantizers_upstream_of_a_low_output_are_searched():
    m = _two_branch_qdq()
    g = m.graph
    quants = [_Quantizer(k, g.value(q).producer, g.value(d).producer, None)
              for k, q, d in (("x", "xq", "xd"), ("r", "rq", "rd"), ("a", "aq", "good"))]
    assert [z.key for z in reaching(m, quants, ["low"])] == ["x", "r"]
    assert [z.key for z in reaching(m, quants, ["good"])] == ["x", "a"]
    assert [z.key for z in reaching(m, quants, ["low", "good"])] == ["x", "r", "a"]
    assert reaching(m, quants, []) == []
