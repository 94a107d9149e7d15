"""The light models bundled with onnx (AlexNet, DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet,
VGG-19, ZFNet-512) through import -> canonicalize -> verify -> export.

They are IR-version-3 models whose initializers are also listed as graph inputs (the old style), so they also
prove that such inputs survive the round trip. The export must pass `onnx.checker`, match the original
structurally (modulo canonicalize, see roundtrip.structural_diff) and give onnxruntime's same outputs as the
original on random inputs of the declared dtype/shape (bit-exact is not promised, 1e-5 relative is).
"""
from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import pytest

from qcompiler.passmanager.instrumentation import random_feeds
from tests.conformance.roundtrip import roundtrip, session, structural_diff

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
MODELS = sorted(glob.glob(os.path.join(LIGHT_DIR, "*.onnx")))


def test_light_models_found():
    assert len(MODELS) >= 8, f"expected onnx's light models in {LIGHT_DIR}, found {len(MODELS)}"


@pytest.mark.parametrize("path", MODELS, ids=[os.path.basename(p)[:-5] for p in MODELS])
def test_light_model_roundtrip(path):
    original = onnx.load(path)
    exported = roundtrip(original, os.path.dirname(path))
    onnx.checker.check_model(exported, full_check=True)
    diff = structural_diff(original, exported)
    assert not diff, f"{os.path.basename(path)}: " + "; ".join(diff)
    assert [v.name for v in exported.graph.input] == [v.name for v in original.graph.input]

    try:
        sess = session(original)
    except Exception as e:  # pragma: no cover - all nine run in onnxruntime 1.31
        pytest.skip(f"onnxruntime cannot load the original: {e}")
    feeds = random_feeds(original)
    want = sess.run(None, feeds)
    got = session(exported).run(None, feeds)
    assert len(got) == len(want)
    for i, (w, g) in enumerate(zip(want, got)):
        assert g.shape == w.shape and g.dtype == w.dtype, f"output {i}: {g.shape}/{g.dtype} vs {w.shape}/{w.dtype}"
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"{os.path.basename(path)} output {i}")
