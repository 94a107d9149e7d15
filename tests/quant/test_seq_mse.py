"""seq-mse: per-channel / per-block weight ranges that minimise each MatMul/Gemm layer's
output error, layer by layer. Never worse than the assigned (min_max) grid on a layer's output MSE, checked with
the project's own fake-quant (encoding.quantize_dequantize, what onnxruntime computes); int4 per channel, per
block and per tensor; the exported model runs in onnxruntime; `--recipe seq-mse` runs between assign-encodings
and insert-qdq, and composes with smoothquant and bias-correction."""
import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from qcompiler.quant import quantize
from qcompiler.quant.core.encoding import compute_encoding, quantize_dequantize
from qcompiler.quant.calibration.layer_inputs import Layer, fake_quant_kn, kn_qparams
from qcompiler.quant.core.qdq import block_encoding
from qcompiler.passes.quantize.seq_mse import choose
from tests.helpers import make_model, run, sqnr_db, tinfo

F = np.float32
T, K, H, N = 12, 64, 96, 48


def _weight(rng, k, n, outliers=True):
    w = rng.normal(size=(k, n)) / np.sqrt(k)
    if outliers:   # one large weight per channel: min_max spends the int4 grid on it
        w[rng.integers(0, k, n), np.arange(n)] *= 8.0
    return w.astype(F)


def _layer(w, enc, transposed=False):
    node = SimpleNamespace(name="mm", inputs=[None, SimpleNamespace(name="w", const_value=lambda: w)])
    return Layer(node, SimpleNamespace(encoding=enc), transposed=transposed)


def _out_mse(x, w_kn, dq_kn, x_ref=None):
    ref = (x if x_ref is None else x_ref) @ w_kn
    return ((ref - x @ dq_kn) ** 2).mean(0)          # per output channel


def _encodings(w, mode):
    if mode == "channel":
        return compute_encoding(w.min(0), w.max(0), bits=4, symmetric=True, signed=True, axis=1)
    if mode == "tensor":
        return compute_encoding(w.min(), w.max(), bits=4, symmetric=True, signed=True)
    return block_encoding(w, 0, int(mode), 4, True)


@pytest.mark.parametrize("mode", ["channel", "32", "tensor"])
def test_never_worse_than_min_max_per_channel(mode):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, K)).astype(F) * rng.uniform(0.2, 3, K).astype(F)
    w = _weight(rng, K, N)
    enc = _encodings(w, mode)
    res = choose(_layer(w, enc), x)
    before = _out_mse(x, w, quantize_dequantize(w, enc))
    after = _out_mse(x, w, quantize_dequantize(w, res.encoding))
    if mode == "tensor":    # one choice for the tensor: its total, not each channel
        before, after = before.sum(keepdims=True), after.sum(keepdims=True)
    assert np.all(after <= before * (1 + 1e-5) + 1e-12), (before, after)
    assert after.sum() < 0.85 * before.sum()                 # the outliers make clipping pay (32: 0.82)
    assert res.mse_after <= res.mse_before
    np.testing.assert_allclose(res.mse_before, before.sum() / N if mode == "tensor" else before.mean(), rtol=1e-3)
    np.testing.assert_allclose(res.mse_after, after.sum() / N if mode == "tensor" else after.mean(), rtol=1e-3)
    assert res.changed > 0 and 0.5 <= res.fraction_min < 1
    # what the search evaluated is what onnxruntime will compute from the exported grid
    np.testing.assert_array_equal(res.weight_dq, quantize_dequantize(w, res.encoding))


def test_float_target_never_worse_and_transposed_gemm():
    rng = np.random.default_rng(1)
    x_f = rng.normal(size=(400, K)).astype(F)
    x_q = x_f + 0.05 * rng.normal(size=x_f.shape).astype(F)       # the input after quantized layers before
    w = _weight(rng, K, N)
    enc = block_encoding(w.T.copy(), 1, 16, 4, True)              # Gemm transB: stored [N, K], blocks along 1
    res = choose(_layer(w.T.copy(), enc, transposed=True), x_q, x_float=x_f)
    assert res.encoding.scale.shape == (N, K // 16)
    before = _out_mse(x_q, w, quantize_dequantize(w.T, enc).T, x_f)
    after = _out_mse(x_q, w, quantize_dequantize(w.T, res.encoding).T, x_f)
    assert np.all(after <= before * (1 + 1e-5)), (before, after)
    np.testing.assert_allclose(res.mse_after, after.mean(), rtol=1e-3)


def test_candidates_vectorised_match_one_by_one():
    rng = np.random.default_rng(2)
    w = _weight(rng, 70, 9)                                        # K not a multiple of the block
    enc = block_encoding(w, 0, 32, 4, True)
    s, z = kn_qparams(_layer(w, enc), enc)
    fr = np.array([0.6, 0.8, 1.0], F)
    many = fake_quant_kn(w, fr[:, None, None] * s[None], np.broadcast_to(z, (3,) + z.shape), enc.qmin, enc.qmax, 32)
    for i, f in enumerate(fr):
        one = quantize_dequantize(w, type(enc)(**{**enc.__dict__, "scale": (f * enc.scale).astype(F)}))
        np.testing.assert_array_equal(many[i], one)


def _mlp(rng, gemm=True):
    """x [2, T, K] -> MatMul w1 -> Relu -> MatMul w2 [-> Reshape -> Gemm transB w3, b3]."""
    inits = [numpy_helper.from_array(_weight(rng, K, H), "w1"), numpy_helper.from_array(_weight(rng, H, N), "w2"),
             numpy_helper.from_array(rng.normal(size=N).astype(F) * 0.1, "b2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["m2"], name="mm2"),
             helper.make_node("Add", ["m2", "b2"], ["y"], name="add2")]
    out = tinfo("y", [2, T, N])
    if gemm:
        inits += [numpy_helper.from_array(_weight(rng, N, 32).T.copy(), "w3"),
                  numpy_helper.from_array(np.array([2 * T, N], np.int64), "shape"),
                  numpy_helper.from_array(rng.normal(size=32).astype(F), "b3")]
        nodes += [helper.make_node("Reshape", ["y", "shape"], ["y2"]),
                  helper.make_node("Gemm", ["y2", "w3", "b3"], ["z"], name="gemm", transB=1)]
        out = tinfo("z", [2 * T, 32])
    return make_model(nodes, [tinfo("x", [2, T, K])], [out], inits, opset=17)


def _calib(rng, n=12):
    return [{"x": rng.normal(size=(2, T, K)).astype(F)} for _ in range(n)]


@pytest.mark.parametrize("block", [None, 32])
def test_pipeline_int4_layers_never_worse_and_runs_in_ort(block):
    rng = np.random.default_rng(3)
    proto, calib = _mlp(rng), _calib(rng)
    kw = dict(weight_bits=4, act_bits=16, weight_block=block, min_sqnr=float("-inf"), progress=False)
    plain = quantize(proto, calib, **kw)
    seq = quantize(proto, calib, recipe="seq-mse", **kw)
    pipe = seq.report["pipeline"]
    assert pipe.index("assign-encodings") + 1 == pipe.index("seq-mse") == pipe.index("insert-qdq") - 1
    for name in ("mm1", "mm2", "gemm"):
        info = seq.report["layers"][name]["seq_mse"]
        assert info["mse_after"] <= info["mse_before"], info
        assert info["exact"] and info["rows"] == 12 * 2 * T
    assert any("seq-mse on 3 MatMul/Gemm layers" in n for n in seq.report["notes"])
    # layer 1 sees the float input: its output MSE, measured by onnxruntime-equivalent numpy, never grows
    x = np.concatenate([c["x"] for c in calib]).reshape(-1, K)
    w1 = numpy_helper.to_array(proto.graph.initializer[0])
    enc_plain, enc_seq = plain.plan.uses[("mm1", 1)].encoding, seq.plan.uses[("mm1", 1)].encoding
    assert _out_mse(x, w1, quantize_dequantize(w1, enc_seq)).sum() \
        <= _out_mse(x, w1, quantize_dequantize(w1, enc_plain)).sum()
    # the exported model runs; its output is closer to float than min_max's
    ev = {"x": rng.normal(size=(2, T, K)).astype(F)}
    ref = run(proto, ev)[0]
    got_seq = run(onnx.load_from_string(_bytes(seq.model)), ev)[0]
    got_plain = run(onnx.load_from_string(_bytes(plain.model)), ev)[0]
    assert sqnr_db(ref, got_seq) > sqnr_db(ref, got_plain), (sqnr_db(ref, got_seq), sqnr_db(ref, got_plain))


def _bytes(model):
    from qcompiler.onnx_io.exporter import model_to_bytes
    return model_to_bytes(model)


def test_skips_shared_weight_with_reason():
    rng = np.random.default_rng(4)
    w = numpy_helper.from_array(_weight(rng, K, K), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"], name="mm_a"),
             helper.make_node("MatMul", ["a", "w"], ["b"], name="mm_b")]
    proto = make_model(nodes, [tinfo("x", [2, T, K])], [tinfo("b", [2, T, K])], [w], opset=17)
    r = quantize(proto, _calib(rng, 4), weight_bits=4, recipe="seq-mse", min_sqnr=float("-inf"), progress=False)
    (stats,) = [res.stats for p, res in r.passes if p.name == "seq-mse"]
    assert stats["layers"] == 0 and stats["skipped"] == {"mm_a": "weight shared with other nodes",
                                                         "mm_b": "weight shared with other nodes"}


def _cli(tmp_path, proto, recipe, *extra):
    rng = np.random.default_rng(7)
    (tmp_path / "m.onnx").write_bytes(proto.SerializeToString())
    np.savez(tmp_path / "c.npz", x=rng.normal(size=(8, 2, T, K)).astype(F))
    r = subprocess.run([sys.executable, "-m", "qcompiler", "quantize", str(tmp_path / "m.onnx"), "--calib",
                        str(tmp_path / "c.npz"), "-o", str(tmp_path / "q.onnx"), "--recipe", recipe,
                        "--report", str(tmp_path / "r.json"), "--allow-low-sqnr", *extra],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    out = run(onnx.load(str(tmp_path / "q.onnx")), {"x": rng.normal(size=(2, T, K)).astype(F)})
    return rep, out


def test_cli_recipe_seq_mse_in_order(tmp_path):
    rep, out = _cli(tmp_path, _mlp(np.random.default_rng(5)), "seq-mse", "--weight-bits", "4", "--block-size", "32",
                    "--act-bits", "16")
    pipe = rep["pipeline"]
    assert pipe[pipe.index("assign-encodings") + 1] == "seq-mse" and pipe[pipe.index("seq-mse") + 1] == "insert-qdq"
    assert rep["layers"]["mm2"]["seq_mse"]["changed"] != "0/" and out[0].shape == (2 * T, 32)


def _api(recipe, seed):
    rng = np.random.default_rng(seed)
    proto = _mlp(rng)
    res = quantize(proto, _calib(rng, 8), weight_bits=4, recipe=recipe, min_sqnr=float("-inf"), progress=False)
    return res, run(onnx.load_from_string(_bytes(res.model)), {"x": rng.normal(size=(2, T, K)).astype(F)})


def test_composes_with_smoothquant_and_bias_correction():
    res, out = _api("smoothquant,seq-mse,bias-correction", 6)
    rep = res.report
    pipe = rep["pipeline"]
    assert pipe.index("smoothquant") < pipe.index("calibrate")
    assert pipe.index("assign-encodings") < pipe.index("seq-mse") < pipe.index("bias-correction") \
        < pipe.index("insert-qdq")
    assert not any("after bias-correction" in n for n in rep["notes"])
    stats = {p.name: r.stats for p, r in res.passes}
    assert "smoothed" in stats["smoothquant"] and stats["bias-correction"]["corrected"] == 1   # the Gemm
    assert "seq_mse" in rep["layers"]["gemm"] and np.all(np.isfinite(out[0]))


def test_bias_correction_first_is_noted():
    res, _ = _api("bias-correction,seq-mse", 8)
    assert any("seq-mse ran after bias-correction" in n for n in res.report["notes"])


def test_one_shot_reader_uses_kept_samples():
    rng = np.random.default_rng(9)
    proto, calib = _mlp(rng, gemm=False), _calib(rng, 6)
    res = quantize(proto, iter(calib), weight_bits=4, recipe="seq-mse", min_sqnr=float("-inf"), progress=False)
    assert res.report["layers"]["mm2"]["seq_mse"]["rows"] == 6 * 2 * T     # all 6 samples, read once


def test_non_finite_input_skipped():
    rng = np.random.default_rng(10)
    w = numpy_helper.from_array(_weight(rng, K, N), "w")
    nodes = [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("MatMul", ["e", "w"], ["y"], name="mm")]
    proto = make_model(nodes, [tinfo("x", [2, T, K])], [tinfo("y", [2, T, N])], [w], opset=17)
    calib = _calib(rng, 4)
    calib[1]["x"][0, 0, 0] = 100.0          # exp(100) overflows float32: an infinite activation
    res = quantize(proto, calib, weight_bits=4, recipe="seq-mse", min_sqnr=float("-inf"), progress=False)
    (stats,) = [r.stats for p, r in res.passes if p.name == "seq-mse"]
    assert stats["skipped"]["mm"] == "input holds NaN or infinity on the calibration data"
