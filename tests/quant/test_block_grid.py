"""block_grid: search="minmax" is onnxruntime's MatMulNBits RTN bit for bit; search="mse" is never worse on any
block and gains the SQNR the module docstring states (measured here against onnxruntime's own quantizer)."""
import time

import numpy as np
import pytest
from onnxruntime.capi._pybind_state import quantize_matmul_2bits, quantize_matmul_4bits, quantize_matmul_8bits

from qcompiler.quant.core.block_grid import block_grid
from qcompiler.quant.core.nbits import unpack_codes
from qcompiler.sqnr import sqnr_db

ORT_QUANTIZE = {2: quantize_matmul_2bits, 4: quantize_matmul_4bits, 8: quantize_matmul_8bits}

# SQNR in dB (onnxruntime RTN, ours) on the weights of _weights(): the module docstring's table.
FIGURES = {
    ("gauss", 4, 32, "sym"): (21.31, 21.83), ("gauss", 4, 128, "sym"): (19.72, 20.30),
    ("gauss", 8, 32, "sym"): (45.49, 46.33), ("gauss", 8, 128, "sym"): (43.83, 44.19),
    ("heavy", 4, 32, "sym"): (17.77, 17.96), ("heavy", 4, 128, "sym"): (13.12, 13.47),
    ("heavy", 8, 32, "sym"): (39.57, 39.82), ("heavy", 8, 128, "sym"): (34.39, 34.46),
    ("gauss", 4, 32, "asym"): (21.86, 22.25), ("gauss", 4, 32, "float"): (21.86, 23.10),
    ("heavy", 4, 32, "asym"): (20.08, 20.32), ("heavy", 4, 32, "float"): (20.08, 21.03),
    ("gauss", 8, 32, "asym"): (46.47, 47.28),
}


def ort_rtn(w, bits, bs, symmetric):
    """onnxruntime's RTN of w [N, K] as MatMulNBitsQuantizer does it (K padded with zeros to whole blocks, the C++
    quantizer on the transposed [K, N] weight): (codes [N, K], scales [N, nb], zero points [N, nb], dequantized)."""
    n, k = w.shape
    nb = -(-k // bs)
    wt = np.ascontiguousarray(np.pad(w, ((0, 0), (0, nb * bs - k))).T)
    packed = np.zeros((n, nb, bs * bits // 8), np.uint8)
    scales = np.zeros((n, nb), np.float32)
    zp = np.zeros((n, (nb * bits + 7) // 8), np.uint8)
    ORT_QUANTIZE[bits](packed, wt, scales, zp, bs, n, nb * bs, symmetric)
    q = unpack_codes(packed, bits, bs).reshape(n, nb * bs)
    z = np.full((n, nb), 1 << (bits - 1), np.uint8) if symmetric else unpack_codes(zp, bits, nb)
    deq = ((q.reshape(n, nb, bs).astype(np.float32) - z[..., None]) * scales[..., None]).reshape(n, -1)[:, :k]
    return q[:, :k], scales, z, deq


def _weights(name):
    rng = np.random.default_rng(0)
    if name == "gauss":
        return rng.standard_normal((1024, 1024)).astype(np.float32)
    w = rng.standard_t(3, (1024, 1024)).astype(np.float32)       # heavy tails, and a few outlier columns
    w[:, rng.choice(1024, 8, replace=False)] *= 12
    return w


def _block_err(w, deq, bs):
    n, k = w.shape
    d = np.zeros((n, -(-k // bs) * bs))
    d[:, :k] = (deq.astype(np.float64) - w) ** 2
    return d.reshape(n, -1, bs).sum(-1)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("k", [256, 200])
def test_minmax_is_onnxruntime_bit_for_bit(bits, symmetric, k):
    w = np.random.default_rng(bits).standard_normal((48, k)).astype(np.float32)
    w[3, :32] = 0                                                   # an all-zero block
    w[5, 32:64] = 0.25                                              # a constant one
    q, s, z, deq = ort_rtn(w, bits, 32, symmetric)
    g = block_grid(w, bits, 32, symmetric, search="minmax")
    np.testing.assert_array_equal(g.q, q)
    np.testing.assert_array_equal(g.scales, s)
    np.testing.assert_array_equal(g.zero_points, z)
    np.testing.assert_array_equal(g.dequantize(), deq)


@pytest.mark.parametrize("name", ["gauss", "heavy"])
def test_mse_beats_onnxruntime_rtn(name):
    """Per block never worse than onnxruntime's RTN; the SQNR figures of the module docstring."""
    w = _weights(name)
    for (wname, bits, bs, kind), (ort_db, our_db) in FIGURES.items():
        if wname != name:
            continue
        deq_ort = ort_rtn(w, bits, bs, kind == "sym")[3]
        g = block_grid(w, bits, bs, symmetric=kind == "sym", float_zero_points=kind == "float")
        deq = g.dequantize()
        e_ort, e = _block_err(w, deq_ort, bs), _block_err(w, deq, bs)
        assert (e <= e_ort * (1 + 1e-6) + 1e-12).all(), (bits, bs, kind)
        got_ort, got = sqnr_db(w, deq_ort), sqnr_db(w, deq)
        assert got > got_ort, (bits, bs, kind, got, got_ort)
        assert abs(got_ort - ort_db) < 0.05 and abs(got - our_db) < 0.05, (bits, bs, kind, got_ort, got)


@pytest.mark.parametrize("symmetric,fz", [(True, False), (False, False), (False, True)])
@pytest.mark.parametrize("k", [96, 100, 7])
def test_partial_blocks_and_edges(symmetric, fz, k):
    rng = np.random.default_rng(k)
    w = rng.standard_normal((20, k)).astype(np.float32)
    w[0] = 0
    w[1] = -3.0
    w[2, :5] = 1e-30
    for bits in (3, 4, 8):
        g = block_grid(w, bits, 32, symmetric, float_zero_points=fz)
        assert g.q.shape == (20, k) and g.scales.shape == (20, -(-k // 32)) and g.q.max() < 2 ** bits
        assert g.zero_points.dtype == (np.float32 if fz else np.uint8)
        deq = g.dequantize()
        assert deq.dtype == np.float32 and np.isfinite(deq).all()
        assert (deq[0] == 0).all()
        e_ref = _block_err(w, block_grid(w, bits, 32, symmetric, "minmax", fz).dequantize(), 32)
        assert (_block_err(w, deq, 32) <= e_ref * (1 + 1e-6) + 1e-12).all()
        if not symmetric:
            np.testing.assert_allclose(deq[1], -3.0, rtol=1e-6)    # a constant row is exact on an offset grid


def test_refuses_bad_arguments():
    w = np.ones((4, 32), np.float32)
    for kw, msg in (({"bits": 5}, "bits"), ({"block_size": 0}, "block_size"), ({"search": "x"}, "search"),
                    ({"float_zero_points": True}, "asymmetric")):
        args = {"bits": 4, "block_size": 16, **kw}
        with pytest.raises(ValueError, match=msg):
            block_grid(w, **args)
    with pytest.raises(ValueError, match="non-finite"):
        block_grid(np.full((2, 16), np.nan, np.float32), 4, 16)
    with pytest.raises(ValueError, match="2-D"):
        block_grid(np.ones(16, np.float32), 4, 16)


def test_speed_4096_square():
    """[4096, 4096] at block 32, 4 bits, symmetric: about 1 s with two threads on an idle two-core machine; the
    bound leaves room for a loaded one."""
    w = np.random.default_rng(0).standard_normal((4096, 4096)).astype(np.float32)
    t = time.perf_counter()
    g = block_grid(w, 4, 32)
    assert time.perf_counter() - t < 8.0
    assert g.q.shape == (4096, 4096)
