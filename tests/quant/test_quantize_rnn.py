"""quantize() on LSTM/GRU models (field notes §1): W and R per gate-stacked output channel (axis 1 of
[num_directions, gates*hidden, in]), X / initial_h / Y / Y_h at the op boundary on 8 bits, the LSTM cell state
(initial_c in, Y_c out) on int16, B float. Exported models run in onnxruntime with output SQNR >= 25 dB against
float on fresh random inputs."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from qcompiler import model_to_proto
from qcompiler.quant.api import quantize
from tests.helpers import make_model, run, sqnr_db, tinfo

SQNR_FLOOR_DB = 25.0
S, B, I, H = 6, 1, 5, 8


def _init(name, arr):
    return numpy_helper.from_array(np.asarray(arr, np.float32), name)


def _feeds(n, dirs, seed):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (S, B, I)).astype(np.float32),
             "h0": rng.normal(0, 0.5, (dirs, B, H)).astype(np.float32),
             "c0": rng.normal(0, 1.0, (dirs, B, H)).astype(np.float32)} for _ in range(n)]


def _lstm_model(direction: str):
    dirs = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(3)
    w, r = rng.normal(0, 0.4, (dirs, 4 * H, I)), rng.normal(0, 0.3, (dirs, 4 * H, H))
    b = rng.normal(0, 0.1, (dirs, 8 * H))
    nodes = [helper.make_node("LSTM", ["x", "w", "r", "b", "", "h0", "c0"], ["y", "yh", "yc"], hidden_size=H,
                              direction=direction, name="lstm")]
    proto = make_model(nodes, [tinfo("x", [S, B, I]), tinfo("h0", [dirs, B, H]), tinfo("c0", [dirs, B, H])],
                       [tinfo("y", [S, dirs, B, H]), tinfo("yh", [dirs, B, H]), tinfo("yc", [dirs, B, H])],
                       [_init("w", w), _init("r", r), _init("b", b)])
    return proto, dirs


def _check(proto, res, feeds):
    q = model_to_proto(res.model)
    onnx.checker.check_model(q)
    assert [o.name for o in q.graph.output] == [o.name for o in proto.graph.output]
    for feed in feeds:
        for name, r, g in zip([o.name for o in proto.graph.output], run(proto, feed), run(q, feed)):
            assert sqnr_db(r, g) >= SQNR_FLOOR_DB, f"{name}: SQNR {sqnr_db(r, g):.1f} dB < {SQNR_FLOOR_DB}"
    return q


def _q_bits(q):
    """value name -> bits of its Q/DQ (8 or 16): the input a QuantizeLinear reads, the output a DequantizeLinear
    writes (a quantized graph output keeps its name on the DQ)."""
    inits = {i.name: i for i in q.graph.initializer}
    out = {}
    for n in q.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.input[2] in inits:
            zp = inits[n.input[2]]
            bits = 16 if zp.data_type in (onnx.TensorProto.INT16, onnx.TensorProto.UINT16) else 8
            out[n.input[0] if n.op_type == "QuantizeLinear" else n.output[0]] = bits
    return out


def test_lstm_forward_and_bidirectional_states():
    for direction in ("forward", "bidirectional"):
        proto, dirs = _lstm_model(direction)
        res = quantize(proto, _feeds(32, dirs, 1), optimize="accuracy")   # every quantizer, 16-bit cell state
        q = _check(proto, res, _feeds(3, dirs, 2))
        bits = _q_bits(q)
        assert bits["x"] == 8 and bits["h0"] == 8                 # op boundary, 8 bits
        assert bits["c0"] == 16 and bits["yc"] == 16              # cell state, 16 bits by default
        assert bits["yh"] == 8 and bits["y"] == 8
        acts = res.encodings["activations"]
        assert acts["yc"].bits == 16 and acts["c0"].bits == 16 and acts["yh"].bits == 8 and acts["y"].bits == 8
        params = res.encodings["params"]
        for wname in ("w", "r"):
            enc = params[wname]
            assert enc.axis == 1 and np.shape(enc.scale) == (4 * H,), wname   # per gate-stacked channel
        assert "b" not in params                                  # B stays float
        assert "cell state" in res.report["widened"]["yc"]
        assert q.opset_import[0].version >= 21                    # int16 Q/DQ
        # the default on ort_cpu: no integer LSTM kernel reads the 16-bit cell state, so it stays float
        bal = quantize(proto, _feeds(32, dirs, 1))
        _check(proto, bal, _feeds(3, dirs, 2))
        assert "c0" not in bal.encodings["activations"] and "16-bit Q/DQ pair" in bal.report["left_float"]["yc"]


def test_gru_after_lstm():
    rng = np.random.default_rng(5)
    wl, rl, bl = rng.normal(0, 0.4, (1, 4 * H, I)), rng.normal(0, 0.3, (1, 4 * H, H)), rng.normal(0, .1, (1, 8 * H))
    wg, rg, bg = rng.normal(0, 0.4, (2, 3 * H, H)), rng.normal(0, 0.3, (2, 3 * H, H)), rng.normal(0, .1, (2, 6 * H))
    nodes = [helper.make_node("LSTM", ["x", "wl", "rl", "bl", "", "h0", "c0"], ["yl", "hl", "cl"], hidden_size=H),
             helper.make_node("Squeeze", ["yl", "ax1"], ["yl2"]),
             helper.make_node("GRU", ["yl2", "wg", "rg", "bg"], ["yg", "hg"], hidden_size=H,
                              direction="bidirectional", linear_before_reset=1)]
    inits = [_init(n, a) for n, a in (("wl", wl), ("rl", rl), ("bl", bl), ("wg", wg), ("rg", rg), ("bg", bg))]
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "ax1"))
    proto = make_model(nodes, [tinfo("x", [S, B, I]), tinfo("h0", [1, B, H]), tinfo("c0", [1, B, H])],
                       [tinfo("yg", [S, 2, B, H]), tinfo("hg", [2, B, H]), tinfo("cl", [1, B, H])], inits)
    res = quantize(proto, _feeds(32, 1, 3), optimize="accuracy")
    _check(proto, res, _feeds(3, 1, 4))
    params = res.encodings["params"]
    assert params["wg"].axis == 1 and np.shape(params["wg"].scale) == (3 * H,)
    assert params["rg"].axis == 1 and np.shape(params["rg"].scale) == (3 * H,)
    acts = res.encodings["activations"]
    assert acts["cl"].bits == 16 and acts["yg"].bits == 8 and acts["hg"].bits == 8
