"""A context manager that pauses Python's cyclic garbage collector while a whole model is built or written.

Why: importing a 90k-node model allocates ~500k container objects (nodes, values, use lists) that all stay
alive; each allocation burst triggers a collection that walks the growing heap (the parsed protobuf included),
which made import 2.5x slower than the work itself (benchmarks/bench_ir.py). Nothing built here is garbage, so
the collector has nothing to find; it is switched back on (if it was on) when the block ends, even on error.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def gc_paused():
    was_enabled = gc.isenabled()
    nothing_frozen = gc.get_freeze_count() == 0
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            if nothing_frozen:
                # NOTE: freeze + unfreeze moves every tracked object to the oldest generation without scanning
                # it. Left in the youngest, the ~1M objects just built were walked by a young, then a middle,
                # then a full collection (0.3 s each at 90k nodes); now only a full collection ever visits them.
                # Only when nothing was frozen before, so nobody else's frozen objects get unfrozen.
                gc.freeze()
                gc.unfreeze()
            gc.enable()
