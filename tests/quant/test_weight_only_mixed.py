"""Weight-only with `--max-drop` (pass weight-mixed-precision: each weight at 4 bits, 8 bits or float by measured
output error on the calibration samples, the head included) and per-channel weight-only grids (`--per-channel`
without `--block-size`: one block over each weight's reduction axis). The outputs run in onnxruntime."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest

from qcompiler.onnx_io import model_to_proto
from qcompiler.passes.quantize.mixed_precision.search import relative_error
from qcompiler.quant import quantize
from tests.quant.decoder_models import decoder
from tests.quant.test_weight_only import logits_sqnr, op_count, run


def _relative_error(ref, got) -> float:
    return relative_error([{"logits": r} for r in ref], [{"logits": g} for g in got])


@pytest.fixture(scope="module")
def dec():
    return decoder(seed=1, hidden=128, inter=256, samples=24, head="untied")


@pytest.mark.parametrize("budget", [0.05, 0.10])
def test_max_drop_mixes_4_and_8_bits_within_the_budget(dec, budget):
    model, feeds = dec
    calib = feeds[:16]
    plain = quantize(model, calib, weight_only=True, weight_bits=4, progress=False)
    res = quantize(model, calib, weight_only=True, weight_bits=4, max_drop=budget, accuracy_level=0,
                   progress=False)
    mp = res.report["mixed_precision"]
    chosen = [l["chosen"] for l in mp["layers"].values()]
    assert len(chosen) == 16 and {"W4", "W8"} <= set(chosen), chosen
    assert mp["drop"] <= budget and mp["held_out_drop"] <= budget
    # the model as written, in onnxruntime, on the calibration samples: within the budget (measured 4.7 / 8.7 %)
    err = _relative_error(run(model, calib), run(model_to_proto(res.model), calib))
    assert err <= budget, err
    # cheaper than all-8-bit, dearer than the plain 4-bit plan (which breaks the budget)
    wo, wo_plain = res.report["weight_only"], plain.report["weight_only"]
    assert wo_plain["stored_bytes"] < wo["stored_bytes"] < 0.3 * wo["float_bytes_of_quantized"]
    assert _relative_error(run(model, calib), run(model_to_proto(plain.model), calib)) > budget
    bits = {n.name: n.attr("bits") for n in res.model.graph.nodes if n.op_type == "MatMulNBits"}
    assert sorted(bits.values()) == sorted(int(c[1:]) for c, l in zip(chosen, mp["layers"].values())
                                           if l["op"] != "gather")


def test_max_drop_keeps_float_what_no_width_fits_and_says_why(dec):
    model, feeds = dec
    res = quantize(model, feeds[:16], weight_only=True, weight_bits=4, max_drop=0.004, progress=False)
    mp = res.report["mixed_precision"]
    floats = [n for n, l in mp["layers"].items() if l["chosen"] == "float"]
    assert floats and all("--max-drop: kept float" in res.report["weight_only"]["left_float"][n] for n in floats)
    assert mp["drop"] <= 0.004
    assert _relative_error(run(model, feeds[:16]), run(model_to_proto(res.model), feeds[:16])) <= 0.004 * 1.25


def test_max_drop_with_a_user_metric(dec):
    model, feeds = dec

    def top1(outputs, reference):   # agreement of the arg-max token with float
        return float(np.mean([np.mean(o["logits"].argmax(-1) == r["logits"].argmax(-1))
                              for o, r in zip(outputs, reference)]))
    res = quantize(model, feeds[:16], weight_only=True, weight_bits=4, max_drop=0.02, metric=top1, progress=False)
    mp = res.report["mixed_precision"]
    assert mp["metric"] == "top1" and mp["drop"] <= 0.02
    got = run(model_to_proto(res.model), feeds[:16])
    ref = run(model, feeds[:16])
    assert 1 - top1([{"logits": g} for g in got], [{"logits": r} for r in ref]) <= 0.05


def test_cli_max_drop_and_what_weight_only_refuses(tmp_path):
    model, feeds = decoder(seed=6)
    p, calib = tmp_path / "m.onnx", tmp_path / "c.npz"
    onnx.save(model, p)
    np.savez(calib, input_ids=np.concatenate([f["input_ids"] for f in feeds]))
    out = tmp_path / "q.onnx"
    base = [sys.executable, "-m", "qcompiler", "quantize", str(p), "-o", str(out), "--weight-only",
            "--weight-bits", "4"]
    r = subprocess.run(base + ["--calib", str(calib), "--max-drop", "5%", "--report", str(tmp_path / "r.json")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "mixed precision: drop" in r.stdout and "W4" in r.stdout
    assert json.loads((tmp_path / "r.json").read_text())["mixed_precision"]["drop"] <= 0.05
    for extra, says in ((["--max-drop", "5%"], "give --calib"),
                        (["--recipe", "seq-mse"], "use --recipe gptq"),
                        (["--recipe", "smoothquant"], "use --recipe awq"),
                        (["--per-tensor"], "--per-tensor has no weight-only form")):
        out.unlink(missing_ok=True)
        r = subprocess.run(base + extra, capture_output=True, text=True)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and says in r.stderr, (extra, r.stderr)
        assert not out.exists()


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("target", ["ort_cpu", "trt"])
def test_per_channel_weight_only_is_one_block_per_row(bits, target):
    """hidden 96: K is not a power of two, so MatMulNBits' block is the next one up (128, the tail padded)."""
    model, feeds = decoder(seed=3, hidden=96, inter=192, head="untied")
    ref = run(model, feeds)
    res = quantize(model, None, weight_only=True, weight_bits=bits, per_channel=True, target=target, progress=False)
    q = model_to_proto(res.model)
    layers = res.report["weight_only"]["layers"]
    assert all(l.get("per_channel") for l in layers.values()), layers
    if target == "ort_cpu":
        nodes = [n for n in q.graph.node if n.op_type == "MatMulNBits"]
        attrs = [{a.name: a.i for a in n.attribute} for n in nodes]
        assert len(nodes) == 15 and all(a["block_size"] >= a["K"] and a["K"] > a["block_size"] // 2 for a in attrs)
    else:
        dqs = [n for n in q.graph.node if n.op_type == "DequantizeLinear"]
        assert len(dqs) == 15 and all("block_size" not in {a.name for a in n.attribute} for n in dqs)
    db = logits_sqnr(ref, run(q, feeds))
    # measured: 4 bits 11.1 (ort_cpu) / 8.7 dB (trt, symmetric); 8 bits 31.1 / 30.3 dB
    assert db > ({4: 7.5, 8: 28.0}[bits]), db
    if bits == 4:     # blocks of 32 beat one block per row at 4 bits
        blocked = quantize(model, None, weight_only=True, weight_bits=4, target=target, progress=False)
        assert logits_sqnr(ref, run(model_to_proto(blocked.model), feeds)) > db
        assert op_count(model_to_proto(blocked.model), "MatMul") == op_count(q, "MatMul")


def test_models_too_large_to_measure_say_so(monkeypatch):
    """The measures run one in-memory model: above its size --max-drop is one line, the head keeps its rule."""
    from qcompiler.errors import ConfigError
    from qcompiler.passes.quantize import weight_mixed_precision
    model, feeds = decoder(seed=1)
    monkeypatch.setattr(weight_mixed_precision, "ONE_PROTO_MAX_BYTES", 1000)
    with pytest.raises(ConfigError, match="in-memory copy of the model"):
        quantize(model, feeds, weight_only=True, weight_bits=4, max_drop=0.05, progress=False)
    res = quantize(model, feeds, weight_only=True, weight_bits=4, progress=False)
    assert any("not measured" in n for n in res.report["notes"])
    assert res.report["weight_only"]["layers"]["embed.weight"]["bits"] == 8
