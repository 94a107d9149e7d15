"""exporter.write_model: the same bytes as model_to_bytes, written tensor by tensor; and the memory-bounded
paths built on it (calibration sessions from a temp file, the opset raise that never copies weights)."""
from __future__ import annotations

import io

import numpy as np
import onnx

from benchmarks.llm_graph import make_llm_graph
from qcompiler import model_from_proto, model_to_proto, verify
from qcompiler.onnx_io.exporter import model_to_bytes, write_model
from qcompiler.quant.core.opset import convert_in_place
from qcompiler.quant.calibration.calibrate import make_session
from tests.helpers import run


def test_write_model_bytes_equal_model_to_bytes():
    m = model_from_proto(make_llm_graph(2))
    m.graph.add_constant(np.arange(6, dtype=np.float32), "extra")   # an array-backed tensor too
    f = io.BytesIO()
    write_model(m, f)
    assert f.getvalue() == model_to_bytes(m) == model_to_proto(m).SerializeToString()


def test_write_model_extra_outputs_run_in_a_session():
    proto = make_llm_graph(2)
    m = model_from_proto(proto)
    f = io.BytesIO()
    write_model(m, f, extra_outputs=["l0_ln1_mean_out"])
    got = onnx.ModelProto.FromString(f.getvalue())
    assert [o.name for o in got.graph.output] == ["y", "l0_ln1_mean_out"]
    sess = make_session(m, extra_outputs=["l0_ln1_mean_out"])
    x = np.random.default_rng(0).standard_normal((1, 16, 64)).astype(np.float32)
    y, mean = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, run(proto, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert mean.shape[:2] == (1, 16)


def test_convert_opset_keeps_the_weight_tensors_without_copying():
    m = model_from_proto(make_llm_graph(2))
    ref = model_to_proto(m)
    old = {n: v.tensor for n, v in m.graph.initializers.items() if v.tensor.nbytes > 4096}
    assert old and m.opset < 21
    new = m
    assert convert_in_place(m, 21) and not convert_in_place(m, 21)   # in place; a second call has nothing to do
    verify(new.graph)
    assert new.opset == 21
    for name, t in old.items():
        assert new.graph.initializers[name].tensor is t
    x = np.random.default_rng(1).standard_normal((1, 16, 64)).astype(np.float32)
    np.testing.assert_allclose(run(model_to_proto(new), {"x": x})[0], run(ref, {"x": x})[0], rtol=1e-5, atol=1e-5)
