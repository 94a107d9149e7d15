"""A float model over protobuf's 2 GB limit, written tensor by tensor (never held whole): a chain of MatMuls
whose float32 weights live in one external-data file beside the model, plus a calibration .npz.

Used by tests/quant/test_large_model.py and benchmarks/bench_large.py.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, helper

from qcompiler.sqnr import sqnr_db  # noqa: F401 - re-exported for bench_large and its test

GIB = 1 << 30


# 4 weights of 8192 x 18432 float32 (576 MiB each): 2.25 GiB. Four layers, not nine 8192 x 8192: each W8A8 layer
# adds its rounding noise, and nine random layers end at 23.9 dB output SQNR, four at ~27.
WIDTHS = (8192, 18432, 8192, 18432, 8192)


def write_chain(folder: str, widths=WIDTHS, samples: int = 4, batch: int = 8, seed: int = 0) -> dict:
    """Write `folder/chain.onnx` + `chain.onnx.data` (float32 weights widths[i] x widths[i+1], N(0, 1/fan-in),
    one at a time) and `folder/calib.npz` (samples x batch x widths[0]). Returns the paths and weight bytes."""
    rng = np.random.default_rng(seed)
    model = os.path.join(folder, "chain.onnx")
    location = "chain.onnx.data"
    inits, nodes, prev, offset = [], [], "x", 0
    with open(os.path.join(folder, location), "wb") as f:
        layers = len(widths) - 1
        for i in range(layers):
            w = rng.standard_normal((widths[i], widths[i + 1]), dtype=np.float32)
            w *= np.float32(1.0 / np.sqrt(widths[i]))
            pad = -offset % 4096
            f.write(bytes(pad))
            offset += pad
            f.write(w.data)
            t = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=list(w.shape),
                            data_location=TensorProto.EXTERNAL)
            for k, v in (("location", location), ("offset", str(offset)), ("length", str(w.nbytes))):
                e = t.external_data.add()
                e.key, e.value = k, v
            offset += w.nbytes
            del w
            inits.append(t)
            out = "y" if i == layers - 1 else f"h{i}"
            nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [out], name=f"mm{i}"))
            prev = out
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", widths[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", widths[-1]])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    with open(model, "wb") as f:
        f.write(m.SerializeToString())
    calib = os.path.join(folder, "calib.npz")
    np.savez(calib, x=rng.standard_normal((samples, batch, widths[0]), dtype=np.float32))
    return {"model": model, "calib": calib, "widths": tuple(widths), "weight_bytes": offset}


def float_reference(info: dict, x: np.ndarray) -> np.ndarray:
    """The float model's output on `x`, computed with numpy from the weights mapped one at a time."""
    widths, path = info["widths"], info["model"] + ".data"
    offset, h = 0, np.asarray(x, np.float32)
    for i in range(len(widths) - 1):
        offset += -offset % 4096
        w = np.memmap(path, dtype=np.float32, mode="r", offset=offset, shape=(widths[i], widths[i + 1]))
        h = h @ w
        del w
        offset += widths[i] * widths[i + 1] * 4
    return h
