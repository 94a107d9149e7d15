"""The head and embedding widths measured on calibration data (pass measure-head-bits): the head goes to
`--weight-bits` only where that costs under HEAD_COST_DB of output SQNR, measured, and the report says why."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from qcompiler.onnx_io import model_to_proto
from qcompiler.passes.quantize.head_bits import HEAD_COST_DB
from qcompiler.quant import quantize
from tests.quant.decoder_models import decoder
from tests.quant.test_weight_only import logits_sqnr, run


def _exact_4bit_head(model):
    """lm_head [H, V] replaced by values a 4-bit asymmetric grid per block of 32 along H holds exactly."""
    for init in model.graph.initializer:
        if init.name == "lm_head.weight":
            h, v = init.dims
            q = np.random.default_rng(0).integers(0, 16, (h, v))
            q[0::32], q[1::32] = 0, 15                      # every block spans the whole grid
            init.CopyFrom(onnx.numpy_helper.from_array(((q - 8) * 0.05).astype(np.float32), init.name))
    return model


def _nbits(res) -> dict:
    return {n.name: n.attr("bits") for n in res.model.graph.nodes if n.op_type == "MatMulNBits"}


def test_a_head_4_bits_cannot_hurt_goes_to_4_bits_measured():
    model, feeds = decoder(seed=4, head="untied")
    model = _exact_4bit_head(model)
    ref = run(model, feeds)
    res = quantize(model, feeds, weight_only=True, weight_bits=4, progress=False)
    layers = res.report["weight_only"]["layers"]
    assert layers["lm_head.weight"]["bits"] == 4 and "costs" in layers["lm_head.weight"]["notes"][0]
    assert layers["embed.weight"]["bits"] == 8 and "would cost" in layers["embed.weight"]["notes"][0]
    assert _nbits(res)["logits_node_nbits"] == 4
    # the rule alone (no data) keeps it at 8: the measured choice loses less than the stated cost
    rule = quantize(model, None, weight_only=True, weight_bits=4, progress=False)
    assert _nbits(rule)["logits_node_nbits"] == 8
    ours, theirs = logits_sqnr(ref, run(model_to_proto(res.model), feeds)), \
        logits_sqnr(ref, run(model_to_proto(rule.model), feeds))
    assert ours > theirs - HEAD_COST_DB, (ours, theirs)


@pytest.mark.parametrize("head", ["tied_transpose", "untied"])
def test_a_head_4_bits_would_hurt_stays_8_bits_with_the_figures(head):
    model, feeds = decoder(seed=1, head=head)
    res = quantize(model, feeds, weight_only=True, weight_bits=4, progress=False)
    layers = res.report["weight_only"]["layers"]
    ends = ["embed.weight"] + ([] if head.startswith("tied") else ["lm_head.weight"])
    for name in ends:
        note = layers[name]["notes"][0]
        assert layers[name]["bits"] == 8 and "would cost" in note and "dB" in note, note
        cost = float(note.split("would cost ")[1].split()[0])
        assert cost >= HEAD_COST_DB
    assert any("head and embedding width measured" in n for n in res.report["notes"])


def test_head_bits_given_is_not_measured():
    model, feeds = decoder(seed=1, head="untied")
    res = quantize(model, feeds, weight_only=True, weight_bits=4, head_bits=4, progress=False)
    layers = res.report["weight_only"]["layers"]
    assert layers["lm_head.weight"]["bits"] == 4 and not layers["lm_head.weight"].get("notes")
    assert not any("head and embedding width measured" in n for n in res.report["notes"])
