"""seq-mse's vectorised search ("a 4096x4096 MatMul in seconds"): the in-place [K, C, m]
candidate errors are element for element what fake_quant_kn gives (per channel, whole blocks, a partial last
block, non-zero zero points), the losses match a direct computation, and the BLAS thread limit changes no choice.
The timing itself: `python benchmarks/bench_seq_mse.py --search-only 4096`."""
from types import SimpleNamespace

import numpy as np
import pytest

from qcompiler.passes.quantize import seq_mse
from qcompiler.quant.core.encoding import compute_encoding
from qcompiler.quant.calibration.layer_inputs import Layer, fake_quant_kn
from qcompiler.quant.core.qdq import block_encoding

F = np.float32


def _reference_fake_quant(w, scale, zp, qmin, qmax, block):
    """The per-row scale spelled out with np.repeat (what fake_quant_kn did before it broadcast)."""
    k = w.shape[0]
    if scale.shape[-2] > 1:
        scale = np.repeat(scale, block, axis=-2)[..., :k, :]
        zp = np.repeat(zp, block, axis=-2)[..., :k, :]
    s, z = scale.astype(F), zp.astype(F)
    return ((np.clip(np.rint(w / s) + z, qmin, qmax) - z) * s).astype(F)


@pytest.mark.parametrize("k,block,zero", [(64, None, True), (64, 32, True), (70, 32, True), (64, 16, False),
                                          (70, 32, False)])
def test_candidate_errors_match_fake_quant(k, block, zero):
    rng = np.random.default_rng(k + (block or 0))
    n, c = 9, 5
    w = rng.normal(size=(k, n)).astype(F)
    nb = 1 if block is None else -(-k // block)
    scale = (np.abs(rng.normal(size=(c, nb, n))) * 0.3 + 0.01).astype(F)
    zp = np.zeros((c, nb, n), np.int64) if zero else rng.integers(-3, 4, size=(c, nb, n))
    ref = _reference_fake_quant(w, scale, zp, -8, 7, block)                  # [C, K, n]
    assert np.array_equal(fake_quant_kn(w, scale, zp, -8, 7, block), ref)
    e = seq_mse.candidate_errors(w, scale, zp, -8, 7, block)                 # [Kp, C, n]
    assert np.array_equal(e[:k].transpose(1, 0, 2), ref - w)
    assert not e[k:].any()                                                    # padded rows are zero
    f = rng.normal(size=(7, k)).astype(F)
    want = np.einsum("crn,crn->cn", *(2 * [np.matmul(f.astype(np.float64), (ref - w).astype(np.float64))]))
    got = seq_mse.channel_losses(f, w, scale, zp, -8, 7, block)
    np.testing.assert_allclose(got, want, rtol=1e-4)
    if block is not None:
        x = rng.normal(size=(20, k)).astype(F)
        xp = np.pad(x, ((0, 0), (0, nb * block - k)))
        e64 = np.pad(ref - w, ((0, 0), (0, nb * block - k), (0, 0))).astype(np.float64)
        want_b = np.stack([np.einsum("crn,crn->cn", *(2 * [xp[:, b * block:(b + 1) * block].astype(np.float64)
                                                             @ e64[:, b * block:(b + 1) * block]]))
                           for b in range(nb)], 1)
        np.testing.assert_allclose(seq_mse.block_losses(x, w, scale, zp, -8, 7, block), want_b, rtol=1e-4)


@pytest.mark.parametrize("mode", ["channel", "block"])
def test_blas_thread_limit_changes_no_choice(mode, monkeypatch):
    rng = np.random.default_rng(3)
    k, n = 96, 40
    x = (rng.normal(size=(200, k)) * rng.uniform(0.1, 3, k)).astype(F)
    w = (rng.normal(size=(k, n)) / np.sqrt(k)).astype(F)
    node = SimpleNamespace(name="mm", inputs=[None, SimpleNamespace(name="w", const_value=lambda: w)])
    enc = compute_encoding(w.min(0), w.max(0), bits=4, symmetric=True, signed=True, axis=1) \
        if mode == "channel" else block_encoding(w, 0, 32, 4, True)
    scales = []
    for limit in (None, 1):
        monkeypatch.setattr(seq_mse, "BLAS_THREADS", limit)
        scales.append(np.asarray(seq_mse.choose(Layer(node, SimpleNamespace(encoding=enc)), x).encoding.scale))
    assert np.array_equal(scales[0], scales[1])
