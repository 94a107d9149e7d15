"""accuracy_level of 8-bit MatMulNBits on ort_cpu: level 4 even where level 0 is asked (the profile's
`slow_level0_bits`), unless `--optimize accuracy` or the level-4 check on calibration data says otherwise."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from qcompiler.onnx_io import model_to_proto
from qcompiler.quant import quantize
from tests.quant.decoder_models import decoder
from tests.quant.test_weight_only import logits_sqnr, ort_rtn, run, with_massive_activation

ort = pytest.importorskip("onnxruntime")


def levels_by_bits(model) -> dict:
    """{bits: sorted accuracy_levels} of the MatMulNBits nodes."""
    out: dict = {}
    for n in model.graph.node:
        if n.op_type == "MatMulNBits":
            a = {x.name: onnx.helper.get_attribute_value(x) for x in n.attribute}
            out.setdefault(a["bits"], set()).add(a.get("accuracy_level", 0))
    return {b: sorted(v) for b, v in out.items()}


def with_level(model, bits, level):
    """A copy of `model` whose `bits`-wide MatMulNBits run at `level`."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for n in m.graph.node:
        if n.op_type == "MatMulNBits" and any(a.name == "bits" and a.i == bits for a in n.attribute):
            for a in [a for a in n.attribute if a.name == "accuracy_level"]:
                n.attribute.remove(a)
            if level:
                n.attribute.append(onnx.helper.make_attribute("accuracy_level", level))
    return m


def ort_rtn_sqnr(model, feeds, ref) -> float:
    """Logits SQNR of onnxruntime's own int4 block-32 RTN (the head left float) on the same model."""
    return logits_sqnr(ref, run(ort_rtn(model), feeds))


def test_eight_bit_head_runs_level4_when_level0_is_asked():
    model, feeds = decoder(seed=4)
    ref = run(model, feeds)
    res = quantize(model, None, weight_only=True, weight_bits=4, accuracy_level=0, progress=False)
    q = model_to_proto(res.model)
    # the 4-bit MatMuls keep the level asked for, the 8-bit head (the ends' default under 4-bit weights) gets 4
    assert levels_by_bits(q) == {4: [0], 8: [4]}
    notes = res.report["weight_only"]["layers"]["embed.weight"]["notes"]
    assert any("no fast level-0 kernel" in n for n in notes), notes
    ours = logits_sqnr(ref, run(q, feeds))
    at_level0 = logits_sqnr(ref, run(with_level(q, 8, 0), feeds))
    theirs = ort_rtn_sqnr(model, feeds, ref)
    assert ours >= at_level0 - 0.3 and ours >= theirs - 0.1, (ours, at_level0, theirs)


@pytest.mark.parametrize("level", [None, 0])
def test_optimize_accuracy_runs_level0_everywhere(level):
    model, feeds = decoder(seed=4)
    res = quantize(model, None, weight_only=True, weight_bits=4, accuracy_level=level, optimize="accuracy",
                   progress=False)
    q = model_to_proto(res.model)
    assert levels_by_bits(q) == {4: [0], 8: [0]}
    ref = run(model, feeds)
    assert logits_sqnr(ref, run(q, feeds)) >= ort_rtn_sqnr(model, feeds, ref) - 0.1


def test_measured_head_keeps_level0_where_int8_activations_would_cost_too_much():
    model, feeds = decoder(seed=5)
    # a "massive activation" entering the head: one channel of the final norm 3000x the rest, which the tied
    # table ignores (its column 3 is 0); int8 activations per block then round the block's other channels to 0
    with_massive_activation(model, "norm.weight", columns=("embed.weight",))
    ref = run(model, feeds)
    res = quantize(model, feeds, weight_only=True, weight_bits=4, accuracy_level=0, progress=False)
    q = model_to_proto(res.model)
    assert levels_by_bits(q) == {4: [0], 8: [0]}
    notes = res.report["weight_only"]["layers"]["embed.weight"]["notes"]
    assert any(n.startswith("accuracy_level 0: int8 activations would give") for n in notes), notes
    ours = logits_sqnr(ref, run(q, feeds))
    assert ours >= logits_sqnr(ref, run(with_level(q, 8, 4), feeds)) + 3.0
    assert ours >= ort_rtn_sqnr(model, feeds, ref) - 0.1


def test_profile_slow_level0_bits_is_checked_and_read():
    from qcompiler.errors import ConfigError
    from qcompiler.quant.targets.profiles import get_profile
    assert get_profile("ort_cpu").weight_only.slow_level0_bits == (8,)
    form = {"matmul": "MatMulNBits", "gather": "GatherBlockQuantized", "bits": [4, 8], "accuracy_level": 0}
    assert get_profile({"weight_only": dict(form)}).weight_only.slow_level0_bits == ()
    with pytest.raises(ConfigError, match="slow_level0_bits"):
        get_profile({"weight_only": dict(form, slow_level0_bits=[16])})
    # a profile whose 8-bit kernel is fast at level 0: the head keeps the level asked for
    model, _ = decoder(seed=4)
    res = quantize(model, None, target={"weight_only": dict(form)}, weight_only=True, weight_bits=4,
                   progress=False)
    assert levels_by_bits(model_to_proto(res.model)) == {4: [0], 8: [0]}
