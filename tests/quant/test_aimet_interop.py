"""AIMET encodings both ways: files in AIMET's exact layouts (aimet_onnx 2.42 `_encoding.py`, written here
from its documented format) load with the right axis and layout or are refused with one line; qcompiler's own
files round-trip bit-identically for every encoding kind."""
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qcompiler.onnx_io import model_to_proto
from qcompiler.quant.api import quantize
from qcompiler.quant.core.encoding import Encoding
from qcompiler.quant.interop.encodings_io import read_encodings, write_encodings

from ..helpers import make_model, run, sqnr_db, tinfo
from .hostile_common import assert_one_line, quantize_cli, sha


def _init(name, a):
    return numpy_helper.from_array(np.asarray(a, np.float32), name)


def _save(tmp_path, proto, feeds, name="m"):
    """The model and its calibration .npz (samples along axis 0, each with its batch dim) written to tmp_path."""
    mp, cp = tmp_path / f"{name}.onnx", tmp_path / f"{name}.npz"
    onnx.save(proto, str(mp))
    np.savez(cp, **{k: np.stack(v) for k, v in feeds.items()})
    return str(mp), str(cp)


def _v1(params=(), acts=()):
    return {"version": "1.0.0", "activation_encodings": list(acts), "param_encodings": list(params),
            "quantizer_args": {}, "excluded_layers": []}


def _write(tmp_path, doc, name="enc.json"):
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return str(p)


def _qdq_sqnr(res, float_proto, feeds):
    out_q = run(model_to_proto(res.model), feeds)[0]
    out_f = run(float_proto, feeds)[0]
    return sqnr_db(out_f, out_q)


def _sym_scales(w, axis, bits=8):
    red = tuple(i for i in range(w.ndim) if i != axis)
    return (np.abs(w).max(axis=red) / (2 ** (bits - 1) - 1)).astype(np.float32)


# --- item 1: the 1.0.0 per-channel axis comes from the op ------------------------------------------------------
def _matmul(w, rng):
    k, n = w.shape
    proto = make_model([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], [tinfo("x", [1, 4, k])],
                       [tinfo("y", [1, 4, n])], [_init("W", w)])
    feeds = {"x": [rng.normal(size=(1, 4, k)).astype(np.float32) for _ in range(8)]}
    return proto, feeds


@pytest.mark.parametrize("shape", [(8, 6), (8, 8)], ids=["issue_8x6", "square"])
def test_v1_matmul_per_channel_takes_axis_1(tmp_path, shape):
    """AIMET's 1.0.0 per-channel MatMul weight: one scale per output column (axis 1), no axis in the file. The
    columns differ by 30x in magnitude, so a scale along axis 0 (the old behaviour) would clip most of them."""
    rng = np.random.default_rng(0)
    w = (rng.normal(size=shape) * np.logspace(0, 1.5, shape[1])[None, :]).astype(np.float32)
    s = _sym_scales(w, 1)
    proto, feeds = _matmul(w, rng)
    mp, cp = _save(tmp_path, proto, feeds)
    enc = _write(tmp_path, _v1([{"name": "W", "enc_type": "PER_CHANNEL", "dtype": "INT", "bw": 8, "is_sym": True,
                                 "scale": s.tolist(), "offset": [-128] * shape[1]}]))
    res = quantize(mp, cp, load_encodings=enc)
    e = res.encodings["params"]["W"]
    assert e.axis == 1 and np.array_equal(e.scale, s) and e.frozen
    feed = {"x": feeds["x"][0]}
    assert _qdq_sqnr(res, proto, feed) > 30
    code, lines = quantize_cli(mp, cp, tmp_path / "q.onnx", "--load-encodings", enc)
    assert code == 0, lines


# --- item 2: 1.0.0 per-block scales are output channel first ---------------------------------------------------
def _block_scales_kn(w, bs, bits=4):
    k, n = w.shape
    return (np.abs(w.reshape(k // bs, bs, n)).max(axis=1) / (2 ** (bits - 1) - 1)).astype(np.float32)   # (K/bs, N)


def test_v1_matmul_per_block_read_and_written_output_channel_first(tmp_path):
    rng = np.random.default_rng(1)
    w = (rng.normal(size=(32, 6)) * np.array([1, 1, 1, 1, 1, 1]) * np.r_[np.ones(16), 8 * np.ones(16)][:, None])
    w = w.astype(np.float32)
    s = _block_scales_kn(w, 16)                       # rows differ: block 2 is 8x block 1
    proto, feeds = _matmul(w, rng)
    mp, cp = _save(tmp_path, proto, feeds)
    entry = {"name": "W", "enc_type": "PER_BLOCK", "dtype": "INT", "bw": 4, "is_sym": True, "block_size": 16,
             "scale": s.T.reshape(-1).tolist(), "offset": [-8] * s.size}          # AIMET: (N, K/bs) flattened
    enc = _write(tmp_path, _v1([entry]))
    res = quantize(mp, cp, load_encodings=enc, weight_bits=4, weight_block=16)
    e = res.encodings["params"]["W"]
    assert e.axis == 0 and e.block_size == 16 and np.array_equal(e.scale, s)
    assert _qdq_sqnr(res, proto, {"x": feeds["x"][0]}) > 12
    back = res.write_encodings(None, "1.0.0")
    assert {x["name"]: x for x in back["param_encodings"]}["W"]["scale"] == entry["scale"]
    # 2.0.0 keeps onnx's layout: y_scale (K/bs, N) with axis 0
    enc2 = _write(tmp_path, {"version": "2.0.0", "encodings": [{"name": "W", "output_dtype": "int4",
                                                                "y_scale": s.tolist(), "axis": 0, "block_size": 16}]},
                  "enc2.json")
    res2 = quantize(mp, cp, load_encodings=enc2, weight_bits=4, weight_block=16)
    assert np.array_equal(res2.encodings["params"]["W"].scale, s)


# --- item 6: both Conv per-block layouts ------------------------------------------------------------------------
def _conv(w, rng, bias=None, name="conv"):
    cout, cin = w.shape[:2]
    inits = [_init("W", w)] + ([_init("B", bias)] if bias is not None else [])
    proto = make_model([helper.make_node("Conv", ["x", "W"] + (["B"] if bias is not None else []), ["y"],
                                         pads=[1, 1, 1, 1], name=name)],
                       [tinfo("x", [1, cin, 5, 5])], [tinfo("y", [1, cout, 5, 5])], inits)
    feeds = {"x": [rng.normal(size=(1, cin, 5, 5)).astype(np.float32) for _ in range(8)]}
    return proto, feeds


def test_conv_per_block_reads_aimet_and_onnx_layouts(tmp_path):
    rng = np.random.default_rng(2)
    w = rng.normal(size=(4, 32, 3, 3)).astype(np.float32)
    proto, feeds = _conv(w, rng)
    mp, cp = _save(tmp_path, proto, feeds)
    blocks = np.abs(w.reshape(4, 2, 16, 3, 3))
    s_aimet = (blocks.max(axis=(2, 3, 4)) / 7).astype(np.float32)          # (Cout, Cin/bs): one per kernel window
    s_onnx = (blocks.max(axis=2) / 7).astype(np.float32)                   # (Cout, Cin/bs, kh, kw)
    for name, s in (("aimet", s_aimet), ("onnx", s_onnx)):
        enc = _write(tmp_path, _v1([{"name": "W", "enc_type": "PER_BLOCK", "dtype": "INT", "bw": 4, "is_sym": True,
                                     "block_size": 16, "scale": s.reshape(-1).tolist(),
                                     "offset": [-8] * s.size}]), f"{name}.json")
        res = quantize(mp, cp, load_encodings=enc, weight_bits=4, weight_block=16)
        e = res.encodings["params"]["W"]
        want = np.broadcast_to(s_aimet[:, :, None, None], (4, 2, 3, 3)) if name == "aimet" else s_onnx
        assert e.scale.shape == (4, 2, 3, 3) and np.array_equal(e.scale, want)
        dq = [n for n in res.model.graph.nodes if n.op_type == "DequantizeLinear" and n.inputs[0].name.startswith("W")]
        assert tuple(dq[0].inputs[1].const_value().shape) == (4, 2, 3, 3)         # what onnxruntime accepts
        assert _qdq_sqnr(res, proto, {"x": feeds["x"][0]}) > 12
        back = {x["name"]: x for x in res.write_encodings(None, "1.0.0")["param_encodings"]}["W"]
        assert back["scale"] == s.reshape(-1).tolist()      # AIMET's 8 scales when lossless, else all 72
        if name == "aimet":     # and AIMET's 2.0.0 shape (Cout, Cin/bs, 1, 1)
            v2 = {x["name"]: x for x in res.write_encodings(None, "2.0.0")["encodings"]}["W"]
            assert np.shape(v2["y_scale"]) == (4, 2, 1, 1) and v2["axis"] == 1
            enc2 = _write(tmp_path, {"version": "2.0.0", "encodings": [v2]}, "aimet2.json")
            res2 = quantize(mp, cp, load_encodings=enc2, weight_bits=4, weight_block=16)
            assert np.array_equal(res2.encodings["params"]["W"].scale, want)


# --- item 3: every unmatched entry reported by kind; int32 biases; data movement ---------------------------------
def _cnn(rng, bn_gamma=None):
    """x -> Conv(W, B) [-> BN] -> Relu -> Reshape -> MatMul(W2) -> y, plus a float Add constant."""
    nodes = [helper.make_node("Conv", ["x", "W"] + ([] if bn_gamma is not None else ["B"]), ["c"], pads=[1, 1, 1, 1],
                              name="/c1/Conv")]
    inits = [_init("W", rng.normal(0, 0.3, (4, 3, 3, 3)))]
    if bn_gamma is None:
        inits.append(_init("B", rng.normal(0, 0.1, (4,))))
        last = "c"
    else:
        nodes.append(helper.make_node("BatchNormalization", ["c", "g", "beta", "mean", "var"], ["bn"], epsilon=1e-12,
                                      name="/c1/bn"))
        inits += [_init("g", bn_gamma), _init("beta", np.zeros(4)), _init("mean", np.zeros(4)), _init("var", np.ones(4))]
        last = "bn"
    nodes += [helper.make_node("Relu", [last], ["r"], name="relu"),
              helper.make_node("Reshape", ["r", "shape"], ["flat"], name="reshape"),
              helper.make_node("MatMul", ["flat", "W2"], ["m"], name="mm"),
              helper.make_node("Add", ["m", "addc"], ["y"], name="add")]
    inits += [numpy_helper.from_array(np.array([1, 64], np.int64), "shape"), _init("W2", rng.normal(0, 0.2, (64, 5))),
              _init("addc", rng.normal(0, 1, (5,)))]
    proto = make_model(nodes, [tinfo("x", [1, 3, 4, 4])], [tinfo("y", [1, 5])], inits)
    feeds = {"x": [rng.normal(size=(1, 3, 4, 4)).astype(np.float32) for _ in range(8)]}
    return proto, feeds


def test_v2_with_int32_biases_and_entries_qcompiler_does_not_use(tmp_path):
    rng = np.random.default_rng(3)
    proto, feeds = _cnn(rng)
    mp, cp = _save(tmp_path, proto, feeds)
    doc = quantize(mp, cp).write_encodings(None, "2.0.0")
    names = {e["name"] for e in doc["encodings"]}
    assert "B" in names and {e["name"]: e for e in doc["encodings"]}["B"]["output_dtype"] == "int32"
    extra = [] if "flat" in names else [{"name": "flat", "output_dtype": "uint8", "y_scale": 0.02}]  # data movement
    doc["encodings"] += extra + [
        {"name": "addc", "output_dtype": "int8", "y_scale": 0.01},                       # a constant, no weight
        {"name": "/c9/Conv.bias", "output_dtype": "int32", "y_scale": [1e-4] * 4, "axis": 0},   # no such value
        {"name": "ghost", "output_dtype": "uint8", "y_scale": 0.1}]
    enc = _write(tmp_path, doc)
    res = quantize(mp, cp, load_encodings=enc)
    w = {x["value"]: x["problem"] for x in res.report["warnings"]}
    text = json.dumps(res.report["warnings"])
    assert "/c9/Conv.bias" in text and "ghost" in text and "no quantizable value" in text
    assert "addc" in text and "constant that is no quantized weight" in text
    assert "activation" not in w.get("/c9/Conv.bias, ghost", "activation-free")
    notes = " ".join(res.report["notes"])
    assert "bias entries not applied" in notes and "s_in * s_w" in notes
    if "flat" not in res.encodings["activations"]:        # a data-movement output qcompiler does not quantize
        assert "flat" in text and "does not quantize" in text
    # frozen entries are applied as written
    assert res.encodings["params"]["W"].frozen and res.encodings["activations"]["x"].frozen


def test_unfolded_weights_against_a_folded_model_are_refused(tmp_path):
    """Encodings computed on the Conv weights before BatchNorm was folded into them (AIMET's model not BN-folded):
    most channels are scaled up to 3x, far beyond the grid: one line, exit 2, naming the entry and the cause."""
    rng = np.random.default_rng(4)
    gamma = np.array([0.3, 1.0, 2.0, 3.0], np.float32)
    proto, feeds = _cnn(rng, bn_gamma=gamma)
    mp, cp = _save(tmp_path, proto, feeds)
    w = numpy_helper.to_array([i for i in proto.graph.initializer if i.name == "W"][0])
    s = _sym_scales(w, 0)
    enc = _write(tmp_path, _v1([{"name": "W", "enc_type": "PER_CHANNEL", "dtype": "INT", "bw": 8, "is_sym": True,
                                 "scale": s.tolist(), "offset": [-128] * 4}]))
    before = sha(enc)
    line = assert_one_line(quantize_cli(mp, cp, tmp_path / "q.onnx", "--load-encodings", enc), "enc.json", "'W'",
                           "does not cover", "BN-folded")
    assert "BatchNorm" in line and sha(enc) == before and not (tmp_path / "q.onnx").exists()


def test_slightly_different_weights_warn_loudly(tmp_path):
    rng = np.random.default_rng(5)
    gamma = np.array([0.5, 1.0, 1.2, 1.3], np.float32)
    proto, feeds = _cnn(rng, bn_gamma=gamma)
    mp, cp = _save(tmp_path, proto, feeds)
    w = numpy_helper.to_array([i for i in proto.graph.initializer if i.name == "W"][0])
    enc = _write(tmp_path, _v1([{"name": "W", "enc_type": "PER_CHANNEL", "dtype": "INT", "bw": 8, "is_sym": True,
                                 "scale": _sym_scales(w, 0).tolist(), "offset": [-128] * 4}]))
    res = quantize(mp, cp, load_encodings=enc)
    (wn,) = [x for x in res.report["warnings"] if x["value"] == "W"]
    assert "does not cover its weights" in wn["problem"] and "BN-folded" in wn["problem"]
    code, lines = quantize_cli(mp, cp, tmp_path / "q.onnx", "--load-encodings", enc)
    assert code == 0 and any("warning" in ln and "does not cover" in ln for ln in lines), lines


# --- item 4: created biases are named as AIMET names them, and either name matches --------------------------
def test_created_bias_named_like_aimet_and_matched_either_way(tmp_path):
    rng = np.random.default_rng(6)
    proto, feeds = _cnn(rng, bn_gamma=np.ones(4, np.float32))
    mp, cp = _save(tmp_path, proto, feeds)
    res = quantize(mp, cp)
    assert "/c1/Conv.bias" in res.encodings["params"]          # AIMET's batch_norm_fold: <conv name>.bias
    doc = res.write_encodings(None, "2.0.0")
    for e in doc["encodings"]:
        if e["name"] == "/c1/Conv.bias":
            e["name"] = "/c1/Conv_bias"                          # a file from an older qcompiler
    res2 = quantize(mp, cp, load_encodings=_write(tmp_path, doc))
    assert res2.report["warnings"] == []
    assert any("other convention" in n and "/c1/Conv_bias" in n for n in res2.report["notes"])


# --- item 5: the grid used is the grid written --------------------------------------------------------------
def test_reduced_range_weights_written_as_the_7_bit_grid_used(tmp_path):
    rng = np.random.default_rng(7)
    proto, feeds = _cnn(rng)
    mp, cp = _save(tmp_path, proto, feeds)
    res = quantize(mp, cp)                                      # ort_cpu: weights on 7 bits inside int8
    e = res.encodings["params"]["W"]
    assert e.bits == 8 and e.meta["range_bits"] == 7
    v1 = {x["name"]: x for x in res.write_encodings(None, "1.0.0")["param_encodings"]}["W"]
    assert v1["bw"] == 7 and set(v1["offset"]) == {-64} and v1["is_sym"]
    scale = np.asarray(v1["scale"])       # AIMET's grid [(0 + offset) * s, (2^bw - 1 + offset) * s]
    w = numpy_helper.to_array([i for i in proto.graph.initializer if i.name == "W"][0])
    assert np.all(np.abs(w).max(axis=(1, 2, 3)) <= 63.5 * scale)
    v2 = {x["name"]: x for x in res.write_encodings(None, "2.0.0")["encodings"]}["W"]
    assert v2["output_dtype"] == "int8"                          # onnx storage; scale as the model uses it
    p = _write(tmp_path, res.write_encodings(None, "1.0.0"))
    _, params = read_encodings(p)
    assert params["W"].bits == 8 and params["W"].meta["range_bits"] == 7 and params["W"].signed


# --- round trips: qcompiler -> file -> qcompiler, bit-identical -------------------------------------------------
def _every_kind(rng):
    """Conv (per-channel axis 0, bias) -> Relu -> ConvTranspose (axis 1) -> GAP -> Flatten -> Gemm transB=0
    (axis 1) -> MatMul (axis 1, K=5: a partial last block)."""
    nodes = [helper.make_node("Conv", ["x", "W1", "B1"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("ConvTranspose", ["r", "W2"], ["t"], strides=[2, 2], name="convt"),
             helper.make_node("GlobalAveragePool", ["t"], ["p"], name="gap"),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "W3", "B3"], ["g"], name="gemm"),
             helper.make_node("MatMul", ["g", "W4"], ["y"], name="mm")]
    inits = [_init("W1", rng.normal(0, 0.3, (8, 4, 3, 3))), _init("B1", rng.normal(0, 0.1, (8,))),
             _init("W2", rng.normal(0, 0.3, (8, 4, 2, 2))), _init("W3", rng.normal(0, 0.3, (4, 5))),
             _init("B3", rng.normal(0, 0.1, (5,))), _init("W4", rng.normal(0, 0.3, (5, 6)))]
    proto = make_model(nodes, [tinfo("x", [1, 4, 6, 6])], [tinfo("y", [1, 6])], inits)
    feeds = {"x": [rng.normal(size=(1, 4, 6, 6)).astype(np.float32) for _ in range(6)]}
    return proto, feeds


def _tensors(res):
    p = model_to_proto(res.model)
    return {i.name: (i.data_type, tuple(i.dims), numpy_helper.to_array(i).tobytes()) for i in p.graph.initializer}, \
        [(n.op_type, tuple(n.input), tuple(n.output), str(n.attribute)) for n in p.graph.node]


KINDS = {"per_channel_7bit": {}, "per_tensor": {"per_channel": False}, "full_8bit_target":
         {"target": {"base": "ort_cpu", "weight": {"bits": 8, "symmetric": True, "range_bits": 8}}},
         "int4_per_block": {"weight_bits": 4, "weight_block": 2}, "int16": {"weight_bits": 16, "act_bits": 16},
         "asymmetric_weights_v2": {"weight_symmetric": False}}


@pytest.mark.parametrize("version", ["1.0.0", "2.0.0"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_round_trip_is_bit_identical(tmp_path, kind, version):
    if kind == "asymmetric_weights_v2" and version == "1.0.0":
        pytest.skip("1.0.0 cannot say a grid is signed and asymmetric (is_sym is AIMET's signedness)")
    rng = np.random.default_rng(8)
    proto, feeds = _every_kind(rng)
    mp, cp = _save(tmp_path, proto, feeds)
    kw = KINDS[kind]
    first = quantize(mp, cp, **kw)
    path = str(tmp_path / "enc.json")
    first.write_encodings(path, version)
    doc = first.encodings_document(version)
    second = quantize(mp, cp, load_encodings=path, **kw)
    assert _tensors(second) == _tensors(first)
    assert second.write_encodings(None, version) == doc
    assert second.report["warnings"] == []
    out = run(model_to_proto(second.model), {"x": feeds["x"][0]})[0]
    assert np.all(np.isfinite(out))


@pytest.mark.parametrize("version", ["1.0.0", "2.0.0"])
def test_float_and_bias_entries_round_trip_through_the_file(tmp_path, version):
    acts = {"a16": Encoding(scale=np.float32(1), zero_point=np.int64(0), bits=16, dtype="float"),
            "a8": Encoding(scale=np.float32(0.02), zero_point=np.int64(3), bits=8)}
    bias = Encoding(scale=np.array([1e-4, 2e-4], np.float32), zero_point=np.zeros(2, np.int64), bits=32,
                    symmetric=True, signed=True, axis=0)
    narrow = Encoding(scale=np.array([0.1, 0.2], np.float32), zero_point=np.zeros(2, np.int64), bits=8,
                      symmetric=True, signed=True, axis=0, meta={"range_bits": 7})
    path = str(tmp_path / "e.json")
    doc = write_encodings(path, acts, {"b": bias, "w": narrow}, version=version)
    ra, rp = read_encodings(path, param_names=["b", "w"])
    assert ra["a16"].dtype == "float" and ra["a16"].bits == 16
    assert ("b" in rp) == (version == "2.0.0")       # 1.0.0 leaves int32 biases out, as AIMET's 1.0.0 export
    assert write_encodings(None, ra, rp, version=version) == doc


# --- refusals through the CLI: one line, exit 2 ----------------------------------------------------------------
def test_refusals_are_one_line(tmp_path):
    rng = np.random.default_rng(9)
    w = rng.normal(size=(32, 6)).astype(np.float32)
    proto, feeds = _matmul(w, rng)
    mp, cp = _save(tmp_path, proto, feeds)
    block = ("--weight-bits", "4", "--block-size", "16")
    cases = [
        (_v1([{"name": "W", "enc_type": "PER_CHANNEL", "dtype": "INT", "bw": 8, "is_sym": True, "scale": [0.1] * 5,
               "offset": [-128] * 5}]), (), "5 scales but the weight has 6 channels on axis 1"),
        (_v1([{"name": "W", "enc_type": "PER_BLOCK", "dtype": "INT", "bw": 4, "is_sym": True, "block_size": 16,
               "scale": [0.1] * 7, "offset": [-8] * 7}]), block, "do not fit block_size 16"),
        (_v1([{"name": "W", "enc_type": "PER_CHANNEL", "dtype": "INT", "bw": 8, "is_sym": True, "scale": [0.1] * 6,
               "offset": [-128] * 6, "zero_point_shift": [0.5] * 6}]), (), "zero_point_shift"),
        (_v1(acts=[{"name": "x", "enc_type": "PER_TENSOR", "dtype": "INT", "bw": 7, "is_sym": False, "scale": [0.1],
                    "offset": [-60]}]), (), "7-bit grid for an activation"),
        (_v1([{"name": "W", "enc_type": "PER_CHANNEL", "dtype": "INT", "bw": 8, "is_sym": True,
               "scale": (_sym_scales(w, 1) / 4).tolist(), "offset": [-128] * 6}]), (), "does not cover"),
    ]
    for i, (doc, extra, needle) in enumerate(cases):
        enc = _write(tmp_path, doc, f"bad{i}.json")
        assert_one_line(quantize_cli(mp, cp, tmp_path / "q.onnx", "--load-encodings", enc, *extra), f"bad{i}.json",
                        needle)
        assert not (tmp_path / "q.onnx").exists()


# --- what a file for AIMET needs, and what a file from AIMET needs no flag for -------------
def _attention(rng, d=8, heads=2, seq=4):
    """A self-attention block as torch exports it: q/k/v = x @ W + b; K and V go through Reshape/Transpose into
    the second input of a MatMul (a "dynamic weight")."""
    hd = d // heads
    nodes, inits = [], []
    for p in ("q", "k", "v"):
        nodes += [helper.make_node("MatMul", ["x", f"W{p}"], [f"{p}_mm"], name=f"/{p}/MatMul"),
                  helper.make_node("Add", [f"{p}_mm", f"b{p}"], [f"{p}_add"], name=f"/{p}/Add"),
                  helper.make_node("Reshape", [f"{p}_add", "heads"], [f"{p}_r"], name=f"/{p}/Reshape")]
        inits += [_init(f"W{p}", rng.normal(0, 0.4, (d, d))), _init(f"b{p}", rng.normal(0, 0.1, (d,)))]
    nodes += [helper.make_node("Transpose", ["q_r"], ["q_t"], perm=[0, 2, 1, 3], name="/q/Transpose"),
              helper.make_node("Transpose", ["k_r"], ["k_t"], perm=[0, 2, 3, 1], name="/k/Transpose"),
              helper.make_node("Transpose", ["v_r"], ["v_t"], perm=[0, 2, 1, 3], name="/v/Transpose"),
              helper.make_node("MatMul", ["q_t", "k_t"], ["att"], name="/att/MatMul"),
              helper.make_node("Softmax", ["att"], ["p"], axis=-1, name="/att/Softmax"),
              helper.make_node("MatMul", ["p", "v_t"], ["ctx"], name="/ctx/MatMul"),
              helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3], name="/ctx/Transpose"),
              helper.make_node("Reshape", ["ctx_t", "flat"], ["y"], name="/ctx/Reshape")]
    inits += [numpy_helper.from_array(np.array([1, seq, heads, hd], np.int64), "heads"),
              numpy_helper.from_array(np.array([1, seq, d], np.int64), "flat")]
    proto = make_model(nodes, [tinfo("x", [1, seq, d])], [tinfo("y", [1, seq, d])], inits)
    feeds = {"x": [rng.normal(size=(1, seq, d)).astype(np.float32) for _ in range(6)]}
    return proto, feeds


@pytest.mark.parametrize("act_bits", [8, 16])
def test_aimet_target_quantizes_dynamic_matmul_inputs_symmetric_as_aimet(tmp_path, act_bits):
    """`--target aimet` (AIMET's default_config_per_channel.json): the quantizer feeding a MatMul's second input
    through Reshape/Transpose (K, V) is symmetric, as AIMET's `_apply_param_symmetry_to_inputs` makes it; other
    activations stay asymmetric; data-movement outputs get no quantizer and no entry (AIMET's sim has none);
    weights use the full 8-bit range. ort_cpu keeps its asymmetric K/V."""
    rng = np.random.default_rng(10)
    proto, feeds = _attention(rng)
    mp, cp = _save(tmp_path, proto, feeds)
    res = quantize(mp, cp, target="aimet", act_bits=act_bits)
    acts = res.encodings["activations"]
    for name in ("k_add", "v_add"):
        e = acts[name]
        assert e.symmetric and e.signed and int(e.zero_point) == 0 and e.bits == act_bits, name
    assert not acts["q_add"].symmetric and not acts["x"].symmetric
    assert not {"q_r", "k_r", "v_r", "q_t", "k_t", "v_t", "ctx_t"} & set(acts)
    doc = res.write_encodings(None, "1.0.0")
    v1 = {e["name"]: e for e in doc["activation_encodings"]}
    assert v1["k_add"]["is_sym"] and v1["v_add"]["is_sym"] and not v1["q_add"]["is_sym"]
    assert v1["k_add"]["offset"] == [-(2 ** (act_bits - 1))]
    assert {e["bw"] for e in doc["param_encodings"]} == {8}                  # no 7-bit range on this target
    assert np.all(np.isfinite(run(model_to_proto(res.model), {"x": feeds["x"][0]})[0]))
    assert _qdq_sqnr(res, proto, {"x": feeds["x"][0]}) > 15
    ort = quantize(mp, cp, act_bits=act_bits).encodings["activations"]
    assert not ort["k_add"].symmetric


def test_file_bit_widths_and_blocks_choose_the_opset(tmp_path):
    """An int4 per-block file loads with `--load-encodings` alone (the opset is chosen after reading it, item 3);
    an int16 activation on trt (no 16-bit widening, so opset 13 otherwise) raises the opset to 21; a pinned
    opset the file's grids cannot live in is one line naming the file's role."""
    rng = np.random.default_rng(11)
    w = rng.normal(size=(32, 6)).astype(np.float32)
    s = _block_scales_kn(w, 16)
    proto, feeds = _matmul(w, rng)
    mp, cp = _save(tmp_path, proto, feeds)
    blocks = _write(tmp_path, _v1([{"name": "W", "enc_type": "PER_BLOCK", "dtype": "INT", "bw": 4, "is_sym": True,
                                    "block_size": 16, "scale": s.T.reshape(-1).tolist(), "offset": [-8] * s.size}]))
    code, lines = quantize_cli(mp, cp, tmp_path / "q.onnx", "--load-encodings", blocks)
    assert code == 0, lines
    q = onnx.load(str(tmp_path / "q.onnx"))
    assert [o.version for o in q.opset_import if o.domain in ("", "ai.onnx")] == [21]
    dq = [n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.input[0].startswith("W")]
    assert [a.i for a in dq[0].attribute if a.name == "block_size"] == [16]
    wide = _write(tmp_path, _v1(acts=[{"name": "x", "enc_type": "PER_TENSOR", "dtype": "INT", "bw": 16,
                                       "is_sym": False, "scale": [1e-4], "offset": [-32768]}]), "wide.json")
    res = quantize(mp, cp, target="trt", load_encodings=wide)
    assert res.model.opset == 21 and res.encodings["activations"]["x"].bits == 16
    assert_one_line(quantize_cli(mp, cp, tmp_path / "q2.onnx", "--load-encodings", blocks, "--opset", "13"),
                    "--opset 13", "--load-encodings", "21")


@pytest.mark.parametrize("version", ["1.0.0", "2.0.0"])
def test_float_entries_survive_a_second_round_trip(tmp_path, version):
    """A FLOAT entry (an activation and a weight AIMET keeps in float16) leaves its tensor float and is written
    back, so file -> qcompiler -> file -> qcompiler -> file keeps it (item 4)."""
    rng = np.random.default_rng(12)
    proto, feeds = _cnn(rng)
    mp, cp = _save(tmp_path, proto, feeds)
    doc = quantize(mp, cp).write_encodings(None, version)
    if version == "1.0.0":
        doc["activation_encodings"] = [e for e in doc["activation_encodings"] if e["name"] != "r"] + \
            [{"name": "r", "enc_type": "PER_TENSOR", "dtype": "FLOAT", "bw": 16}]
        doc["param_encodings"] = [e for e in doc["param_encodings"] if e["name"] != "W2"] + \
            [{"name": "W2", "enc_type": "PER_TENSOR", "dtype": "FLOAT", "bw": 16}]
    else:
        doc["encodings"] = [e for e in doc["encodings"] if e["name"] not in ("r", "W2")] + \
            [{"name": "r", "output_dtype": "float16"}, {"name": "W2", "output_dtype": "float16"}]
    path = _write(tmp_path, doc, "first.json")
    docs = []
    for i in range(2):
        res = quantize(mp, cp, load_encodings=path)
        assert res.encodings["activations"]["r"].dtype == "float"
        assert res.encodings["params"]["W2"].dtype == "float"
        assert not any(n.op_type == "DequantizeLinear" and n.inputs[0].name.startswith("W2")
                       for n in res.model.graph.nodes)
        path = str(tmp_path / f"round{i}.json")
        res.write_encodings(path, version)
        docs.append(json.loads(open(path).read()))
    assert docs[0] == docs[1]
    entries = docs[1]["encodings"] if version == "2.0.0" else \
        docs[1]["activation_encodings"] + docs[1]["param_encodings"]
    floats = {e["name"] for e in entries if e.get("dtype") == "FLOAT" or e.get("output_dtype") == "float16"}
    assert floats == {"r", "W2"}


def test_own_conv_per_block_scales_cover_the_kernel_window(tmp_path):
    """qcompiler's own per-block Conv grids: one scale per (output channel, block) over the whole kernel window
    (item 5), so the file holds AIMET's (Cout, Cin/bs, 1, 1) while the DQ keeps onnxruntime's (Cout, Cin/bs,
    kh, kw); the model runs in onnxruntime and the file round-trips."""
    rng = np.random.default_rng(13)
    w = rng.normal(size=(4, 32, 3, 3)).astype(np.float32)
    proto, feeds = _conv(w, rng)
    mp, cp = _save(tmp_path, proto, feeds)
    res = quantize(mp, cp, weight_bits=4, weight_block=16, target="aimet")
    e = res.encodings["params"]["W"]
    want = np.abs(w.reshape(4, 2, 16, 3, 3)).max(axis=(2, 3, 4)) / 7
    assert e.scale.shape == (4, 2, 3, 3) and np.allclose(e.scale, want[:, :, None, None], rtol=1e-6)
    v1 = {x["name"]: x for x in res.write_encodings(None, "1.0.0")["param_encodings"]}["W"]
    assert len(v1["scale"]) == 8 and v1["block_size"] == 16
    path = str(tmp_path / "e.json")
    res.write_encodings(path, "2.0.0")
    v2 = {x["name"]: x for x in json.loads(open(path).read())["encodings"]}["W"]
    assert np.shape(v2["y_scale"]) == (4, 2, 1, 1)
    assert _qdq_sqnr(res, proto, {"x": feeds["x"][0]}) > 12
    again = quantize(mp, cp, load_encodings=path, target="aimet")
    assert _tensors(again) == _tensors(res)
