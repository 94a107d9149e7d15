"""Test-wide setup: the IR invariant checker runs after every pass of every pipeline in the suite."""
from qcompiler.passmanager import add_default_instrumentation
from qcompiler.passmanager.instrumentation import Verifier

add_default_instrumentation(lambda: Verifier(numeric=False, checker=False))
