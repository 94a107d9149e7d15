"""Progress bars on stderr (tqdm) for the long steps: loading, calibration and the report pass.

`progress=None` shows them when stderr is a terminal; True/False force them on/off (`--progress/--no-progress`).
On a terminal a bar redraws in place; elsewhere (a CI log, a file) each update is its own plain line, at most
one every LOG_INTERVAL seconds plus the final one, so a log reads `calibrating: 40/64 samples ...` lines instead
of one line of carriage returns.
"""
from __future__ import annotations

import sys
from typing import Optional

from tqdm import tqdm

LOG_INTERVAL = 10.0   # seconds between two lines of a bar written to a log
DELAY = 0.5           # seconds before a bar shown by default (on a terminal) first draws


def enabled(progress: Optional[bool]) -> bool:
    if progress is None:
        try:
            return sys.stderr.isatty()
        except (AttributeError, ValueError):
            return False
    return bool(progress)


class _Lines:
    """A file for tqdm that turns its carriage-return redraws into whole lines (for logs)."""

    def __init__(self, f):
        self.f = f
        self.last = ""

    def write(self, s: str) -> None:
        text = s.replace("\r", "").replace("\x1b[A", "").rstrip()
        if text and text != self.last:
            self.f.write(text + "\n")
            self.last = text

    def flush(self) -> None:
        try:
            self.f.flush()
        except (AttributeError, ValueError, OSError):
            pass


class _Bar:
    """A tqdm bar as a context manager: on an exception the bar is cleared (on a terminal) before the error
    line, so a failure still ends with the one error line."""

    def __init__(self, t):
        self.t = t

    def update(self, n: int = 1) -> None:
        self.t.update(n)

    def close(self) -> None:
        self.t.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is not None:
            self.t.leave = False
        self.t.close()
        return False


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def bar(desc: str, total: Optional[int], progress: Optional[bool], unit: str = "step"):
    """A tqdm bar on stderr (a context manager with update/close), or one that does nothing."""
    if not enabled(progress):
        return _NoBar()
    err = sys.stderr
    tty = False
    try:
        tty = err.isatty()
    except (AttributeError, ValueError):
        pass
    # NOTE: `delay` (bars shown by default on a terminal): a step that ends, or fails on bad input, within it
    # draws nothing; bars asked for (--progress) show at once
    delay = DELAY if progress is None else 0.0
    if tty:
        return _Bar(tqdm(total=total, desc=desc, unit=unit, file=err, leave=True, delay=delay))
    return _Bar(tqdm(total=total, desc=desc, unit=unit, file=_Lines(err), mininterval=LOG_INTERVAL, ascii=True,
                     ncols=80, leave=True, dynamic_ncols=False, delay=delay))


__all__ = ["bar", "enabled"]
