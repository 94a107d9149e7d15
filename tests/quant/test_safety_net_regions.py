"""The safety net's region search: damage spread over a module (a spectrum built from Convs, squares and sums
before a Log, where every band's quantizers wipe its quiet bins) is fixed by keeping that module's quantizers
off the 8-bit grid, which no quantizer-by-quantizer trial finds; one bad quantizer is still found alone, without
a region search."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from qcompiler.passes.quantize import safety_net
from qcompiler.passes.quantize.safety_net.budget import MAX_RUNS, MIN_RUNS, Clock, budget_runs
from qcompiler.passes.quantize.safety_net.regions import scope_prefixes
from qcompiler.quant import quantize
from qcompiler.quant.core.switches import DEFAULT_MIN_SQNR_DB

SCOPE = "/frontend/spectrum/"


def spectrum_model(groups=6, bins=4, win=32, hop=16, frames=16, n=24, noise=0.3, seed=0):
    """x [1,1,L] -> per band group: Conv re/im (a windowed DFT filter bank), squares, sum, +eps, Log, all under
    SCOPE; then Concat -> Conv 1x1 -> Relu -> Conv 1x1 under /head/. Inputs: three loud low tones (every group
    holds loud bins) plus quiet noise (every group holds quiet bins an 8-bit power grid cannot resolve)."""
    rng = np.random.default_rng(seed)
    length = hop * (frames - 1) + win
    t = np.arange(win)
    hann = 0.5 - 0.5 * np.cos(2 * np.pi * t / win)
    freqs = np.arange(groups * bins) % (win // 2) + 1
    mk = h.make_node
    inits, nodes, logs = [nh.from_array(np.float32(1e-6), "eps")], [], []
    for g in range(groups):
        f = freqs[g * bins:(g + 1) * bins]
        p = f"{SCOPE}band{g}/"
        inits += [nh.from_array((np.cos(2 * np.pi * f[:, None] * t / win) * hann).astype(np.float32)[:, None],
                                f"{p}wr"),
                  nh.from_array((-np.sin(2 * np.pi * f[:, None] * t / win) * hann).astype(np.float32)[:, None],
                                f"{p}wi")]
        nodes += [mk("Conv", ["x", f"{p}wr"], [f"{p}re"], strides=[hop], name=f"{p}conv_re"),
                  mk("Conv", ["x", f"{p}wi"], [f"{p}im"], strides=[hop], name=f"{p}conv_im"),
                  mk("Mul", [f"{p}re", f"{p}re"], [f"{p}re2"], name=f"{p}sq_re"),
                  mk("Mul", [f"{p}im", f"{p}im"], [f"{p}im2"], name=f"{p}sq_im"),
                  mk("Add", [f"{p}re2", f"{p}im2"], [f"{p}pow"], name=f"{p}power"),
                  mk("Add", [f"{p}pow", "eps"], [f"{p}pe"], name=f"{p}add_eps"),
                  mk("Log", [f"{p}pe"], [f"{p}log"], name=f"{p}log")]
        logs.append(f"{p}log")
    c = groups * bins
    inits += [nh.from_array((rng.standard_normal((16, c, 1)) * 0.3).astype(np.float32), "/head/w1"),
              nh.from_array((rng.standard_normal((8, 16, 1)) * 0.3).astype(np.float32), "/head/w2")]
    nodes += [mk("Concat", logs, ["/head/spec"], axis=1, name="/head/concat"),
              mk("Conv", ["/head/spec", "/head/w1"], ["/head/c1"], name="/head/conv1"),
              mk("Relu", ["/head/c1"], ["/head/r1"], name="/head/relu1"),
              mk("Conv", ["/head/r1", "/head/w2"], ["y"], name="/head/conv2")]
    graph = h.make_graph(nodes, "spectrum", [h.make_tensor_value_info("x", T.FLOAT, [1, 1, length])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 8, frames])], inits)
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 8
    tt = np.arange(length)
    xs = []
    for _ in range(n):
        s = sum(a * np.cos(2 * np.pi * k * tt / win + rng.uniform(0, 6.3)) for k, a in ((1, 3.0), (2, 2.0), (3, 1.0)))
        xs.append((s + noise * rng.standard_normal(length)).astype(np.float32)[None, None])
    return m, np.stack(xs)


def ort_sqnr(res, float_model, x, tmp_path) -> float:
    """The exported model's output SQNR against float, in onnxruntime, over every sample."""
    out = str(tmp_path / "q.onnx")
    res.save(out)
    q, f = ort.InferenceSession(out), ort.InferenceSession(float_model.SerializeToString())
    y = np.stack([q.run(None, {"x": s})[0] for s in x])
    ref = np.stack([f.run(None, {"x": s})[0] for s in x])
    return float(-10 * np.log10(np.sum((ref - y) ** 2) / np.sum(ref ** 2)))


def test_spectrum_needs_the_region_search(tmp_path, monkeypatch):
    m, x = spectrum_model()
    feeds = [{"x": s} for s in x]
    monkeypatch.setattr(safety_net, "REGIONS", False)
    alone = quantize(m, feeds, optimize="accuracy")
    assert alone.report["safety_net"]["triggered"]
    s_alone = ort_sqnr(alone, m, x, tmp_path)
    assert s_alone < DEFAULT_MIN_SQNR_DB, s_alone          # single-quantizer trials do not reach the floor
    monkeypatch.setattr(safety_net, "REGIONS", True)
    res = quantize(m, feeds, optimize="accuracy")
    sn = res.report["safety_net"]
    s = ort_sqnr(res, m, x, tmp_path)
    assert s >= DEFAULT_MIN_SQNR_DB > sn["sqnr_before_db"], (s, sn["summary"])
    assert res.report["below_floor"] == []
    assert sn["quantizer_search_db"] < DEFAULT_MIN_SQNR_DB + safety_net.TARGET_MARGIN_DB
    kept = [t for t in sn["tried"] if t["kept"]]
    assert len(kept) == 1 and kept[0]["region"] == SCOPE and kept[0]["kind"] == "scope"
    assert kept[0]["sqnr_db"] >= DEFAULT_MIN_SQNR_DB
    kinds = {t["kind"] for t in sn["tried"] if not t["kept"]}
    assert {"quantizers", "scope"} <= kinds                 # it says what else it tried, phase by phase
    assert SCOPE in sn["summary"] and sn["summary"].startswith("kept module")
    # what it kept off the 8-bit grid is that module's quantizers (and the input only it reads)
    assert sn["changed"] and all(c["value"].startswith(SCOPE) or c["value"] == "x" for c in sn["changed"])


def one_bad_quantizer_model(n=16):
    """x -> Relu -> Add(1000) -> Sub(1000) -> MatMul: the Add's output (1000 + a few units) on an 8-bit grid
    that must hold 0 loses every unit; no other quantizer hurts."""
    rng = np.random.default_rng(3)
    inits = [nh.from_array(np.full([1, 16], 1000.0, np.float32), "big"),
             nh.from_array((rng.standard_normal((16, 8)) * 0.3).astype(np.float32), "w")]
    mk = h.make_node
    nodes = [mk("Relu", ["x"], ["r"], name="/a/relu"), mk("Add", ["r", "big"], ["up"], name="/a/add"),
             mk("Sub", ["up", "big"], ["down"], name="/a/sub"), mk("MatMul", ["down", "w"], ["y"], name="/b/mm")]
    graph = h.make_graph(nodes, "bad", [h.make_tensor_value_info("x", T.FLOAT, [1, 16])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 8])], inits)
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 8
    return m, rng.standard_normal((n, 1, 16)).astype(np.float32) * 2


def test_one_bad_quantizer_needs_no_region_search(tmp_path):
    m, x = one_bad_quantizer_model()
    res = quantize(m, [{"x": s} for s in x], optimize="accuracy", target="trt")
    sn = res.report["safety_net"]
    assert sn["triggered"] and sn["sqnr_before_db"] < DEFAULT_MIN_SQNR_DB, sn
    assert ort_sqnr(res, m, x, tmp_path) >= DEFAULT_MIN_SQNR_DB
    # found by the quantizer search alone: no region trial
    assert sn["tried"] and all(t["kind"] == "quantizers" for t in sn["tried"]), sn["tried"]
    kept = [t for t in sn["tried"] if t["kept"]]
    assert len(kept) == 1 and kept[0]["quantizers"] == len(sn["changed"]) <= 2, sn


@pytest.mark.parametrize("name,scopes", [("/encoder/layer.0/attention/MatMul",
                                          ["/encoder/", "/encoder/layer.0/", "/encoder/layer.0/attention/"]),
                                         ("encoder.layer.0.dense", ["encoder.", "encoder.layer.", "encoder.layer.0."]),
                                         ("MatMul_12", [])])
def test_scope_prefixes(name, scopes):
    assert scope_prefixes(name) == scopes


def test_budget_grows_with_the_model_within_floor_and_cap():
    assert budget_runs(50) == MIN_RUNS
    assert MIN_RUNS < budget_runs(5000) < MAX_RUNS
    assert budget_runs(5000) < budget_runs(6000)
    assert budget_runs(10 ** 6) == MAX_RUNS


def test_budget_counts_runs_not_seconds():
    """The same trials end the search on a quiet and on a busy machine: only the wall-time last resort reads
    the clock."""
    c = Clock(50, start=0.0)      # started "long ago": only MAX_SECONDS would notice
    c.seconds = float("inf")
    c.spend(MIN_RUNS - 1)
    assert not c.out()
    c.spend(1)
    assert c.out() and "sample runs" in c.spent()
    slow = Clock(50, start=0.0)   # the wall-time last resort
    assert slow.out() and "wall time" in slow.spent()


def test_cli_shows_the_trials_and_says_what_it_kept(tmp_path):
    from click.testing import CliRunner

    from qcompiler.cli import main
    m, x = spectrum_model()
    mp, dp = tmp_path / "spec.onnx", tmp_path / "calib.npz"
    onnx.save(m, str(mp))
    np.savez(str(dp), x=x)
    args = ["quantize", str(mp), "--calib", str(dp), "-o", str(tmp_path / "q.onnx"), "--optimize", "accuracy"]
    r = CliRunner().invoke(main, args + ["--progress"])
    assert r.exit_code == 0, r.stderr
    assert any(line.startswith("safety net: ") and "trial" in line for line in r.stderr.splitlines()), r.stderr
    assert "\r" not in r.stderr
    assert f"safety net kept module '{SCOPE}'" in r.stdout
    r = CliRunner().invoke(main, args + ["--progress", "-q"])
    assert r.exit_code == 0 and r.stderr == "" and r.stdout == ""


def outlier_weight_model(d=32, n=16):
    """x -> MatMul(w1) -> MatMul(w2): w1 has one column 100x the others (a per-tensor 8-bit grid wipes the rest)
    and w2 ignores that column, so the output is what the wiped columns compute."""
    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((d, d)) * 0.3).astype(np.float32)
    w1[:, 0] *= 100
    w2 = (rng.standard_normal((d, 8)) * 0.3).astype(np.float32)
    w2[0] = 0
    mk = h.make_node
    nodes = [mk("MatMul", ["x", "/enc/w1"], ["hid"], name="/enc/mm1"),
             mk("MatMul", ["hid", "/enc/w2"], ["y"], name="/enc/mm2")]
    graph = h.make_graph(nodes, "w", [h.make_tensor_value_info("x", T.FLOAT, [1, d])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 8])],
                         [nh.from_array(w1, "/enc/w1"), nh.from_array(w2, "/enc/w2")])
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 8
    return m, rng.standard_normal((n, 1, d)).astype(np.float32)


def test_weights_are_widened_when_activations_cannot_reach_the_floor(tmp_path):
    # qnn_htp: per-tensor MatMul weights (the profile's rule), 16-bit weights where 16-bit activations run
    m, x = outlier_weight_model()
    feeds = [{"x": s} for s in x]
    before = quantize(m, feeds, target="qnn_htp", min_sqnr=float("-inf"))
    assert ort_sqnr(before, m, x, tmp_path) < DEFAULT_MIN_SQNR_DB
    res = quantize(m, feeds, target="qnn_htp")
    sn = res.report["safety_net"]
    assert ort_sqnr(res, m, x, tmp_path) >= DEFAULT_MIN_SQNR_DB
    weights = [c for c in sn["changed"] if c["action"].startswith("weight")]
    assert [c["value"] for c in weights] == ["/enc/w1"] and weights[0]["action"] == "weight 16 bits"
    assert "1 weight at 16 bits ('/enc/w1'" in sn["summary"]
    q = onnx.load(str(tmp_path / "q.onnx"))
    stored = {i.name: i.data_type for i in q.graph.initializer}
    made = {o: n for n in q.graph.node for o in n.output}
    dq = made[next(n for n in q.graph.node if n.name == "/enc/mm1").input[1]]
    assert dq.op_type == "DequantizeLinear" and stored[dq.input[0]] in (T.INT16, T.UINT16)   # on its 16-bit grid
    enc = res.encodings["params"]["/enc/w1"]
    assert enc.bits == 16


def outlier_conv_model(c=16, n=16):
    """Conv(w1, b1) -> Relu -> Conv(w2): w1's output channel 0 is 100x the others (a per-tensor grid wipes
    the rest) and w2 ignores that channel."""
    rng = np.random.default_rng(5)
    w1 = (rng.standard_normal((c, 3, 3, 3)) * 0.3).astype(np.float32)
    w1[0] *= 100
    b1 = (rng.standard_normal(c) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((4, c, 1, 1)) * 0.3).astype(np.float32)
    w2[:, 0] = 0
    mk = h.make_node
    nodes = [mk("Conv", ["x", "/net/w1", "/net/b1"], ["c1"], pads=[1, 1, 1, 1], name="/net/conv1"),
             mk("Relu", ["c1"], ["r1"], name="/net/relu1"),
             mk("Conv", ["r1", "/net/w2"], ["y"], name="/net/conv2")]
    graph = h.make_graph(nodes, "conv", [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 8, 8])],
                         [h.make_tensor_value_info("y", T.FLOAT, [1, 4, 8, 8])],
                         [nh.from_array(w1, "/net/w1"), nh.from_array(b1, "/net/b1"), nh.from_array(w2, "/net/w2")])
    m = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)])
    m.ir_version = 8
    return m, rng.standard_normal((n, 1, 3, 8, 8)).astype(np.float32)


def test_a_per_tensor_weight_goes_per_channel_with_its_bias(tmp_path):
    # ort_cpu with --per-tensor: Conv may be per-channel there, so the net makes the outlier weight per-channel
    # and puts its int32 bias on s_in x s_w per channel (what QLinearConv reads)
    m, x = outlier_conv_model()
    feeds = [{"x": s} for s in x]
    before = quantize(m, feeds, per_channel=False, min_sqnr=float("-inf"))
    assert ort_sqnr(before, m, x, tmp_path) < DEFAULT_MIN_SQNR_DB
    res = quantize(m, feeds, per_channel=False)
    sn = res.report["safety_net"]
    assert ort_sqnr(res, m, x, tmp_path) >= DEFAULT_MIN_SQNR_DB, sn
    assert [(c["value"], c["action"]) for c in sn["changed"] if c["action"].startswith("weight")] == \
        [("/net/w1", "weight per-channel")]
    q = onnx.load(str(tmp_path / "q.onnx"))
    made = {o: n for n in q.graph.node for o in n.output}
    inits = {i.name: nh.to_array(i) for i in q.graph.initializer}
    conv = next(n for n in q.graph.node if n.name == "/net/conv1")
    wdq, bdq, xdq = made[conv.input[1]], made[conv.input[2]], made[conv.input[0]]
    s_w, s_b, s_in = inits[wdq.input[1]], inits[bdq.input[1]], inits[xdq.input[1]]
    assert s_w.shape == (16,) and np.allclose(s_b, s_in * s_w, rtol=1e-6)


@pytest.mark.parametrize("external", [False, True])
def test_weights_from_a_model_file_read_only_those_the_net_needs(tmp_path, monkeypatch, external):
    # the float originals come from the file (only the weights searched, external data included), the same
    # ones the caller's ModelProto gives: the written models are byte for byte the same
    from qcompiler.onnx_io import initializers
    m, x = outlier_weight_model()
    feeds = [{"x": s} for s in x]
    path = str(tmp_path / "float.onnx")
    saved = onnx.ModelProto()
    saved.CopyFrom(m)      # saving with external data rewrites the proto it is given
    onnx.save_model(saved, path, save_as_external_data=external, location="float.data", size_threshold=0)
    asked = []
    read = initializers.read_initializers

    def spy(p, names):
        names = list(names)
        asked.append(names)
        return read(p, names)
    monkeypatch.setattr(safety_net.weights, "read_initializers", spy)
    from_file = quantize(path, feeds, target="qnn_htp")
    assert asked == [["/enc/w1", "/enc/w2"]]
    from_proto = quantize(m, feeds, target="qnn_htp")
    assert from_file.report["safety_net"]["changed"] == from_proto.report["safety_net"]["changed"]
    assert [c["value"] for c in from_file.report["safety_net"]["changed"] if c["action"].startswith("weight")] == \
        ["/enc/w1"]
    from_file.save(str(tmp_path / "a.onnx"))
    from_proto.save(str(tmp_path / "b.onnx"))
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()
    assert ort_sqnr(from_file, m, x, tmp_path) >= DEFAULT_MIN_SQNR_DB
