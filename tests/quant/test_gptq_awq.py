"""GPTQ and AWQ numerics (passes/quantize/gptq.py, awq.py) on synthetic layers shaped like trained LLM layers:
inputs X = Z A (+ noise) with correlated features (Z of lower rank mixed by a random A) and a few outlier
channels 10-100x the rest, weights with heavy (Student-t) tails. Output SQNR is measured on held-out rows.

Measured (`llm_layer(0)`: K = N = 256, rank 64, 4 outliers; 4 bits symmetric; dB above round-to-nearest at the
same block, RTN 17.0 / 12.9 dB): block 32: GPTQ +5.9, GPTQ act_order +11.9, AWQ +11.8, AWQ+clip +12.9;
block 128: +6.4, +11.9, +11.9, +13.1. Seeds 1 and 2 alike (GPTQ +5.2..+8.5, act_order +12.8..+16.0).
The gains table and the timing of a 4096 x 4096 layer: `python benchmarks/bench_gptq_awq.py`.
"""
import numpy as np
import pytest

from qcompiler.passes.quantize.awq import (
    awq_clip_search,
    awq_quantize_shared,
    awq_scale,
    awq_search,
    awq_search_shared,
    gram_factor,
    sample_rows,
    scaled_error,
    scaled_errors,
)
from qcompiler.passes.quantize.gptq import accumulate_hessian, gptq_quantize
from qcompiler.passes.quantize.weight_blocks import dequantize, quantize_codes, rtn_grid, rtn_quantize
from qcompiler.passes.quantize.weight_grid import block_grid_fn
from qcompiler.sqnr import sqnr_db


def llm_layer(seed=0, n=2048, k=256, nout=256, rank=64, n_outliers=4):
    """(X calibration rows, X held-out rows, W): correlated features of rank `rank` plus noise, outlier channels."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((rank, k)) / np.sqrt(rank)
    x = rng.standard_t(5, (2 * n, rank)) @ a + 0.1 * rng.standard_normal((2 * n, k))
    x[:, rng.choice(k, n_outliers, replace=False)] *= rng.uniform(10, 100, n_outliers)
    w = rng.standard_t(3, (nout, k)) * 0.02
    return x[:n].astype(np.float32), x[n:].astype(np.float32), w.astype(np.float32)


def out_db(x, w, wq):
    return sqnr_db(x.astype(np.float64) @ w.T.astype(np.float64), x.astype(np.float64) @ wq.T.astype(np.float64))


def slow_gptq(w, h, bits, block, symmetric, act_order, damp=0.01, static_groups=False):
    """GPTQ spelled out: H^-1 by np.linalg.inv, its upper Cholesky factor, one column at a time with every update
    applied at once (no lazy batches), a block's grid from its current weights when its first column comes up."""
    n, k = w.shape
    h = h.copy()
    dead = np.diag(h) <= 0
    h[dead] = 0
    h[:, dead] = 0
    h[dead, dead] = 1
    perm = np.argsort(-np.diag(h), kind="stable") if act_order else np.arange(k)
    h = h[perm][:, perm] + damp * np.mean(np.diag(h)) * np.eye(k)
    u = np.linalg.cholesky(np.linalg.inv(h)).T
    wp = w[:, perm].astype(np.float64)
    nb = -(-k // block)
    grid = rtn_grid(bits, symmetric)
    scales, zps, have = np.zeros((n, nb)), np.zeros((n, nb)), np.zeros(nb, bool)
    if static_groups:
        for g in range(nb):
            scales[:, g], zps[:, g] = grid(w[:, g * block:(g + 1) * block])
        have[:] = True
    inv = np.argsort(perm)
    q = np.zeros((n, k))
    for j in range(k):
        g = perm[j] // block
        if not have[g]:
            scales[:, g], zps[:, g] = grid(wp[:, inv[g * block:(g + 1) * block]])
            have[g] = True
        q[:, j] = quantize_codes(wp[:, j], scales[:, g], zps[:, g], bits)
        e = (wp[:, j] - (q[:, j] - zps[:, g]) * scales[:, g]) / u[j, j]
        wp[:, j + 1:] -= np.outer(e, u[j, j + 1:])
    return q[:, inv].astype(np.uint8), scales.astype(np.float32), zps.astype(np.uint8)


def dequant64(q, scales, zps, block):
    k = q.shape[1]
    rep = np.repeat(np.arange(scales.shape[1]), block)[:k]
    return (q.astype(np.float64) - zps[:, rep]) * scales[:, rep].astype(np.float64)


def test_accumulate_hessian_streams_the_mean():
    x = np.random.default_rng(0).standard_normal((300, 3, 16))
    h, count = accumulate_hessian(None, x[:100], 0)
    h, count = accumulate_hessian(h, x[100:], count)
    h, count = accumulate_hessian(h, x[:0], count)
    flat = x.reshape(-1, 16)
    assert count == 900 and np.allclose(h, 2 * flat.T @ flat / 900)


@pytest.mark.parametrize("act_order,static_groups", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("block,symmetric", [(32, True), (48, False)])
def test_gptq_matches_the_slow_reference(act_order, static_groups, block, symmetric):
    """Lazy batches and rank-1 sub-batches give the codes of the one-column-at-a-time reference exactly (float64),
    K = 200 not a multiple of the block; the reported loss is tr(E H E^T) computed directly."""
    xc, _, w = llm_layer(1, n=1024, k=200, nout=40)
    xc[:, 5] = 0                                              # one dead input
    h, _ = accumulate_hessian(None, xc, 0)
    w = w.astype(np.float64)
    ref = slow_gptq(w, h, 4, block, symmetric, act_order, static_groups=static_groups)
    for lazy in (7, 128, 1000):
        q, scales, zps, stats = gptq_quantize(w, h, 4, block, symmetric, act_order=act_order, lazy_batch=lazy,
                                              static_groups=static_groups)
        assert q.dtype == np.uint8 and q.shape == w.shape and scales.shape == zps.shape == (40, -(-200 // block))
        assert np.array_equal(q, ref[0]) and np.array_equal(zps, ref[2]) and np.allclose(scales, ref[1])
        e = w - dequant64(q, scales, zps, block)
        assert stats["loss"] == pytest.approx(np.einsum("ij,jk,ik->", e, h, e), rel=1e-9)
        assert stats["dead_inputs"] == 1


def test_gptq_float32_agrees_with_float64():
    xc, _, w = llm_layer(2, n=1024, k=128, nout=64)
    h, _ = accumulate_hessian(None, xc, 0)
    q32, *_ = gptq_quantize(w, h, 4, 32)
    q64, *_ = gptq_quantize(w.astype(np.float64), h, 4, 32)
    assert np.mean(q32 == q64) > 0.99


@pytest.mark.parametrize("block", [32, 128])
def test_gptq_beats_rtn_and_act_order_helps(block):
    """4 bits symmetric: GPTQ >= 2 dB above RTN on held-out rows (measured +5.9 / +6.4 dB at block 32 / 128),
    act_order on top (measured +11.9 dB above RTN); static groups within 1 dB of the dynamic ones (-1.0 / +0.1)."""
    xc, xe, w = llm_layer(0)
    h, _ = accumulate_hessian(None, xc, 0)
    rtn = out_db(xe, w, dequantize(*rtn_quantize(w, 4, block, True), block))
    plain = out_db(xe, w, dequantize(*gptq_quantize(w, h, 4, block, act_order=False)[:3], block))
    ordered = out_db(xe, w, dequantize(*gptq_quantize(w, h, 4, block, act_order=True)[:3], block))
    static = out_db(xe, w, dequantize(*gptq_quantize(w, h, 4, block, static_groups=True)[:3], block))
    assert plain >= rtn + 2.0
    assert ordered >= plain - 0.1
    assert abs(static - ordered) < 1.5


def test_gptq_robust_to_an_indefinite_hessian_and_odd_shapes():
    """H with a negative eigenvalue: the damping grows until the factorisation holds; all-zero H: every input
    dead, the result is plain rounding; K smaller than the block: one block."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 20)).astype(np.float32)
    v = rng.standard_normal((20, 20))
    h = v @ v.T
    h -= (np.linalg.eigvalsh(h)[0] + 1.0) * np.eye(20)            # least eigenvalue -1, diagonal still positive
    q, scales, zps, stats = gptq_quantize(w, h, 3, 8, symmetric=False)
    assert stats["damp_retries"] > 0 and np.isfinite(stats["loss"]) and q.max() <= 7
    q, scales, zps, stats = gptq_quantize(w, np.zeros((20, 20)), 4, 64)
    rq, rs, rz = rtn_quantize(w, 4, 64, True)
    assert stats["dead_inputs"] == 20 and np.array_equal(q, rq) and scales.shape == (8, 1)
    with pytest.raises(ValueError):
        gptq_quantize(w, np.full((20, 20), np.nan), 4, 8)


def test_awq_folding_keeps_the_float_output():
    xc, xe, w = llm_layer(4)
    s, _ = awq_search(w, xc, 4, 32, True)
    assert s.shape == (256,) and np.all(s > 0)
    ref = xe.astype(np.float64) @ w.T.astype(np.float64)
    folded = (xe.astype(np.float64) / s) @ (w.astype(np.float64) * s).T
    assert np.allclose(folded, ref, rtol=1e-9, atol=1e-9 * np.abs(ref).max())
    assert np.allclose(awq_scale(np.abs(xc).mean(0), 0.0), 1.0)


@pytest.mark.parametrize("block", [32, 128])
def test_awq_beats_rtn_on_outlier_channels(block):
    """AWQ >= 2 dB above RTN on held-out rows (measured +11.8 / +11.9 dB at block 32 / 128), the clip search on
    top does not hurt (measured +1.1 / +1.2 dB more)."""
    xc, xe, w = llm_layer(0)
    rtn = out_db(xe, w, dequantize(*rtn_quantize(w, 4, block, True), block))
    s, [(q, sc, zp)], info = awq_quantize_shared([w], xc, 4, block, True, clip=False)
    awq = out_db(xe / s, w * s, dequantize(q, sc, zp, block))
    s2, [(q, sc, zp)], info2 = awq_quantize_shared([w], xc, 4, block, True, clip=True)
    clipped = out_db(xe / s2, w * s2, dequantize(q, sc, zp, block))
    assert 0 < info["alpha"] < 1 and info["loss"] <= info["loss_rtn"]
    assert awq >= rtn + 2.0
    assert clipped >= awq - 0.1
    assert info2["clip"][0]["block_loss"] <= info2["clip"][0]["block_loss_noclip"]


def test_awq_shared_scale_sums_the_layers():
    xc, _, w = llm_layer(5, k=64, nout=48)
    w2 = np.random.default_rng(6).standard_t(3, (32, 64)).astype(np.float32) * 0.05
    s, info = awq_search_shared([w, w2], xc, 4, 16, False, n_grid=5)
    f = gram_factor(sample_rows(xc, 1024))
    a = info["alphas"][2]
    s_a = awq_scale(np.abs(xc).mean(0, dtype=np.float64), a)
    both = scaled_error(f, w, s_a, 4, 16, False) + scaled_error(f, w2, s_a, 4, 16, False)
    assert info["losses"][2] == pytest.approx(both, rel=1e-6)
    assert info["loss"] == min(info["losses"])
    with pytest.raises(ValueError):
        awq_search_shared([w, w2[:, :10]], xc, 4, 16, False)


def test_awq_clip_layout_and_partial_block():
    """K = 100 with block 32: scales/zero points [N, 4], codes in range, dequantized clip never worse per block
    than no clip on the sample, asymmetric grids with integer zero points."""
    xc, _, w = llm_layer(7, n=512, k=100, nout=24)
    q, scales, zps, info = awq_clip_search(w, xc, 4, 32, symmetric=False)
    assert q.shape == w.shape and scales.shape == zps.shape == (24, 4) and zps.dtype == np.uint8
    assert q.max() <= 15 and zps.max() <= 15 and 0 <= info["clipped"] <= 1
    assert info["block_loss"] <= info["block_loss_noclip"]
    rq = rtn_quantize(w, 4, 32, False)
    x64 = xc.astype(np.float64)
    base = np.sum((x64 @ (w - dequantize(*rq, 32)).T) ** 2)
    assert np.sum((x64 @ (w - dequantize(q, scales, zps, 32)).T) ** 2) <= base * 1.05


@pytest.mark.parametrize("symmetric", [True, False])
def test_awq_scores_all_candidates_at_once_as_one_by_one(symmetric):
    """rtn_quantize hands the grid function all whole blocks at once (one block a row) and the partial last
    block alone: the same grid as block by block. The scale search grids all its candidates in one call: the
    same errors, bit for bit, as scoring each candidate alone."""
    xc, _, w = llm_layer(8, n=600, k=100, nout=40)
    fn = block_grid_fn(4, symmetric)
    q, scales, zps = rtn_quantize(w, 4, 32, symmetric, fn)
    for g in range(4):
        s_g, z_g = fn(w[:, g * 32:(g + 1) * 32])
        assert np.array_equal(scales[:, g], s_g) and np.array_equal(zps[:, g], z_g)
    assert np.array_equal(q, quantize_codes(w, np.repeat(scales, 32, 1)[:, :100],
                                            np.repeat(zps.astype(np.float32), 32, 1)[:, :100], 4))
    f = gram_factor(sample_rows(xc, 1024))
    cands = [awq_scale(np.abs(xc).mean(0, dtype=np.float64), a) for a in (0.0, 0.3, 0.6)]
    together = scaled_errors(f, w, cands, 4, 32, symmetric, fn)
    assert together == [scaled_error(f, w, s, 4, 32, symmetric, fn) for s in cands]
    assert together[0] > 0 and len(set(together)) == 3
