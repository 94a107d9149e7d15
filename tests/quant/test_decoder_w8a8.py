"""W8A8 on decoders (the default run) on ort_cpu: no weight is left float without a reason. The MatMuls whose
input activation stays float (down_proj after SiLU(gate) * up) and the embedding are stored int8 for
onnxruntime's weight-only kernels (MatMulNBits, GatherBlockQuantized), so the file is under 0.3x float and the
logits stay close to float."""
from __future__ import annotations

import numpy as np
import onnx

from qcompiler.onnx_io import model_to_proto
from qcompiler.quant import quantize
from tests.quant.decoder_models import decoder
from tests.quant.test_weight_only import logits_sqnr, run


def test_w8a8_decoder_is_small_and_stores_no_float_weight():
    model, feeds = decoder(head="tied_transpose", seed=1, hidden=128, inter=256, samples=16, seq=16)
    ref = run(model, feeds)
    res = quantize(model, feeds, progress=False)
    q = model_to_proto(res.model)
    ops = [n.op_type for n in q.graph.node]
    assert ops.count("GatherBlockQuantized") == 1 and ops.count("MatMulNBits") == 2   # embedding, 2 down_proj
    big_float = [i.name for i in q.graph.initializer
                 if i.data_type == onnx.TensorProto.FLOAT and np.prod(i.dims) >= 128 * 128]
    assert not big_float, big_float
    assert len(q.SerializeToString()) < 0.3 * model.ByteSize()
    assert logits_sqnr(ref, run(q, feeds)) > 20
    narrowed = res.report["narrow_float_weights"]["layers"]
    assert set(narrowed) == {"embed.weight", "layers.0.down_proj.weight", "layers.1.down_proj.weight"}
    assert not [k for k in res.report["left_float"] if "down_node:input1" in k]


def test_optimize_accuracy_keeps_the_float_kernels_weights_float():
    model, feeds = decoder(head="untied", seed=2, samples=8)
    res = quantize(model, feeds, optimize="accuracy", progress=False)
    ops = [n.op_type for n in model_to_proto(res.model).graph.node]
    assert "MatMulNBits" not in ops and "GatherBlockQuantized" not in ops
