import numpy as np
from onnx import TensorProto, helper

from qcompiler.onnx_io import load_model, model_from_proto
from qcompiler.passmanager import run_pipeline
from qcompiler.passmanager.instrumentation import Verifier
from tests.corpus import corpus_file
from tests.helpers import make_model, run, tinfo

import os
import pytest


def _model(extra_reader=False):
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[1, 2, 0], name="t"),
             helper.make_node("Shape", ["xt"], ["s"], name="shape"),
             helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT, name="cast")]
    outs = [tinfo("y", [3])]
    if extra_reader:
        nodes.append(helper.make_node("Relu", ["xt"], ["r"], name="relu"))
        outs.append(tinfo("r", [3, 4, 2]))
    return make_model(nodes, [tinfo("x", [2, 3, 4])], outs)


@pytest.mark.parametrize("extra_reader", [False, True])
def test_shape_of_transpose(extra_reader):
    proto = _model(extra_reader)
    m = model_from_proto(proto)
    (_, r), = run_pipeline(m, "simplify-shape-of", [Verifier()])
    assert r.stats == {"rewritten": 1, "transposes_removed": 0 if extra_reader else 1}
    assert ("Transpose" in {n.op_type for n in m.graph}) == extra_reader
    x = np.random.rand(2, 3, 4).astype(np.float32)
    for a, b in zip(run(proto, {"x": x}), run(m, {"x": x})):
        np.testing.assert_array_equal(a, b)


def test_char_rnn_loses_its_shape_only_transposes():
    path = corpus_file("char_rnn")
    if not os.path.exists(path):
        pytest.skip("corpus not present")
    m = load_model(path)
    feeds = {"chars": np.load(corpus_file("char_rnn", "calib.npz"))["chars"][0]}
    (_, r), = run_pipeline(m, "simplify-shape-of", [Verifier(feeds=feeds)])
    assert r.stats == {"rewritten": 2, "transposes_removed": 2}
