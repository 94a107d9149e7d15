"""smoothquant: activation outliers moved into MatMul weights, 1/s folded into the producer
(LayerNorm, decomposed norms, a previous MatMul) or, where no fold is legal, an explicit Mul. Float outputs
unchanged; W8A8 per-tensor activations gain SQNR on a Q/K/V block whose LayerNorm output has two channels 50x the
rest, also when that output feeds a residual Add; GELUs sharing one 0.5 are never written; alpha searched per
layer is never worse than 0.5 on the layer MSE; int4 weights compose; `--recipe smoothquant` runs right after
fuse-hardswish, `--smoothquant-alpha` fixes alpha."""
import json
import subprocess
import sys

import numpy as np
import pytest
from onnx import helper, numpy_helper

from qcompiler.errors import ArgumentError, DataError
from qcompiler.quant import quantize
from qcompiler.quant.core.pipeline import DEFAULT_PIPELINE
from qcompiler.passes.quantize.smoothquant import ALPHA_GRID
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
    assert set(st["folds"].values()) == {"fold"} and not st["inserted_muls"]
    assert len(set(st["alphas"].values())) == 1 and st["alphas"]["mm_q"] in ALPHA_GRID
    rep = r.report["smoothquant"]
    assert rep["layers"]["mm_k"] == {"placed": "fold", "alpha": st["alphas"]["mm_k"]} and rep["counts"]["fold"] == 3
    assert any(n.startswith("smoothquant (alpha searched per layer): 3 MatMul/Gemm smoothed (1/s folded: 3")
               for n in r.report["notes"])
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


def _sqnr_without_and_with(seed, **kw):
    """Per-output SQNR on one fresh sample of the Q/K/V block quantized without and with `smoothquant` (keys
    False/True), and the smoothed run's result."""
    rng = np.random.default_rng(seed)
    p = _qkv(rng)
    calib = _data(rng, p)
    ev = _data(rng, p, 1)[0]
    ref = run(p, ev)
    got, r = {}, None
    for recipe in (None, ["smoothquant"]):
        r = quantize(p, calib, recipe=recipe, optimize="accuracy", **kw)
        got[bool(recipe)] = [sqnr_db(w, o) for w, o in zip(ref, run(r.model, ev))]
    return got, r


def test_w8a8_per_tensor_sqnr_rises():
    got, _ = _sqnr_without_and_with(0, act_bits=8, weight_bits=8)
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


def test_relu_producer_gets_an_explicit_mul_and_residual_reader_a_restoring_mul():
    rng = np.random.default_rng(2)
    p = _qkv(rng, producer="Relu")
    calib = _data(rng, p)
    r = quantize(p, calib, pipeline=UP_TO_SMOOTHQUANT, smoothquant_alpha=0.5)
    st = _sq_stats(r)
    assert st["smoothed"] == 3 and set(st["folds"].values()) == {"mul"}, st
    assert st["left_unquantized"] == ["act"]    # the Relu's output: the grid sits after the Mul only
    (mul,) = [n for n in r.model.graph if n.name in st["inserted_muls"]]
    assert mul.inputs[0].name == "h" and {u.user.name for u in mul.outputs[0].uses()} == {"mm_q", "mm_k", "mm_v"}
    _close(run(r.model, calib[0]), run(p, calib[0]))
    p = _qkv(rng, residual=True)
    calib = _data(rng, p)
    r = quantize(p, calib, pipeline=UP_TO_SMOOTHQUANT, smoothquant_alpha=0.5)
    st = _sq_stats(r)
    assert st["smoothed"] == 3 and set(st["folds"].values()) == {"fold+restore"}, st
    (mul,) = [n for n in r.model.graph if n.name in st["inserted_muls"]]
    assert [u.user.name for u in mul.outputs[0].uses()] == ["residual"]    # only the residual sees X restored
    _close(run(r.model, calib[0]), run(p, calib[0]))


def _w8a8(p, calib, ev, **kw):
    r = quantize(p, calib, target={"base": "ort_cpu", "wide_activation_bits": 8}, optimize="accuracy", act_bits=8,
                 min_sqnr=float("-inf"), **kw)
    return r, run(r.model, ev)


@pytest.mark.parametrize("producer", ["LayerNormalization", "Relu"])
def test_w8a8_sqnr_rises_with_a_residual_reader_or_an_explicit_mul(producer):
    rng = np.random.default_rng(7)
    p = _qkv(rng, producer=producer, residual=producer == "LayerNormalization")
    calib = _data(rng, p)
    ev = _data(rng, p, 1)[0]
    ref = run(p, ev)
    # Relu: its input (x * gamma, the outliers) kept float: an explicit Mul helps only where the tensor before
    # it is not itself on an 8-bit grid (minilm's GELU: its input is; see the bench)
    kw = {"exclude": ["pre"]} if producer == "Relu" else {}
    _, plain = _w8a8(p, calib, ev, **kw)
    r, smooth = _w8a8(p, calib, ev, recipe=["smoothquant"], **kw)
    assert set(_sq_stats(r)["folds"].values()) == {"fold+restore" if producer == "LayerNormalization" else "mul"}
    rise = 3.0 if producer == "LayerNormalization" else 1.5
    for i in range(3):   # q, k, v; measured: LayerNorm 28.6/30.6/30.7 -> 36+ dB, Relu +2.4 dB
        assert sqnr_db(ref[i], smooth[i]) >= sqnr_db(ref[i], plain[i]) + rise, (i, sqnr_db(ref[i], plain[i]),
                                                                             sqnr_db(ref[i], smooth[i]))
    if producer == "LayerNormalization":   # the residual Add's output keeps its quality
        assert sqnr_db(ref[3], smooth[3]) >= sqnr_db(ref[3], plain[3]) - 1.0


def _two_gelus(rng, k=K, n=N):
    """x -> MatMul w1 -> GELU -> MatMul w2 -> y; x -> MatMul w3 -> GELU -> z; both GELUs share half/sqrt2/one."""
    w1 = (rng.normal(size=(K, k)) / np.sqrt(K)).astype(F)
    w1[:, [2, 9]] *= 40.0                       # two hidden channels with outliers after the GELU
    inits = [numpy_helper.from_array(w1, "w1"),
             numpy_helper.from_array((rng.normal(size=(k, n)) / np.sqrt(k)).astype(F), "w2"),
             numpy_helper.from_array((rng.normal(size=(K, k)) / np.sqrt(K)).astype(F), "w3"),
             numpy_helper.from_array(np.array(0.5, F), "half"),
             numpy_helper.from_array(np.array(np.sqrt(2.0), F), "sqrt2"),
             numpy_helper.from_array(np.array(1.0, F), "one")]
    nodes = []
    for tag, w in (("a", "w1"), ("b", "w3")):
        nodes += [helper.make_node("MatMul", ["x", w], [f"u{tag}"], name=f"mm_in_{tag}"),
                  helper.make_node("Div", [f"u{tag}", "sqrt2"], [f"d{tag}"], name=f"div_{tag}"),
                  helper.make_node("Erf", [f"d{tag}"], [f"e{tag}"], name=f"erf_{tag}"),
                  helper.make_node("Add", [f"e{tag}", "one"], [f"p{tag}"], name=f"add_{tag}"),
                  helper.make_node("Mul", [f"u{tag}", f"p{tag}"], [f"m{tag}"], name=f"mul_{tag}"),
                  helper.make_node("Mul", [f"m{tag}", "half"], [f"g{tag}"], name=f"half_{tag}")]
    nodes.append(helper.make_node("MatMul", ["ga", "w2"], ["y"], name="mm_out"))
    nodes.append(helper.make_node("Identity", ["gb"], ["z"], name="id_b"))
    return make_model(nodes, [tinfo("x", [2, T, K])], [tinfo("y", [2, T, n]), tinfo("z", [2, T, k])], inits,
                      opset=17)


def test_gelus_sharing_one_half_are_never_written():
    rng = np.random.default_rng(8)
    p = _two_gelus(rng)
    calib = _data(rng, p)
    r = quantize(p, calib, pipeline=UP_TO_SMOOTHQUANT, smoothquant_alpha=0.5)
    st = _sq_stats(r)
    assert st["folds"].get("mm_out") == "mul", st
    by = {n.name: n for n in r.model.graph}
    for tag in "ab":   # both GELUs read the same scalar constants, unchanged
        assert by[f"half_{tag}"].inputs[1].name == "half" and by[f"div_{tag}"].inputs[1].name == "sqrt2"
        assert by[f"add_{tag}"].inputs[1].name == "one"
    g = r.model.graph
    assert float(g.value("half").const_value()) == 0.5 and g.value("half").const_value().shape == ()
    assert r.model.graph.outputs[1].producer.name == "half_b"   # the other GELU feeds what it fed before
    _close(run(r.model, calib[0]), run(p, calib[0]))


def test_fold_into_a_previous_matmul_and_its_bias():
    rng = np.random.default_rng(9)
    w1 = (rng.normal(size=(K, K)) / np.sqrt(K)).astype(F)
    w1[:, [4, 11]] *= 50.0
    b1 = (rng.normal(size=K) * 0.1).astype(F)
    w2 = (rng.normal(size=(K, N)) / np.sqrt(K)).astype(F)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["u"], name="mm1"),
             helper.make_node("Add", ["u", "b1"], ["h"], name="bias1"),
             helper.make_node("MatMul", ["h", "w2"], ["y"], name="mm2")]
    p = make_model(nodes, [tinfo("x", [2, T, K])], [tinfo("y", [2, T, N])], inits, opset=17)
    calib = _data(rng, p)
    r = quantize(p, calib, pipeline=UP_TO_SMOOTHQUANT)
    st = _sq_stats(r)
    assert st["folds"]["mm2"] == "fold", st
    by = {n.name: n for n in r.model.graph}
    nw1, nb1 = by["mm1"].inputs[1].const_value(), by["bias1"].inputs[1].const_value()
    s = b1.astype(np.float64) / nb1                     # the bias column n divided by s_n ...
    assert s[4] > 2.0 and s[11] > 2.0
    ratio = nw1 * s[None, :] / w1                      # ... and w1's column n too (its rows may carry mm1's own s)
    np.testing.assert_allclose(ratio, ratio[:, :1] * np.ones((1, K)), rtol=1e-3)
    np.testing.assert_allclose(by["mm2"].inputs[1].const_value()[4], w2[4] * s[4], rtol=1e-4)
    assert not [n for n in r.model.graph if n.op_type == "Mul" and n.inputs[0].name == "h"]   # no Mul on h
    _close(run(r.model, calib[0]), run(p, calib[0]))


def test_alpha_search_is_vectorised_and_never_worse_than_half():
    from qcompiler.passes.quantize.smoothquant import layer_mse, search_alpha, smoothing_scale
    rng = np.random.default_rng(10)
    for trial in range(4):
        x = rng.normal(size=(256, K)).astype(F)
        x[:, rng.choice(K, 3, replace=False)] *= rng.uniform(5, 80)
        w = (rng.normal(size=(K, N)) / np.sqrt(K)).astype(F)
        xmax, wmax = np.abs(x).max(0), np.abs(w).max(1)
        best, scores = search_alpha(x, w, xmax, wmax, act_bits=8, weight_bits=8, weight_range_bits=7)
        assert best in ALPHA_GRID and set(scores) == set(ALPHA_GRID)
        assert scores[best] <= scores[0.5]
        one = layer_mse(x, w, smoothing_scale(xmax, wmax, best)[None], act_bits=8, weight_bits=8,
                        weight_range_bits=7)
        np.testing.assert_allclose(one[0], scores[best], rtol=1e-6)   # the batch equals one alpha at a time
    # in the pass: each layer's alpha is one of the grid, and fixing it to 0.5 gives 0.5 everywhere
    p = _qkv(rng)
    calib = _data(rng, p)
    assert set(_sq_stats(quantize(p, calib, pipeline=UP_TO_SMOOTHQUANT))["alphas"].values()) <= set(ALPHA_GRID)
    assert set(_sq_stats(quantize(p, calib, pipeline=UP_TO_SMOOTHQUANT, smoothquant_alpha=0.5))["alphas"]
               .values()) == {0.5}


def test_alpha_argument_checked():
    p = _qkv(np.random.default_rng(11))
    for bad in (0.0, 1.0, -0.2, float("nan"), "0.5", True):
        with pytest.raises(ArgumentError, match="smoothquant_alpha") as e:
            quantize(p, [], smoothquant_alpha=bad)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("block", [None, 16])
def test_int4_weights_compose(block):
    got, smoothed = _sqnr_without_and_with(12, weight_bits=4, weight_block=block, min_sqnr=float("-inf"))
    assert _sq_stats(smoothed)["smoothed"] == 3
    # the search scores alpha at 4-bit weights: never much worse than without smoothing (measured: it rises)
    for before, after in zip(got[False], got[True]):
        assert after >= before - 0.5, got


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
    r = subprocess.run([sys.executable, "-m", "qcompiler", "quantize", str(tmp_path / "m.onnx"), "--calib",
                        str(tmp_path / "c.npz"), "-o", str(tmp_path / "q2.onnx"), "--smoothquant-alpha", "0.6",
                        "--report", str(tmp_path / "r2.json")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (sq,) = [x for x in json.loads((tmp_path / "r2.json").read_text())["notes"] if x.startswith("smoothquant")]
    assert sq.startswith("smoothquant (alpha 0.6): 3 MatMul/Gemm smoothed"), sq
    r = subprocess.run([sys.executable, "-m", "qcompiler", "quantize", str(tmp_path / "m.onnx"), "--calib",
                        str(tmp_path / "c.npz"), "-o", str(tmp_path / "q3.onnx"), "--smoothquant-alpha", "1.5"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "smoothquant-alpha" in r.stderr and "Traceback" not in r.stderr, r.stderr


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
