"""A chain of Conv+LeakyRelu quantized for ort_cpu runs integer kernels: QLinearConv and QLinearLeakyRelu.

onnxruntime's CPU provider absorbs only Relu/Clip into QLinearConv; a Conv+LeakyRelu pair with no quantizer
between them ran a float (Fused)Conv, so a keyword-spotting model of 19 such pairs ran at float speed. With a
Q/DQ between them (ort_cpu's `fused_activations` has no Conv+LeakyRelu) both run integer kernels.

Measured here (6 x Conv 3x3 32->32 on 32x32 + LeakyRelu, onnxruntime 1.32, one thread, AVX-VNNI, measure_latency
50 runs): 6 QLinearConv + 6 QLinearLeakyRelu, no float Conv, output SQNR 27.4 dB, latency 0.47x float (cpu clock
0.49x). Before, with Conv+LeakyRelu one unit: placement kept the whole chain float (6 float Convs, NCHWc), 1.00x
float, 35.8 dB. Timing is stated, not asserted.
"""
from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from qcompiler.onnx_io import model_to_proto
from qcompiler.quant.api import quantize
from qcompiler.quant.runtime.kernels import optimized_graph
from tests.helpers import make_model, run, sqnr_db, tinfo

LAYERS, C, HW = 6, 32, 32


def _chain():
    rng = np.random.default_rng(3)
    nodes, inits, v = [], [], "x"
    for i in range(LAYERS):
        w = (rng.standard_normal((C, C, 3, 3)) * np.sqrt(2.0 / (9 * C))).astype(np.float32)
        b = (rng.standard_normal(C) * 0.05).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        nodes += [helper.make_node("Conv", [v, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]),
                  helper.make_node("LeakyRelu", [f"c{i}"], [f"a{i}"], name=f"lrelu{i}", alpha=0.1)]
        v = f"a{i}"
    return make_model(nodes, [tinfo("x", [1, C, HW, HW])], [tinfo(v, [1, C, HW, HW])], inits, opset=17)


def test_conv_leaky_relu_chain_runs_integer_kernels():
    model = _chain()
    rng = np.random.default_rng(0)
    calib = [{"x": rng.standard_normal((1, C, HW, HW)).astype(np.float32)} for _ in range(8)]
    q = model_to_proto(quantize(model, calib, target="ort_cpu").model)
    types = [n.op_type for n in optimized_graph(q).graph.node]
    assert types.count("QLinearConv") == LAYERS and types.count("QLinearLeakyRelu") == LAYERS, types
    assert not {"Conv", "FusedConv", "LeakyRelu"} & set(types), types
    test = [{"x": rng.standard_normal((1, C, HW, HW)).astype(np.float32)} for _ in range(4)]
    ref = np.concatenate([run(model, f)[0] for f in test])
    got = np.concatenate([run(q, f)[0] for f in test])
    assert sqnr_db(ref, got) > 25.0
