"""The `w8a8` config preset (qcompiler/quant/settings/presets/w8a8.yaml) and the config key it rests on,
`input_quantized: true` (placement/input_quantizers.py): SmoothQuant's W8A8, int8 MatMul/Gemm inputs and
weights with every other value float; through data movement the quantizer sits at the op computing the values;
a structural float (a rule keeping the producer float) is not undone; the model runs in onnxruntime."""
import os

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from qcompiler.errors import ConfigError
from qcompiler.quant import quantize
from qcompiler.quant.settings.config import load_config, parse_config
from qcompiler.quant.settings.presets import PRESETS_DIR, preset_path, presets
from tests.helpers import make_model, run, tinfo

F = np.float32
K, T = 8, 6


def _block(rng):
    """x -> Mul(g) -> h; h -> fc1 -> +b -> Relu -> fc2 -> +h (residual) -> out;
    h -> q -> Transpose -> MatMul(h, q^T) -> Softmax -> MatMul(., h) -> att."""
    w = lambda *s: numpy_helper.from_array((rng.normal(size=s) / np.sqrt(s[0])).astype(F), f"w{len(s)}_{rng.integers(1e9)}")
    w1, w2, wq = w(K, 2 * K), w(2 * K, K), w(K, K)
    inits = [numpy_helper.from_array(rng.uniform(0.5, 2, K).astype(F), "g"),
             numpy_helper.from_array(rng.normal(size=2 * K).astype(F), "b1"), w1, w2, wq]
    nodes = [helper.make_node("Mul", ["x", "g"], ["h"], name="pre"),
             helper.make_node("MatMul", ["h", w1.name], ["f1"], name="fc1"),
             helper.make_node("Add", ["f1", "b1"], ["f1b"], name="fc1_bias"),
             helper.make_node("Relu", ["f1b"], ["r"], name="act"),
             helper.make_node("MatMul", ["r", w2.name], ["f2"], name="fc2"),
             helper.make_node("Add", ["f2", "h"], ["out"], name="residual"),
             helper.make_node("MatMul", ["h", wq.name], ["q"], name="q"),
             helper.make_node("Transpose", ["q"], ["qt"], name="qt", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["h", "qt"], ["s"], name="bmm1"),
             helper.make_node("Softmax", ["s"], ["p"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["p", "h"], ["att"], name="bmm2")]
    return make_model(nodes, [tinfo("x", [2, T, K])], [tinfo("out", [2, T, K]), tinfo("att", [2, T, K])], inits)


def _calib(rng, n=8):
    return [{"x": rng.normal(size=(2, T, K)).astype(F)} for _ in range(n)]


def _dq_inputs(proto):
    """{MatMul name: [how each input arrives: 'uint8'/'int8'/... through a DQ (data movement looked through) or
    'float']}"""
    g = proto.graph
    prod = {o: n for n in g.node for o in n.output}
    consts = {i.name: i for i in g.initializer}
    out = {}
    for n in g.node:
        if n.op_type != "MatMul":
            continue
        ways = []
        for name in n.input:
            p = prod.get(name)
            while p is not None and p.op_type in ("Transpose", "Reshape"):
                p = prod.get(p.input[0])
            if p is None or p.op_type != "DequantizeLinear":
                ways.append("float")
                continue
            src = p.input[0]
            t = consts[src].data_type if src in consts else None
            if t is None:   # an activation: its Q's zero point says the type
                t = consts[prod[src].input[2]].data_type
            ways.append(onnx.helper.tensor_dtype_to_np_dtype(t).name)
        out[n.name] = ways
    return out


def test_w8a8_quantizes_matmul_inputs_only():
    rng = np.random.default_rng(0)
    proto = _block(rng)
    r = quantize(proto, _calib(rng), config="w8a8")
    assert r.report["target"] == "ort_cpu+custom"   # the preset's profile (nothing widened), not the API default
    acts = set(r.report["quantized_activations"])
    # h (read by fc1, q and both attention matmuls), the Relu output (fc2), q (bmm1, through the Transpose,
    # tied to it) and the Softmax output (bmm2); nothing else
    assert acts == {"h", "r", "q", "qt", "p"}
    ways = _dq_inputs(r.model if isinstance(r.model, onnx.ModelProto) else _proto(r.model))
    assert ways == {"fc1": ["uint8", "int8"], "fc2": ["uint8", "int8"], "q": ["uint8", "int8"],
                    "bmm1": ["uint8", "uint8"], "bmm2": ["uint8", "uint8"]}
    feed = _calib(rng, 1)[0]
    got = run(_proto(r.model), feed)
    want = run(proto, feed)
    for a, b in zip(got, want):
        assert np.abs(a - b).max() < 0.1 * np.abs(b).max()


def _proto(model):
    from qcompiler.onnx_io import model_to_proto
    return model if isinstance(model, onnx.ModelProto) else model_to_proto(model)


def test_input_quantized_does_not_undo_a_rule_keeping_the_producer_float(tmp_path):
    rng = np.random.default_rng(1)
    proto = _block(rng)
    cfg = tmp_path / "w8a8_act_float.yaml"   # the preset plus one exception, as a user would write it
    cfg.write_text(open(preset_path("w8a8")).read() + "  - match: {name: act}\n    keep_float: true\n")
    r = quantize(proto, _calib(rng), config=str(cfg))
    assert "r" not in r.report["quantized_activations"]
    assert {"h", "p"} <= set(r.report["quantized_activations"])


def test_preset_names_and_config_keys():
    assert "w8a8" in presets()
    assert preset_path("w8a8") == os.path.join(PRESETS_DIR, "w8a8.yaml")
    assert preset_path("no-such-preset") == "no-such-preset"
    cfg = load_config("w8a8")
    assert cfg.target == {"base": "ort_cpu", "wide_activation_bits": 8}
    assert not cfg.model_input_quantized
    mm = type("N", (), {"op_type": "MatMul", "name": "m"})()
    add = type("N", (), {"op_type": "Add", "name": "a"})()
    assert cfg.settings_for(mm).input_quantized and not cfg.settings_for(mm).output_quantized
    assert not cfg.settings_for(add).input_quantized
    with pytest.raises(ConfigError, match=r"^c\.yaml: target: expected a target name or a profile mapping"):
        parse_config({"target": 3}, "c.yaml")
    with pytest.raises(ConfigError, match="input_quantized: expected true/false"):
        parse_config({"rules": [{"match": {"op_type": "MatMul"}, "input_quantized": "yes"}]}, "c.yaml")


def test_a_file_named_like_a_preset_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "w8a8").write_text("activations: {bits: 16}\n")
    assert preset_path("w8a8") == "w8a8"
    assert load_config("w8a8").defaults.act_bits == 16


def test_smoothquant_under_w8a8_puts_a_mul_before_the_matmuls_when_the_residual_reads_float():
    """Post-LN BERT: the LayerNorm output feeds Q/K/V and the residual Add. The preset leaves it float for the
    residual, so 1/s goes into a Mul before the MatMuls (the residual reads it exactly), not into gamma/beta
    with a Mul restoring it; without a config the fold stays."""
    from tests.quant.test_smoothquant import _data, _qkv
    rng = np.random.default_rng(2)
    proto = _qkv(rng, residual=True)
    calib = _data(rng, proto)
    placed = {}
    for cfg in ("w8a8", None):
        r = quantize(proto, calib, config=cfg, recipe=["smoothquant"], smoothquant_alpha=0.5)
        (st,) = [res.stats for p, res in r.passes if p.name == "smoothquant"]
        placed[cfg] = set(st["folds"].values())
    assert placed == {"w8a8": {"mul"}, None: {"fold+restore"}}


@pytest.mark.slow
def test_minilm_w8a8_smoothquant_meets_the_issue_15_target(tmp_path):
    """minilm_l6 W8A8 with SmoothQuant, mean cosine >= 0.995 (measured 0.9964), every one of its 48
    MatMuls (36 linear, 12 attention) reading int8 inputs, as a CLI user runs it."""
    import json
    import subprocess
    import sys
    from tests.corpus import CORPUS
    folder = os.path.join(CORPUS, "minilm_l6")
    if not os.path.isfile(os.path.join(folder, "model.onnx")):
        pytest.skip("corpus not present")
    out = str(tmp_path / "q.onnx")
    r = subprocess.run([sys.executable, "-m", "qcompiler", "quantize", os.path.join(folder, "model.onnx"), "--calib",
                        os.path.join(folder, "calib.npz"), "-o", out, "--config", "w8a8", "--recipe", "smoothquant",
                        "--allow-low-sqnr", "-q"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    ways = _dq_inputs(onnx.load(out))
    assert len(ways) == 48 and all(w in ("uint8", "int8") for ins in ways.values() for w in ins), ways
    ev = subprocess.run([sys.executable, os.path.join(folder, "eval.py"), out], capture_output=True, text=True)
    assert json.loads(ev.stdout.strip().splitlines()[-1])["value"] >= 0.995, ev.stdout
