"""--optimize: float_regions' rules inside If/Loop/Scan bodies
(qcompiler/quant/placement/body_float_regions.py), and one encoding across each body boundary or float on both."""
from __future__ import annotations

import pytest

from qcompiler import model_to_proto
from qcompiler.quant.api import quantize
from tests.quant.body_models import MODELS
from tests.quant.test_body_quantizers import check_sqnr

STATES = {"loop_lstm_cell": (("h0", "h_in", "h_out"), ("c0", "c_in", "c_out")),
          "scan_rnn": (("h0", "h_prev", "h_next"), ("xs", "x_t"))}


@pytest.mark.parametrize("optimize", ["balanced", "latency"])
@pytest.mark.parametrize("name", sorted(STATES))
def test_boundary_groups_agree(name, optimize):
    """Every value crossing a Loop/Scan boundary (initial state, body state input and output; scan input and its
    slice) is quantized on one encoding on both sides, or float on both sides, whatever --optimize dropped."""
    proto, calib, evals = MODELS[name]()
    res = quantize(proto, calib, optimize=optimize)
    plan = res.plan
    for grp in STATES[name]:
        specs = [plan.values[v] for v in grp]
        assert len({s.keep_float for s in specs}) == 1, [(v, s.keep_float, s.reason) for v, s in zip(grp, specs)]
        if not specs[0].keep_float:
            assert all(s.encoding is specs[0].encoding for s in specs)
    check_sqnr(proto, model_to_proto(res.model), evals)


def test_latency_gives_the_initial_state_its_quantizer_back():
    """--optimize latency: the Loop's initial h0 has no integer-kernel reader in the main graph (the Loop
    node), but the body's QLinearMatMul reads the state on the int8 grid: h0 keeps its quantizer (the latency
    search leaves values entering a body alone); the 16-bit cell state, which no integer kernel reads on either
    side, is float on both."""
    proto, calib, _ = MODELS["loop_lstm_cell"]()
    plan = quantize(proto, calib, optimize="latency").plan
    assert not plan.values["h0"].keep_float
    assert all(plan.values[v].keep_float for v in ("c0", "c_in", "c_out"))


def test_accuracy_keeps_every_body_quantizer():
    proto, calib, _ = MODELS["if_lstm_gru"]()
    res = quantize(proto, calib, optimize="accuracy")
    assert all(b.activations > 0 for b in res.plan.bodies)
    assert not any("integer kernel" in r for r in res.report["left_float"].values())


def test_latency_drops_a_captured_quantizer_only_float_kernels_read():
    """If(LSTM | GRU) under latency: both bodies float, and the captured xs, read only by the float LSTM/GRU
    kernels, loses its Q/DQ too; if_two_convs keeps x's (the branch Convs are QLinearConv)."""
    proto, calib, evals = MODELS["if_lstm_gru"]()
    res = quantize(proto, calib, optimize="latency")
    assert res.plan.values["xs"].keep_float and "inside the bodies that capture it" in res.plan.values["xs"].reason
    q = model_to_proto(res.model)
    assert not [n for n in q.graph.node if n.op_type == "QuantizeLinear"]
    check_sqnr(proto, q, evals)
    proto, calib, _ = MODELS["if_two_convs"]()
    assert not quantize(proto, calib, optimize="latency").plan.values["x"].keep_float
