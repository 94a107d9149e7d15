"""Every profile's `weight_only` form checked against onnxruntime, generated from the profiles themselves.

For each profile that has a weight-only form and each weight width it claims, a small decoder is quantized
weight-only (symmetric, and with zero points where the form allows them). The written graph must hold the op
the form names (MatMulNBits with that width and the form's default accuracy_level, or a blocked
DequantizeLinear of the form's signedness), the embedding must take the form's Gather op, and onnxruntime must
load and run the file with the logits within a floor of the float model's. A profile that claims a width or
a form onnxruntime rejects fails here. `slow_level0_bits` is a speed fact: it is measured per node by
benchmarks/llm/node_times.py, not in a timed test; here it must name widths the form runs.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from qcompiler.onnx_io import model_to_proto
from qcompiler.quant import quantize
from qcompiler.quant.targets.profiles import PROFILES, get_profile
from tests.quant.decoder_models import decoder
from tests.quant.test_weight_only import logits_sqnr, run

ort = pytest.importorskip("onnxruntime")

SQNR_FLOOR_DB = {4: 12.0, 8: 30.0}   # logits of the 2-layer test decoder with outlier channels


def _cases():
    for name in sorted(PROFILES):
        form = get_profile(name).weight_only
        if form is None:
            continue
        for bits in form.bits:
            for symmetric in ((True, False) if form.zero_points else (True,)):
                yield pytest.param(name, bits, symmetric, id=f"{name}-w{bits}-{'sym' if symmetric else 'zp'}")


def _attrs(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


@pytest.mark.parametrize("target,bits,symmetric", list(_cases()))
def test_weight_only_form_runs_in_onnxruntime(target, bits, symmetric):
    form = get_profile(target).weight_only
    model, feeds = decoder(seed=11)
    ref = run(model, feeds)
    res = quantize(model, None, target=target, weight_only=True, weight_bits=bits, head_bits=bits,
                   weight_symmetric=symmetric, progress=False)
    q = model_to_proto(res.model)
    ops = [n.op_type for n in q.graph.node]
    if form.matmul == "MatMulNBits":
        nbits = [n for n in q.graph.node if n.op_type == "MatMulNBits"]
        assert nbits, ops
        for n in nbits:
            a = _attrs(n)
            assert a["bits"] == bits
            assert a.get("accuracy_level", 0) == form.accuracy_level, (n.name, a)
            has_zp = len(n.input) > 3 and n.input[3] != ""
            assert has_zp == (not symmetric), (n.name, list(n.input))
        consts = {t.name for t in q.graph.initializer}
        float_weights = [n.name for n in q.graph.node if n.op_type == "MatMul" and n.input[1] in consts]
        assert not float_weights, float_weights     # only activation x activation MatMuls stay (attention)
    else:
        blocked = [n for n in q.graph.node if n.op_type == "DequantizeLinear" and _attrs(n).get("block_size")]
        assert blocked, ops
        inits = {t.name: t for t in q.graph.initializer}
        for n in blocked:
            t = inits.get(n.input[0])
            assert t is not None
            signed = t.data_type in (onnx.TensorProto.INT4, onnx.TensorProto.INT8)
            assert signed == form.signed, (n.name, t.data_type)
    if form.gather == "GatherBlockQuantized":
        assert "GatherBlockQuantized" in ops, ops
    elif form.gather is None:
        assert "Gather" in ops, ops
    got = logits_sqnr(ref, run(q, feeds))
    assert got >= SQNR_FLOOR_DB[bits], (target, bits, symmetric, got)


@pytest.mark.parametrize("target", sorted(n for n in PROFILES if get_profile(n).weight_only is not None))
def test_slow_level0_bits_name_widths_the_form_runs(target):
    form = get_profile(target).weight_only
    assert set(form.slow_level0_bits) <= set(form.bits)
    assert not form.slow_level0_bits or form.matmul == "MatMulNBits"
