"""Write a tiny float CNN (Conv+BN+Relu x2, Gemm) and 32 calibration samples, for the README's first example.

usage: python examples/make_tiny_cnn.py OUT_DIR   ->  OUT_DIR/tiny_cnn.onnx, OUT_DIR/tiny_cnn_calib.npz
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def build(rng):
    def init(name, arr):
        return numpy_helper.from_array(arr.astype(np.float32), name)
    inits = [
        init("w1", rng.standard_normal((8, 3, 3, 3)) * 0.3), init("g1", 1 + 0.1 * rng.standard_normal(8)),
        init("b1", 0.1 * rng.standard_normal(8)), init("m1", 0.1 * rng.standard_normal(8)), init("v1", 0.5 + rng.random(8)),
        init("w2", rng.standard_normal((16, 8, 3, 3)) * 0.2), init("g2", 1 + 0.1 * rng.standard_normal(16)),
        init("b2", 0.1 * rng.standard_normal(16)), init("m2", 0.1 * rng.standard_normal(16)), init("v2", 0.5 + rng.random(16)),
        init("fc_w", rng.standard_normal((10, 16)) * 0.3), init("fc_b", 0.1 * rng.standard_normal(10)),
    ]
    nodes = [
        helper.make_node("Conv", ["image", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c1", "g1", "b1", "m1", "v1"], ["n1"], name="bn1"),
        helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("BatchNormalization", ["c2", "g2", "b2", "m2", "v2"], ["n2"], name="bn2"),
        helper.make_node("Relu", ["n2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["gap"], name="gap"),
        helper.make_node("Flatten", ["gap"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="fc", transB=1),
    ]
    g = helper.make_graph(nodes, "tiny_cnn", [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, 16, 16])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name="qcompiler-example")
    m.ir_version = 7
    return m


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "out"
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    onnx.save(build(rng), os.path.join(out, "tiny_cnn.onnx"))
    np.savez(os.path.join(out, "tiny_cnn_calib.npz"), image=rng.random((32, 1, 3, 16, 16)).astype(np.float32))
    print(f"wrote {out}/tiny_cnn.onnx and {out}/tiny_cnn_calib.npz")


if __name__ == "__main__":
    main()
