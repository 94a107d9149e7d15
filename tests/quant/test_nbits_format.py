"""MatMulNBits and GatherBlockQuantized storage of a BlockGrid, run in onnxruntime (CPU, default session options)
and compared with the numpy reference x @ grid.dequantize().T.

Tolerances: accuracy_level 0 computes in float32 from the dequantized weight, so the result matches the reference
to float32 accumulation error (SQNR >= 100 dB, i.e. relative error 1e-5). accuracy_level 4 quantizes the input A
to int8 per block on the fly, an error of its own of about 40 dB for Gaussian inputs: we ask 30 dB.
"""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.capi._pybind_state import quantize_matmul_4bits

from qcompiler.quant.core.block_grid import block_grid
from qcompiler.quant.core.nbits import (dequantize_reference, gather_block_quantized_node, matmul_nbits_node,
                                        pack_gather_block_quantized, pack_matmul_nbits, shared_embedding_head)
from qcompiler.sqnr import sqnr_db

MS = helper.make_opsetid("com.microsoft", 1)
EXACT_DB = 100.0          # accuracy_level 0: float32 rounding only
INT8_A_DB = 30.0          # accuracy_level 4: A quantized to int8 per block


def _model(nodes, inputs, outputs, inits):
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), MS])
    m.ir_version = 10
    return m


def _session(m, optimized=None):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    if optimized:
        so.optimized_model_filepath = str(optimized)
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _grid(rng, n, k, bits, bs, kind):
    w = rng.standard_normal((n, k)).astype(np.float32) * 0.05
    return block_grid(w, bits, bs, symmetric=kind == "sym", float_zero_points=kind == "float")


def _matmul_model(grid, k, accuracy_level):
    p = pack_matmul_nbits(grid)
    inits = [numpy_helper.from_array(p["B"], "B"), numpy_helper.from_array(p["scales"], "S")]
    if p["zero_points"] is not None:
        inits.append(numpy_helper.from_array(p["zero_points"], "Z"))
    node = matmul_nbits_node("A", "B", "S", "Y", p["attrs"], "Z" if p["zero_points"] is not None else None,
                             accuracy_level=accuracy_level)
    return _model([node], [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["b", "s", k])],
                  [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)], inits), p


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("bs", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("kind", ["sym", "asym", "float"])
def test_matmul_nbits_matches_reference(bits, bs, kind):
    rng = np.random.default_rng(bits * 1000 + bs)
    n = 24
    if bits == 8 and kind == "float":                      # onnxruntime's CPU kernel refuses it
        with pytest.raises(ValueError, match="8-bit weights with float zero points"):
            pack_matmul_nbits(_grid(rng, n, 64, bits, bs, kind))
        return
    for k in (2 * bs, 2 * bs + 24):                        # K a multiple of the block, and not
        grid = _grid(rng, n, k, bits, bs, kind)
        deq = grid.dequantize()
        x = rng.standard_normal((2, 3, k)).astype(np.float32)
        ref = x.astype(np.float64) @ deq.T.astype(np.float64)
        for level in (0, 4):
            m, p = _matmul_model(grid, k, level)
            np.testing.assert_array_equal(dequantize_reference(p["B"], p["scales"], p["zero_points"], k, bits, bs),
                                          deq)
            y = _session(m).run(None, {"A": x})[0]
            assert y.shape == (2, 3, n)
            db = sqnr_db(ref, y)
            assert db >= (EXACT_DB if level == 0 else INT8_A_DB), (k, level, db)


def test_matmul_nbits_packing_facts():
    """Zero points of a 4-bit row with an odd number of blocks: one byte per two blocks, low nibble first; float
    zero points stay unpacked [N, nb]; a symmetric grid has none (the implicit 2**(bits-1))."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 80)).astype(np.float32)
    g = block_grid(w, 4, 16, symmetric=False)
    p = pack_matmul_nbits(g)
    assert p["B"].shape == (3, 5, 8) and p["scales"].shape == (3, 5) and p["zero_points"].shape == (3, 3)
    assert (p["zero_points"][:, 0] & 15 == g.zero_points[:, 0]).all()
    assert (p["zero_points"][:, 0] >> 4 == g.zero_points[:, 1]).all()
    assert (p["B"][:, 0, 0] & 15 == g.q[:, 0]).all() and (p["B"][:, 0, 0] >> 4 == g.q[:, 1]).all()
    pf = pack_matmul_nbits(block_grid(w, 4, 16, symmetric=False, float_zero_points=True))
    assert pf["zero_points"].dtype == np.float32 and pf["zero_points"].shape == (3, 5)
    assert pack_matmul_nbits(block_grid(w, 4, 16))["zero_points"] is None
    assert pack_matmul_nbits(block_grid(w, 8, 16))["B"].shape == (3, 5, 16)


def test_optimized_graph_keeps_matmul_nbits(tmp_path):
    grid = _grid(np.random.default_rng(1), 64, 256, 4, 32, "sym")
    m, _ = _matmul_model(grid, 256, 4)
    _session(m, tmp_path / "opt.onnx").run(None, {"A": np.ones((1, 2, 256), np.float32)})
    assert "MatMulNBits" in [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node]


@pytest.mark.parametrize("heavy", [False, True])
def test_outputs_beat_onnxruntime_quantizer(heavy):
    """The same weight quantized by onnxruntime's RTN (quantize_matmul_4bits, the C++ kernel MatMulNBitsQuantizer
    calls; symmetric, 4 bits, block 32) and by block_grid(search="mse"), each run as MatMulNBits: our output is
    closer to the float one."""
    rng = np.random.default_rng(5)
    k, n, bs = 512, 256, 32
    w = (rng.standard_t(3, (n, k)) if heavy else rng.standard_normal((n, k))).astype(np.float32)
    if heavy:
        w[:, rng.choice(k, 4, replace=False)] *= 12
    x = rng.standard_normal((1, 64, k)).astype(np.float32)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    m, p = _matmul_model(block_grid(w, 4, bs), k, 0)
    ours_db = sqnr_db(ref, _session(m).run(None, {"A": x})[0])
    packed, scales = np.zeros_like(p["B"]), np.zeros_like(p["scales"])
    quantize_matmul_4bits(packed, np.ascontiguousarray(w.T), scales, np.zeros((n, 2), np.uint8), bs, n, k, True)
    m.graph.ClearField("initializer")
    m.graph.initializer.extend([numpy_helper.from_array(packed, "B"), numpy_helper.from_array(scales, "S")])
    ort_db = sqnr_db(ref, _session(m).run(None, {"A": x})[0])
    assert ours_db > ort_db, (ours_db, ort_db)      # 21.90 > 21.48 dB Gaussian, 16.98 > 16.80 heavy-tailed


def _gather_model(grid, index_type):
    p = pack_gather_block_quantized(grid)
    inits = [numpy_helper.from_array(p["data"], "D"), numpy_helper.from_array(p["scales"], "S")]
    if p["zero_points"] is not None:
        inits.append(numpy_helper.from_array(p["zero_points"], "Z"))
    node = gather_block_quantized_node("D", "I", "S", "E", p["attrs"], "Z" if p["zero_points"] is not None else None)
    return _model([node], [helper.make_tensor_value_info("I", index_type, ["b", "s"])],
                  [helper.make_tensor_value_info("E", TensorProto.FLOAT, None)], inits)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("bs", [16, 32, 128])
@pytest.mark.parametrize("kind", ["sym", "asym"])
def test_gather_block_quantized_matches_reference(bits, bs, kind):
    rng = np.random.default_rng(bits + bs)
    v = 50
    for h in (2 * bs, 2 * bs + 16):                        # H a multiple of the block, and not
        grid = _grid(rng, v, h, bits, bs, kind)
        deq = grid.dequantize()
        for itype, dtype in ((TensorProto.INT64, np.int64), (TensorProto.INT32, np.int32)):
            ids = np.array([[0, 7, 49], [3, 3, -1]], dtype)
            e = _session(_gather_model(grid, itype)).run(None, {"I": ids})[0]
            assert e.shape == (2, 3, h)
            np.testing.assert_array_equal(e, deq[ids])


def test_gather_refuses_float_zero_points():
    g = block_grid(np.ones((4, 32), np.float32), 4, 16, symmetric=False, float_zero_points=True)
    with pytest.raises(ValueError, match="integer zero points"):
        pack_gather_block_quantized(g)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("h,kind", [(128, "sym"), (128, "asym"), (144, "sym"), (144, "asym")])
def test_tied_embedding_and_head_share_one_table(tmp_path, bits, h, kind):
    """ids -> GatherBlockQuantized -> x -> MatMulNBits (logits = x @ E^T), both reading one packed initializer."""
    rng = np.random.default_rng(h + bits)
    v, bs = 96, 32
    grid = _grid(rng, v, h, bits, bs, kind)
    t = shared_embedding_head(grid, "ids", "x", "x", "logits")
    m = _model(t.nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "s"])],
               [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", v]),
                helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", h])], t.initializers)
    onnx.checker.check_model(m)
    big = [i for i in m.graph.initializer if i.data_type == TensorProto.UINT8 and np.prod(i.dims) >= v * 8]
    assert len(big) == 1                                   # the table is stored once
    ids = np.array([[1, 95, 40, 40], [0, 2, 3, 17]], np.int64)
    logits, x = _session(m, tmp_path / "opt.onnx").run(None, {"ids": ids})
    deq = grid.dequantize()
    np.testing.assert_array_equal(x, deq[ids])
    assert sqnr_db(deq[ids].astype(np.float64) @ deq.T.astype(np.float64), logits) >= EXACT_DB
    ops = [n.op_type for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node]
    assert "MatMulNBits" in ops and "GatherBlockQuantized" in ops
