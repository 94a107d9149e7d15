"""Issue-4 figures on the shared corpus, with verify-each on real inputs (skipped when the corpus is absent)."""
import os

import numpy as np
import pytest

from qcompiler.onnx_io import load_model
from qcompiler.passmanager import run_pipeline
from qcompiler.passmanager.instrumentation import Verifier

from tests.corpus import CORPUS
PIPELINE = "constant-to-initializer,fold-batchnorm,canonicalize,annotate-supergroups,fuse-layernorm,fuse-gelu"

EXPECTED = {
    "digits_cnn": {"fold-batchnorm": {"folded": 8, "kept": 0}, "annotate-supergroups": {"conv_bn_act": 8}},
    "ppocr_cls": {"fold-batchnorm": {"folded": 35, "kept": 0},
                  "annotate-supergroups": {"hardswish": 18, "hardsigmoid_gate": 9}},
    "minilm_l6": {"annotate-supergroups": {"layernorm": 13, "gelu": 6}},
    "char_rnn": {"fold-batchnorm": {"folded": 0}},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_rewrites_verified(name):
    path = os.path.join(CORPUS, name, "model.onnx")
    if not os.path.exists(path):
        pytest.skip("corpus not present")
    calib = np.load(os.path.join(CORPUS, name, "calib.npz"))
    feeds = {k: calib[k][0] for k in calib.files}
    model = load_model(path)
    verifier = Verifier(feeds=feeds, rtol=1e-4, atol=1e-4)
    results = {p.name: r.stats for p, r in run_pipeline(model, PIPELINE, [verifier])}
    assert not any("skipped" in line for line in verifier.log), verifier.log
    for pass_name, want in EXPECTED[name].items():
        for k, v in want.items():
            assert results[pass_name][k] == v, (pass_name, k, results[pass_name])
    ops = {n.op_type for n in model.graph}
    assert "BatchNormalization" not in ops
