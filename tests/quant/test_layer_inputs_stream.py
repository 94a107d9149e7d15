"""One capture path: adaround's Grams and cle's per-channel statistics now come from
`layer_inputs.stream_values`, and it must hand them exactly the arrays the old per-pass loops read (a
`calibrate.make_session` copy with the wanted values as extra outputs, graph inputs taken from the feed)."""
import numpy as np
import pytest
from onnx import helper, numpy_helper

from qcompiler.onnx_io import model_from_proto
from qcompiler.passes.quantize.adaround import AdaRoundOptions, _capture, linear_form
from qcompiler.quant.calibration.calibrate import extra_output_names, make_session
from qcompiler.quant.calibration.layer_inputs import stream_values
from tests.helpers import make_model, tinfo

F = np.float32


def _model():
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.normal(size=(6, 3, 3, 3)) * 0.3).astype(F), "w1"),
             numpy_helper.from_array((rng.normal(size=6) * 0.1).astype(F), "b1"),
             numpy_helper.from_array((rng.normal(size=(4, 6, 1, 1)) * 0.3).astype(F), "w2"),
             numpy_helper.from_array((rng.normal(size=(4 * 5 * 5, 7)) * 0.1).astype(F), "w3")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2"),
             helper.make_node("Flatten", ["c2"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "w3"], ["y"], name="fc")]
    proto = make_model(nodes, [tinfo("x", [1, 3, 5, 5])], [tinfo("y", [1, 7])], inits)
    return model_from_proto(proto)


def _samples(n=5):
    rng = np.random.default_rng(1)
    return [{"x": rng.normal(size=(1, 3, 5, 5)).astype(F)} for _ in range(n)]


def _old_path(model, samples, names):
    """What adaround's `_capture` and cle's `_collect` did before: their own session and loop."""
    graph_inputs = {v.name for v in model.graph.inputs}
    sess = make_session(model, extra_outputs=extra_output_names(model, names))
    out_names = [o.name for o in sess.get_outputs()]
    out = []
    for feed in samples:
        arrays = dict(zip(out_names, sess.run(out_names, feed)))
        arrays.update({k: v for k, v in feed.items() if k in graph_inputs})
        out.append({n: arrays[n] for n in names})
    return out


def test_stream_values_gives_the_old_arrays():
    model, samples = _model(), _samples()
    names = ["x", "c1", "r1", "f", "y"]          # a graph input, interior values, a graph output
    old = _old_path(model, samples, names)
    got = list(stream_values(model, samples, names))
    assert [i for i, _, _ in got] == list(range(len(samples)))
    for (i, feed, arrays), ref in zip(got, old):
        assert feed is samples[i]
        assert set(arrays) == set(names)
        for n in names:
            assert arrays[n].dtype == ref[n].dtype and np.array_equal(arrays[n], ref[n]), n


def test_stream_values_streams_and_stops_at_max_samples():
    model, samples = _model(), _samples(6)
    gen = stream_values(model, iter(samples), ["c1"], max_samples=3)
    assert not isinstance(gen, (list, tuple))      # a generator: one sample's arrays at a time
    assert [i for i, _, _ in gen] == [0, 1, 2]
    # only graph inputs wanted: no session at all, the feed's own arrays
    assert all(a["x"] is s["x"] for (_, _, a), s in zip(stream_values(model, samples, ["x"]), samples))


def test_adaround_grams_equal_those_of_the_old_arrays():
    model, samples = _model(), _samples()
    g = model.graph
    targets = []
    for name in ("conv1", "conv2", "fc"):
        node = next(n for n in g.nodes if n.name == name)
        layer, why = linear_form(node)
        assert layer is not None, why
        targets.append((node, None, layer, None))
    opts = AdaRoundOptions()
    quads, mismatch = _capture(model, samples, targets, opts)
    assert mismatch == ["", "", ""]
    names = [t[2].node.inputs[0].name for t in targets]
    old = _old_path(model, samples, names)
    for k, (node, _, layer, _) in enumerate(targets):
        gram, count = 0.0, 0
        for arrays in old:
            rows = layer.rows(np.asarray(arrays[node.inputs[0].name], F))
            assert rows.shape[1] <= opts.max_rows and rows.shape[2] <= opts.gram_max_k
            r64 = rows.astype(np.float64)
            gram = gram + np.matmul(r64.transpose(0, 2, 1), r64)
            count += rows.shape[1]
        np.testing.assert_array_equal(quads[k].gram, (gram / count).astype(F))   # _Quadratic keeps float32


def test_cle_statistics_equal_those_of_the_old_arrays():
    from qcompiler.passes.cross_layer_equalization import _collect
    model, samples = _model(), _samples()
    g = model.graph
    c1 = next(n for n in g.nodes if n.name == "conv1")
    relu = next(n for n in g.nodes if n.name == "relu1")
    c2 = next(n for n in g.nodes if n.name == "conv2")

    class Ctx:
        pass
    ctx = Ctx()
    ctx.samples = samples
    st = _collect(ctx, model, [(c1, relu, c2)])["conv1"]
    old = _old_path(model, samples, ["c1", "x"])
    x = np.concatenate([np.moveaxis(np.asarray(a["c1"], np.float64), 1, 0).reshape(6, -1) for a in old], 1)
    u = np.concatenate([np.moveaxis(np.asarray(a["x"], np.float64), 1, 0).reshape(3, -1) for a in old], 1)
    np.testing.assert_array_equal(st.lo, x.min(1))
    np.testing.assert_array_equal(st.hi, x.max(1))
    np.testing.assert_allclose(st.mean, x.mean(1), rtol=1e-12)
    np.testing.assert_allclose(st.asq, (np.maximum(x, 0) ** 2).mean(1), rtol=1e-12)
    np.testing.assert_allclose(st.usq, (u * u).mean(1), rtol=1e-12)


def test_a_failed_run_names_the_caller_and_sample():
    from qcompiler.errors import DataError
    model = _model()
    bad = [{"x": np.zeros((1, 3, 5, 5), F)}, {"x": np.zeros((1, 2, 5, 5), F)}]
    with pytest.raises(DataError, match="cle sample 1"):
        list(stream_values(model, bad, ["c1"], where="cle sample"))


def test_a_large_models_values_come_without_prepacked_weights(monkeypatch):
    """Over memory.PREPACK_MAX_BYTES the value session keeps no repacked weight copies (memory of a large model's
    capture); the values stay those of the default session within float rounding, and one session made for
    all names serves a stream over a subset of them."""
    from qcompiler.quant.calibration import layer_inputs
    model, samples = _model(), _samples()
    names = ["c1", "f", "y"]
    old = _old_path(model, samples, names)
    seen = {}
    real = layer_inputs.make_session

    def spy(*a, **k):
        seen["prepack"] = k.get("prepack")
        return real(*a, **k)
    monkeypatch.setattr(layer_inputs, "make_session", spy)
    from qcompiler.quant.runtime import memory
    monkeypatch.setattr(memory, "PREPACK_MAX_BYTES", 0)
    session = layer_inputs.value_session(model, names)
    assert seen["prepack"] is False
    got = list(stream_values(model, samples, ["f", "y"], session=session))
    for (i, _, arrays), ref in zip(got, old):
        assert set(arrays) == {"f", "y"}
        for n in ("f", "y"):
            np.testing.assert_allclose(arrays[n], ref[n], rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(memory, "PREPACK_MAX_BYTES", 1 << 40)
    layer_inputs.value_session(model, names)
    assert seen["prepack"] is True
