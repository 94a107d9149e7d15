"""The switchable copy (qcompiler/quant/runtime/switchable.py), run in onnxruntime: each switch on gives the QDQ
model's value, off the float one, wide the 16-bit grid; the IR copy shares the model's weights; sites inside a
body, on an initializer and on one reader's slot; the copy written with external data runs the same."""
import os

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from qcompiler import ort_session
from qcompiler.onnx_io import model_from_proto
from qcompiler.ort_session import create_session
from qcompiler.quant.runtime import switch_pool
from qcompiler.quant.runtime.executor import SerialExecutor
from qcompiler.quant.runtime.switch_pool import SwitchPool
from qcompiler.quant.runtime.switchable import Site, Wide, add_switches, switchable_model
from qcompiler.sqnr import sqnr_db

RNG = np.random.default_rng(0)
W = (RNG.standard_normal((128, 64)) * 0.2).astype(np.float32)   # int8: over STUB_BYTES, so shared
S_X, S_H = np.float32(0.03), np.float32(0.05)


def _qdq_model():
    """x -> Q/DQ -> MatMul(w on an int8 grid) -> Relu -> Q/DQ -> y, and its float twin."""
    sw = np.float32(np.abs(W).max() / 127)
    wq = np.clip(np.round(W / sw), -127, 127).astype(np.int8)
    z8 = nh.from_array(np.int8(0), "z8")
    inits = [nh.from_array(wq, "w_quantized"), nh.from_array(sw, "sw"), nh.from_array(S_X, "sx"),
             nh.from_array(S_H, "sh"), z8]
    mk = h.make_node
    nodes = [mk("QuantizeLinear", ["x", "sx", "z8"], ["xq"], name="qx"),
             mk("DequantizeLinear", ["xq", "sx", "z8"], ["xd"], name="dqx"),
             mk("DequantizeLinear", ["w_quantized", "sw", "z8"], ["w"], name="dqw"),
             mk("MatMul", ["xd", "w"], ["m"], name="mm"),
             mk("Relu", ["m"], ["r"], name="relu"),
             mk("QuantizeLinear", ["r", "sh", "z8"], ["rq"], name="qr"),
             mk("DequantizeLinear", ["rq", "sh", "z8"], ["y"], name="dqr")]
    io = ([h.make_tensor_value_info("x", T.FLOAT, [4, 128])], [h.make_tensor_value_info("y", T.FLOAT, [4, 64])])
    q = h.make_model(h.make_graph(nodes, "qdq", *io, inits), opset_imports=[h.make_opsetid("", 21)])
    f = h.make_model(h.make_graph([mk("MatMul", ["x", "wf"], ["m"]), mk("Relu", ["m"], ["y"])], "float", *io,
                                  [nh.from_array(W, "wf")]), opset_imports=[h.make_opsetid("", 21)])
    q.ir_version = f.ir_version = 10   # opset 21: 16-bit Q/DQ
    return q, f


def _run(model, feed):
    sess = create_session(model) if not isinstance(model, onnx.ModelProto) else \
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(["y"], feed)[0]


def _sites():
    wide = Wide("x", np.float32(S_X / 256), np.int16(0))
    return [Site(0, "xd", "x", wide=wide), Site(1, "w", W), Site(2, "y", "r")]


def test_each_switch_picks_quantized_float_or_16_bits_and_the_copy_shares_the_weights():
    qp, fp = _qdq_model()
    model = model_from_proto(qp)
    copy, sw = switchable_model(model, _sites(), 3, wide=True)
    assert copy.graph.initializers["w_quantized"].tensor is model.graph.initializers["w_quantized"].tensor
    assert sw.on not in {v.name for v in model.graph.inputs} and len(model.graph) == 7   # the model is unchanged
    x = np.clip(RNG.standard_normal((4, 128)), -3.5, 3.5).astype(np.float32)   # inside the 8-bit range
    sess = create_session(copy)

    def y(on, wide=(False,) * 3):
        return sess.run(["y"], {"x": x, **sw.feed(np.array(on), np.array(wide))})[0]

    qdq, flt = _run(qp, {"x": x}), _run(fp, {"x": x})
    assert np.array_equal(y([True] * 3), qdq)                              # all on: the QDQ model, bit for bit
    np.testing.assert_allclose(y([False] * 3), flt, rtol=1e-5, atol=1e-5)  # all off: the float model
    # x at 16 bits (its switch on): nearer float than at 8 bits; with the switch off, wide does not count
    only_x = [True, False, False]
    assert sqnr_db(flt, y(only_x, (True, False, False))) > sqnr_db(flt, y(only_x)) + 20
    np.testing.assert_allclose(y([False] * 3, (True, False, False)), flt, rtol=1e-5, atol=1e-5)


def test_the_copy_written_with_external_data_runs_like_the_session_here(monkeypatch, tmp_path):
    """What a model over one protobuf's worth takes (ONE_PROTO_MAX_BYTES shrunk to 0: every tensor external),
    in this process's session and in a pool worker's."""
    monkeypatch.setattr(ort_session, "ONE_PROTO_MAX_BYTES", 0)
    monkeypatch.setattr(switch_pool, "ONE_PROTO_MAX_BYTES", 0)
    qp, _ = _qdq_model()
    copy, sw = switchable_model(model_from_proto(qp), _sites(), 3, wide=True)
    x = RNG.standard_normal((4, 128)).astype(np.float32)
    settings = [sw.feed(np.array(on), np.array([True, False, False])) for on in
                ([True] * 3, [False, True, True], [True, False, True])]
    here = [create_session(copy).run(["y"], {"x": x, **s})[0] for s in settings]
    pool = SwitchPool(SerialExecutor(), copy)
    try:
        assert os.path.getsize(pool.model_path + ".data") >= W.size   # the weights went to the data file
        got = pool.run([{"x": x}], settings)
    finally:
        pool.close()
    assert all(np.array_equal(a, b[0][0]) for a, b in zip(here, got))


def test_sites_in_a_body_on_an_initializer_and_on_one_readers_slot():
    """An If body's weight DQ (the switch read from the outer scope), a weight stored in float on its grid (its
    readers read the switch) and one reader's slot of a value two nodes read."""
    wg = np.round(W[:64, :16] / 0.01).astype(np.float32) * np.float32(0.01)       # "prefolded" on its grid
    wb = (RNG.standard_normal((64,)) * 0.5).astype(np.float32)
    sb = np.float32(np.abs(wb).max() / 127)
    then_g = h.make_graph([h.make_node("DequantizeLinear", ["wbq", "sb", "zb"], ["wbd"], name="dqb"),
                           h.make_node("Mul", ["x", "wbd"], ["t"], name="mulb")], "then", [],
                          [h.make_tensor_value_info("t", T.FLOAT, None)],
                          [nh.from_array(np.round(wb / sb).astype(np.int8), "wbq"), nh.from_array(sb, "sb"),
                           nh.from_array(np.int8(0), "zb")])
    else_g = h.make_graph([h.make_node("Identity", ["x"], ["e"])], "else", [],
                          [h.make_tensor_value_info("e", T.FLOAT, None)])
    mk = h.make_node
    nodes = [mk("If", ["c"], ["b"], name="branch", then_branch=then_g, else_branch=else_g),
             mk("Round", ["b"], ["br"], name="round"),
             mk("MatMul", ["br", "wg"], ["m1"], name="mm1"),
             mk("MatMul", ["br", "wg"], ["m2"], name="mm2"),
             mk("Add", ["m1", "m2"], ["y"], name="add")]
    g = h.make_graph(nodes, "sites", [h.make_tensor_value_info("x", T.FLOAT, [4, 64]),
                                      h.make_tensor_value_info("c", T.BOOL, [])],
                     [h.make_tensor_value_info("y", T.FLOAT, [4, 16])], [nh.from_array(wg, "wg")])
    mp = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    mp.ir_version = 8
    wf = W[:64, :16].copy()
    sites = [Site(0, "wbd", wb, path=((0, "then_branch", 0),)), Site(1, "wg", wf),
             Site(2, "br", "b", reader=("mm2", 0))]
    sw_model = onnx.ModelProto()
    sw_model.CopyFrom(mp)
    sw = add_switches(sw_model, sites, 3, body_at=lambda gr, p: next(a.g for a in gr.node[p[0][0]].attribute
                                                                      if a.name == p[0][1]))
    onnx.checker.check_model(sw_model)
    sess = ort.InferenceSession(sw_model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    feed = {"x": x, "c": np.array(True)}

    def y(*on):
        return sess.run(["y"], {**feed, **sw.feed(np.array(on))})[0]

    ref = _run(mp, feed)
    assert np.array_equal(y(True, True, True), ref)
    b_float = x * wb                                            # the body's weight float
    b_q = x * (np.round(wb / sb) * sb)
    np.testing.assert_allclose(y(False, True, True), 2 * np.round(b_float) @ wg, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(y(True, False, True), 2 * np.round(b_q) @ wf, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(y(True, True, False), np.round(b_q) @ wg + b_q @ wg, rtol=1e-5, atol=1e-4)
