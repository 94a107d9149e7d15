"""Test-wide setup: the IR invariant checker runs after every pass of every pipeline in the suite; the `tiny`
fixture is the README's example model and calibration set, made once per test module."""
import pytest

from qcompiler.passmanager import add_default_instrumentation
from qcompiler.passmanager.instrumentation import Verifier

add_default_instrumentation(lambda: Verifier(numeric=False, checker=False))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tests.helpers import make_tiny_cnn
    d = tmp_path_factory.mktemp("tiny")
    make_tiny_cnn(d)
    return d
