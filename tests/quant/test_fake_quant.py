"""The one fake-quant function (encoding.quantize_dequantize) is bit-exact with onnxruntime's QuantizeLinear ->
DequantizeLinear: per tensor, per channel and per block, 4/8/16 bits, signed and unsigned, ties included."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from qcompiler.ort_session import create_session
from qcompiler.quant.core.encoding import Encoding, dequantize_linear, quantize_dequantize
from qcompiler.quant.core.qdq import storage_dtype

_ONNX_TYPE = {(4, True): TensorProto.INT4, (4, False): TensorProto.UINT4, (8, True): TensorProto.INT8,
              (8, False): TensorProto.UINT8, (16, True): TensorProto.INT16, (16, False): TensorProto.UINT16}


def _ort_qdq(x, enc):
    zp_type = _ONNX_TYPE[(enc.bits, enc.signed)]
    scale = np.asarray(enc.scale, np.float32)
    zp = np.asarray(enc.zero_point, np.int64)
    attrs = {}
    if enc.axis is not None and scale.ndim:
        attrs["axis"] = enc.axis
    if enc.block_size:
        attrs["block_size"] = enc.block_size
    inits = [numpy_helper.from_array(scale, "s"),
             helper.make_tensor("z", zp_type, list(zp.shape), zp.ravel().tolist())]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **attrs)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    sess = create_session(m.SerializeToString())
    return sess.run(None, {"x": x})[0]


def _encoding(rng, bits, signed, shape, axis=None, block=None):
    qmin = -(2 ** (bits - 1)) if signed else 0
    qmax = 2 ** (bits - 1) - 1 if signed else 2 ** bits - 1
    if axis is None:
        sshape = ()
    elif block:
        sshape = list(shape)
        sshape[axis] = -(-shape[axis] // block)
    else:
        sshape = (shape[axis],)
    scale = rng.uniform(0.003, 0.2, sshape).astype(np.float32)
    zp = rng.integers(qmin + (qmax - qmin) // 4, qmax - (qmax - qmin) // 4 + 1, sshape).astype(np.int64)
    return Encoding(scale=scale, zero_point=zp, bits=bits, signed=signed, axis=axis, block_size=block)


def _input(rng, enc, shape):
    x = rng.normal(0, 1, shape).astype(np.float32) * float(np.max(enc.scale)) * 2 ** (enc.bits - 1)
    # exact ties (k + 0.5) * scale, and values far out of range (saturation)
    flat = x.reshape(-1)
    s = float(np.ravel(enc.scale)[0])
    flat[:6] = np.float32([0.5, 1.5, 2.5, -0.5, -1.5, -2.5]) * np.float32(s)
    flat[6:8] = [1e6, -1e6]
    return x


CASES = [(bits, signed, kind) for bits in (4, 8, 16) for signed in (True, False)
         for kind in ("tensor", "channel", "block")]


@pytest.mark.parametrize("bits, signed, kind", CASES)
def test_bit_exact_with_onnxruntime(bits, signed, kind):
    rng = np.random.default_rng(bits * 10 + signed)
    shape = (6, 5, 3) if kind != "block" else (10, 4)
    axis = {"tensor": None, "channel": 1, "block": 0}[kind]
    enc = _encoding(rng, bits, signed, shape, axis, 4 if kind == "block" else None)
    x = _input(rng, enc, shape)
    got, want = quantize_dequantize(x, enc), _ort_qdq(x, enc)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


def test_float64_input_gets_the_same_values_widened():
    rng = np.random.default_rng(5)
    enc = _encoding(rng, 8, True, (4, 3), axis=0)
    x = rng.normal(0, 1, (4, 3)).astype(np.float32)
    got = quantize_dequantize(x.astype(np.float64), enc)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, quantize_dequantize(x, enc).astype(np.float64))


def test_dequantize_linear_matches_onnxruntime_per_channel():
    rng = np.random.default_rng(7)
    enc = _encoding(rng, 8, False, (3, 4), axis=0)
    q = rng.integers(0, 256, (3, 4)).astype(storage_dtype(enc))
    scale = np.asarray(enc.scale, np.float32)
    zp = np.asarray(enc.zero_point).astype(np.uint8)
    node = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=0)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("q", TensorProto.UINT8, [3, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])],
                          [numpy_helper.from_array(scale, "s"), numpy_helper.from_array(zp, "z")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    want = create_session(m.SerializeToString()).run(None, {"q": q})[0]
    np.testing.assert_array_equal(dequantize_linear(q, scale, zp, 0), want)
