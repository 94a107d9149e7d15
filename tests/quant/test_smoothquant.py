"""smoothquant (issue 15 item 1): activation outliers moved into MatMul weights, 1/s folded into the LayerNorm
before them. Float outputs unchanged; W8A8 per-tensor activations gain SQNR on a Q/K/V block whose LayerNorm
output has two channels 50x the rest; producers that cannot absorb a scale, residual readers and shared weights
are skipped with their reason; `--recipe smoothquant` runs right after fuse-hardswish."""
import json
import subprocess
import sys

import numpy as np
import pytest
from onnx import helper, numpy_helper

from qcompiler.errors import DataError
from qcompiler.quant import quantize
from qcompiler.quant.pipeline import DEFAULT_PIPELINE
from tests.helpers import make_model, run, sqnr_db, tinfo
from tests.patterns.builders import Builder, layernorm, rmsnorm

F = np.float32
K, N, T = 32, 16, 10
UP_TO_SMOOTHQUANT = list(DEFAULT_PIPELINE[:DEFAULT_PIPELINE.index("fuse-hardswish") + 1]) + ["smoothquant"]


def _qkv(rng, producer="LayerNormalization", shared=False, residual=False, shape_reader=False):
    """x -> producer -> h -> MatMul q/k/v; gamma has channels 3 and 17 at 50x."""
    g = np.ones(K, F)
    g[[3, 17]] = 50.0
    inits = [numpy_helper.from_array(g, "gamma"), numpy_helper.from_array((rng.normal(size=K) * 0.1).astype(F), "beta")]
    if producer == "LayerNormalization":
        nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], name="ln", axis=-1)]
    else:
        nodes = [helper.make_node("Mul", ["x", "gamma"], ["xg"], name="pre"),
                 helper.make_node(producer, ["xg"], ["h"], name="act")]
    outs = []
    for q in "qkv":
        inits.append(numpy_helper.from_array((rng.normal(size=(K, N)) / np.sqrt(K)).astype(F), "w" + q))
        nodes.append(helper.make_node("MatMul", ["h", "w" + q], [q], name="mm_" + q))
        outs.append(tinfo(q, [2, T, N]))
    ins = [tinfo("x", [2, T, K])]
    if shared:   # wq is also read by a MatMul on another input
        ins.append(tinfo("y", [2, T, K]))
        nodes.append(helper.make_node("MatMul", ["y", "wq"], ["o"], name="mm_other"))
        outs.append(tinfo("o", [2, T, N]))
    if shape_reader:   # Shape(h) sees no value: it does not block the fold (BERT reads Q/K/V's input so)
        nodes.append(helper.make_node("Shape", ["h"], ["hs"], name="shape_h"))
        outs.append(tinfo("hs", [3], 7))
    if residual:   # h also feeds a residual Add (BERT): 1/s in the LayerNorm would change it
        nodes.append(helper.make_node("Add", ["h", "x"], ["res"], name="residual"))
        outs.append(tinfo("res", [2, T, K]))
    return make_model(nodes, ins, outs, inits, opset=17)


def _data(rng, proto, n=16):
    names = [i.name for i in proto.graph.input]
    shape = (2, T, K)
    return [{k: rng.normal(size=shape).astype(F) for k in names} for _ in range(n)]


def _sq_stats(r):
    (stats,) = [res.stats for p, res in r.passes if p.name == "smoothquant"]
    return stats


def _close(got, want):
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * float(np.abs(w).max()))


def test_float_outputs_unchanged_and_qkv_share_one_scale():
    rng = np.random.default_rng(0)
    p = _qkv(rng, shape_reader=True)
    calib = _data(rng, p)
    r = quantize(p, calib, pipeline=UP_TO_SMOOTHQUANT)
    st = _sq_stats(r)
    assert st["smoothed"] == 3 and sorted(st["smoothed_nodes"]) == ["mm_k", "mm_q", "mm_v"]
    assert any(n.startswith("smoothquant (alpha 0.5): 3 MatMul/Gemm smoothed") for n in r.report["notes"])
    ev = _data(rng, p, 1)[0]
    _close(run(r.model, ev), run(p, ev))
    g = r.model.graph
    gamma = {n.name: n for n in g}["ln"].inputs[1].const_value()
    assert gamma[3] < 50.0 / 2 and gamma[17] < 50.0 / 2        # the outliers left the activation
    s = 50.0 / gamma[3]
    for q in "qkv":   # one s for the three readers: row 3 of each weight grew by the same factor
        w0 = numpy_helper.to_array({t.name: t for t in p.graph.initializer}["w" + q])
        w1 = {n.name: n for n in g}["mm_" + q].inputs[1].const_value()
        np.testing.assert_allclose(w1[3], w0[3] * s, rtol=1e-4)


def test_w8a8_per_tensor_sqnr_rises():
    rng = np.random.default_rng(0)
    p = _qkv(rng)
    calib = _data(rng, p)
    ev = _data(rng, p, 1)[0]
    ref = run(p, ev)
    got = {}
    for recipe in (None, ["smoothquant"]):
        r = quantize(p, calib, recipe=recipe, optimize="accuracy", act_bits=8, weight_bits=8)
        got[bool(recipe)] = [sqnr_db(w, o) for w, o in zip(ref, run(r.model, ev))]
    # measured: 28.6 / 30.6 / 30.7 dB -> 36.1 / 36.7 / 36.7 dB
    for before, after in zip(got[False], got[True]):
        assert after >= before + 3.0, got


def test_decomposed_layernorm_and_rmsnorm_absorb_the_scale():
    rng = np.random.default_rng(1)
    for norm in ("layernorm", "rmsnorm"):
        b = Builder(shape=(2, T, K), opset=14)
        h = layernorm(b, "x", hidden=K) if norm == "layernorm" else rmsnorm(b, "x", hidden=K)
        for q in "qk":
            w = (rng.normal(size=(K, N)) / np.sqrt(K)).astype(F)
            b.output(b.op("MatMul", h, b.const(w, "w" + q), name="mm_" + q), shape=(2, T, N))
        p = b.proto()
        calib = [{"x": (rng.normal(size=(2, T, K)) * np.where(np.arange(K) % 9 == 0, 40, 1)).astype(F)}
                 for _ in range(8)]
        r = quantize(p, calib, pipeline=UP_TO_SMOOTHQUANT)
        assert _sq_stats(r)["smoothed"] == 2, (norm, _sq_stats(r))
        _close(run(r.model, calib[0]), run(p, calib[0]))


def test_relu_producer_and_residual_reader_skipped_with_reason():
    rng = np.random.default_rng(2)
    p = _qkv(rng, producer="Relu")
    r = quantize(p, _data(rng, p), pipeline=UP_TO_SMOOTHQUANT)
    st = _sq_stats(r)
    assert st["smoothed"] == 0 and st["skipped"] == 3
    assert "producer Relu 'act' cannot absorb" in st["skipped_reasons"]["mm_q"]
    p = _qkv(rng, residual=True)
    r = quantize(p, _data(rng, p), pipeline=UP_TO_SMOOTHQUANT)
    st = _sq_stats(r)
    assert st["smoothed"] == 0 and st["skipped"] == 3, st
    assert "read by Add 'residual'" in st["skipped_reasons"]["mm_v"], st


def test_shared_weight_left_untouched():
    rng = np.random.default_rng(3)
    p = _qkv(rng, shared=True)
    calib = _data(rng, p)
    r = quantize(p, calib, pipeline=UP_TO_SMOOTHQUANT)
    st = _sq_stats(r)
    assert st["smoothed"] == 0 and "weight 'wq' is shared" in st["skipped_reasons"]["mm_q"], st
    inits = {t.name: numpy_helper.to_array(t) for t in p.graph.initializer}
    by = {n.name: n for n in r.model.graph}
    for name, node, i in (("wq", "mm_q", 1), ("wq", "mm_other", 1), ("gamma", "ln", 1), ("beta", "ln", 2)):
        np.testing.assert_array_equal(by[node].inputs[i].const_value(), inits[name])
    _close(run(r.model, calib[0]), run(p, calib[0]))


def test_reader_without_rewind_is_one_data_error():
    rng = np.random.default_rng(4)
    p = _qkv(rng)
    feeds = iter(_data(rng, p, 4))

    class Reader:   # onnxruntime's CalibrationDataReader shape, no rewind()
        def get_next(self):
            return next(feeds, None)

    with pytest.raises(DataError, match="rewind") as e:
        quantize(p, Reader(), recipe=["smoothquant"])
    assert "\n" not in str(e.value)


def test_cli_recipe_runs_after_fuse_hardswish(tmp_path):
    rng = np.random.default_rng(5)
    p = _qkv(rng)
    (tmp_path / "m.onnx").write_bytes(p.SerializeToString())
    np.savez(tmp_path / "c.npz", x=rng.normal(size=(8, 2, T, K)).astype(F))
    r = subprocess.run([sys.executable, "-m", "qcompiler", "quantize", str(tmp_path / "m.onnx"), "--calib",
                        str(tmp_path / "c.npz"), "-o", str(tmp_path / "q.onnx"), "--recipe", "smoothquant",
                        "--report", str(tmp_path / "r.json")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    pipe = json.loads((tmp_path / "r.json").read_text())["pipeline"]
    names = [x if isinstance(x, str) else x.get("name") for x in pipe]
    assert names[names.index("fuse-hardswish") + 1] == "smoothquant", names
    ev = {"x": rng.normal(size=(2, T, K)).astype(F)}
    import onnx
    assert len(run(onnx.load(str(tmp_path / "q.onnx")), ev)) == 3


def test_gemm_trans_b_smoothed_outputs_unchanged():
    rng = np.random.default_rng(6)
    g = np.ones(K, F)
    g[[1, 5]] = 50.0
    wt = (rng.normal(size=(N, K)) / np.sqrt(K)).astype(F)   # transB: [N, K]
    inits = [numpy_helper.from_array(g, "gamma"), numpy_helper.from_array(np.zeros(K, F), "beta"),
             numpy_helper.from_array(wt, "wt"), numpy_helper.from_array(rng.normal(size=N).astype(F), "c")]
    nodes = [helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], name="ln", axis=-1),
             helper.make_node("Gemm", ["h", "wt", "c"], ["y"], name="gemm", transB=1)]
    p = make_model(nodes, [tinfo("x", [4, K])], [tinfo("y", [4, N])], inits, opset=17)
    calib = [{"x": rng.normal(size=(4, K)).astype(F)} for _ in range(8)]
    r = quantize(p, calib, pipeline=UP_TO_SMOOTHQUANT)
    assert _sq_stats(r)["smoothed"] == 1
    w1 = {n.name: n for n in r.model.graph}["gemm"].inputs[1].const_value()
    assert w1.shape == (N, K) and np.abs(w1[:, 1]).max() > 2 * np.abs(wt[:, 1]).max()   # column k of B^T grew
    _close(run(r.model, calib[0]), run(p, calib[0]))
