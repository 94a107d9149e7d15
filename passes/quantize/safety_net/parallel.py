"""The safety net's independent trials on the run's executor (qcompiler/quant/runtime/executor.py).

Most trials depend on the one before (a bisection, members turned back on one by one); a few phases have
candidates that do not: the two halves of a group, the candidate regions of one round. `_Trials.harm_many` runs
those through a pool (qcompiler/quant/runtime/switch_pool.py) on the run's executor: Ray with `--ray`, the
caller's `executor=`, else local worker processes where they pay (executor.run_executor's rule: more cores than
the RUNS_IN_FLIGHT samples an in-process trial runs at once, and a model of SMALL_MODEL_BYTES or more; otherwise
every trial runs here). With more workers than that, every timed trial goes to the pool, its samples split
over the workers. The workers return raw outputs, reduced here as in-process runs are: the serial run's numbers.
"""
from __future__ import annotations

from typing import Optional

from qcompiler.quant.runtime.switch_pool import SwitchPool, describe
from qcompiler.quant.runtime.switchable import ON_INPUT, WIDE_INPUT


class TrialPool:
    """The switch pool of one switchable copy, fed the trials' (on flags, wide flags or None)."""

    def __init__(self, pool: SwitchPool):
        self.pool = pool
        self._kept, self._feed_list = None, []

    @property
    def workers(self) -> int:
        return self.pool.workers

    @property
    def failed(self) -> bool:
        return self.pool.failed

    @property
    def trials(self) -> int:
        return self.pool.runs

    def run(self, kept, settings):
        """Per (on, wide) in `settings`, per kept sample, the outputs; None: run them here."""
        feeds = self._feeds(kept)
        return self.pool.run(feeds, [{ON_INPUT: on, **({WIDE_INPUT: wide} if wide is not None else {})}
                                     for on, wide in settings])

    def _feeds(self, kept):
        if self._kept is not kept:
            self._kept, self._feed_list = kept, [feed for feed, _ in kept]
        return self._feed_list

    def close(self) -> None:
        self.pool.close()


def trial_pool(executor, model) -> Optional[TrialPool]:
    """A pool for the switchable `model` (IR or ModelProto) when `executor` runs work elsewhere (None: serial, one worker)."""
    pool = SwitchPool.of(executor, model)
    return TrialPool(pool) if pool is not None else None


__all__ = ["TrialPool", "trial_pool", "describe"]
