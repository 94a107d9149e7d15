"""Per-block weights: opset-21 DequantizeLinear `block_size` along the reduction axis (MatMul B [K, N]: axis 0,
blocks along K), int4 and int8, from the API, the config (`weights: {bits: 4, per_block: 32}`) and the CLI
(`--weight-bits 4 --block-size 32`); AIMET encodings 1.0.0 PER_BLOCK and 2.0.0 block_size. onnxruntime 1.31 runs
blocked DequantizeLinear for int4/uint4/int8/uint8 (checked by these tests)."""
from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from qcompiler import model_to_proto
from qcompiler.quant.api import quantize
from qcompiler.quant.settings.config import parse_config
from tests.helpers import make_model, run, sqnr_db, tinfo

K, N, BLOCK = 96, 16, 32
W4_BLOCK_FLOOR_DB = 16.0     # W4 per-block + A8 on a Gaussian weight (measured 18.6 dB)
W8_BLOCK_FLOOR_DB = 30.0


def _matmul_model(w):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    return make_model(nodes, [tinfo("x", [4, K])], [tinfo("y", [4, N])], [numpy_helper.from_array(w, "w")])


def _weight(outlier_rows=False, seed=0):
    w = np.random.default_rng(seed).normal(0, 0.1, (K, N)).astype(np.float32)
    if outlier_rows:
        w[:2] *= 40.0          # two input rows (one block) 40x larger: they set every column's per-channel scale
    return w


def _feeds(n, seed=1):
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (4, K)).astype(np.float32)} for _ in range(n)]


def _sqnr(proto, res, feeds, opt_level=None):
    q = model_to_proto(res.model)
    onnx.checker.check_model(q)
    return min(sqnr_db(run(proto, f)[0], run(q, f, opt_level)[0]) for f in feeds), q


def _weight_dq(q):
    return next(n for n in q.graph.node if n.op_type == "DequantizeLinear" and n.input[0].startswith("w_quantized"))


@pytest.mark.parametrize("bits, floor, target", [(4, W4_BLOCK_FLOOR_DB, "ort_cpu"), (8, W8_BLOCK_FLOOR_DB, "qnn_htp")])
def test_blocked_matmul_runs_in_ort(bits, floor, target):
    proto = _matmul_model(_weight())
    res = quantize(proto, _feeds(16), weight_bits=bits, weight_block=BLOCK, target=target)
    # NOTE: ORT's QLinearMatMul fusion takes int8 blocked weights and then fails at run time: the int8 model
    # (for qnn_htp) runs here without ORT's extended fusions
    basic = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if bits == 8 else None
    got, q = _sqnr(proto, res, _feeds(16), basic)
    assert got >= floor, f"W{bits} per-block SQNR {got:.1f} dB < {floor}"
    assert q.opset_import[0].version >= 21
    dq = _weight_dq(q)
    attrs = {a.name: a.i for a in dq.attribute}
    assert attrs == {"axis": 0, "block_size": BLOCK}
    scale = next(i for i in q.graph.initializer if i.name == dq.input[1])
    assert list(scale.dims) == [K // BLOCK, N]
    wq = next(i for i in q.graph.initializer if i.name == dq.input[0])
    assert wq.data_type == (onnx.TensorProto.INT4 if bits == 4 else onnx.TensorProto.INT8)
    enc = res.encodings["params"]["w"]
    assert enc.block_size == BLOCK and enc.axis == 0 and enc.bits == bits
    assert res.report["quantized_params"]["w"]["block_size"] == BLOCK


def test_int8_per_block_falls_back_on_ort_cpu():
    """ORT 1.31 fuses int8 blocked DQ->MatMul into QLinearMatMul, which then fails at run time: per-channel."""
    proto = _matmul_model(_weight())
    res = quantize(proto, _feeds(8), weight_bits=8, weight_block=BLOCK)
    got, q = _sqnr(proto, res, _feeds(8))
    assert got >= W8_BLOCK_FLOOR_DB
    enc = res.encodings["params"]["w"]
    assert enc.block_size is None and enc.axis == 1
    assert "per-block 8-bit weights not supported" in res.report["layers"]["mm"]["input1"]


def test_w4_per_block_beats_per_channel_on_outlier_rows():
    proto = _matmul_model(_weight(outlier_rows=True))
    feeds = _feeds(16)
    per_channel, _ = _sqnr(proto, quantize(proto, feeds, weight_bits=4), feeds)
    per_block, _ = _sqnr(proto, quantize(proto, feeds, weight_bits=4, weight_block=BLOCK), feeds)
    assert per_block >= per_channel + 3.0, f"per-block {per_block:.1f} dB vs per-channel {per_channel:.1f} dB"


def test_partial_last_block_and_config_rule():
    w = np.random.default_rng(2).normal(0, 0.1, (K, N)).astype(np.float32)
    proto = _matmul_model(w)
    cfg = parse_config({"rules": [{"match": {"op_type": "MatMul"}, "weights": {"bits": 4, "per_block": 40}}]})
    res = quantize(proto, _feeds(16), config=cfg)
    got, q = _sqnr(proto, res, _feeds(16))
    assert got >= W4_BLOCK_FLOOR_DB
    scale = next(i for i in q.graph.initializer if i.name == _weight_dq(q).input[1])
    assert list(scale.dims) == [3, N]                     # ceil(96 / 40): the last block holds 16 rows


def test_block_encodings_files(tmp_path):
    proto = _matmul_model(_weight())
    res = quantize(proto, _feeds(8), weight_bits=4, weight_block=BLOCK)
    res.write_encodings(str(tmp_path / "e1.json"), "1.0.0")
    v1 = res.encodings_document("1.0.0")
    (e,) = [p for p in v1["param_encodings"] if p["name"] == "w"]
    assert e["enc_type"] == "PER_BLOCK" and e["block_size"] == BLOCK and e["bw"] == 4
    assert len(e["scale"]) == (K // BLOCK) * N
    v2 = json.loads((tmp_path / "e1.json").read_text())
    assert v2 == v1
    res.write_encodings(str(tmp_path / "e2.json"), "2.0.0")
    v2 = json.loads((tmp_path / "e2.json").read_text())
    (e,) = [p for p in v2["encodings"] if p["name"] == "w"]
    assert e["block_size"] == BLOCK and e["axis"] == 0 and e["output_dtype"] == "int4"
    assert np.shape(e["y_scale"]) == (K // BLOCK, N)


def test_cli_block_size(tmp_path):
    from click.testing import CliRunner
    from qcompiler.cli import main
    model = tmp_path / "m.onnx"
    onnx.save(_matmul_model(_weight()), str(model))
    np.savez(tmp_path / "c.npz", x=np.random.default_rng(0).normal(0, 1, (8, 4, K)).astype(np.float32))
    out = tmp_path / "q.onnx"
    r = CliRunner().invoke(main, ["quantize", str(model), "--calib", str(tmp_path / "c.npz"), "-o", str(out),
                                  "--weight-bits", "4", "--block-size", str(BLOCK)])
    assert r.exit_code == 0, r.output
    q = onnx.load(str(out))
    assert {a.name: a.i for a in _weight_dq(q).attribute}["block_size"] == BLOCK
    run(q, _feeds(1)[0])


@pytest.mark.parametrize("bad", [0, -4, 2.5])
def test_block_size_must_be_positive(bad):
    from qcompiler.errors import ConfigError
    with pytest.raises(ConfigError, match="must be a positive number of elements"):
        quantize(_matmul_model(_weight()), _feeds(2), weight_block=bad)
