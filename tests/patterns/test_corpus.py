"""Counts on the shared corpus models (skipped when the corpus is absent)."""
import os
from collections import Counter

import pytest

import qcompiler
from qcompiler.patterns import explain, find_matches

from tests.corpus import CORPUS
pytestmark = pytest.mark.skipif(not os.path.isdir(CORPUS), reason="corpus absent")


def _graph(name):
    return qcompiler.load_model(os.path.join(CORPUS, name, "model.onnx")).graph


def test_minilm_layernorm_and_gelu():
    g = _graph("minilm_l6")
    ln = find_matches(g, "layernorm")
    assert len(ln) == 13 and all(len(m.nodes) == 9 for m in ln)
    gelu = find_matches(g, "gelu")
    assert len(gelu) == 6 and all(m.pattern == "gelu_erf" for m in gelu)
    assert all({"half", "sqrt2", "one"} <= set(m.constants) for m in gelu)
    assert find_matches(g, "rmsnorm") == []


def test_ppocr_hardswish_and_gates():
    g = _graph("ppocr_cls")
    hs = find_matches(g, "hardswish")
    assert len(hs) == 18
    assert all([n.op_type for n in m.nodes] == ["Add", "Clip", "Mul", "Div"] for m in hs)
    assert len(find_matches(g, "hardsigmoid_gate")) == 9


def test_digits_conv_bn_act():
    g = _graph("digits_cnn")
    ms = find_matches(g, "conv_bn_act")
    assert len(ms) == 8 and Counter(m.pattern for m in ms) == {"conv_bn_act": 8}
    add = g.nodes_by_op("Add")[0]
    assert "root step expects" in explain(g, "conv_bn_act", add)
