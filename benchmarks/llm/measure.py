"""Run one command as a child and write its wall time and peak RSS as JSON: the child's own figures.

    python measure.py RESULT.json -- CMD [ARGS...]

Peak RSS is the child's ru_maxrss from os.wait4 (its own process, plus any grandchildren it waited for).
This wrapper is small (~10 MB) and started fresh, so the floor Linux carries across fork+exec into ru_maxrss is
this wrapper's, not the (possibly large) benchmark process's. The child's stdout/stderr pass straight through.
Exit code: the child's.
"""
import json
import os
import subprocess
import sys
import time


def main():
    out = sys.argv[1]
    assert sys.argv[2] == "--", "usage: measure.py RESULT.json -- CMD..."
    cmd = sys.argv[3:]
    t0 = time.perf_counter()
    try:
        p = subprocess.Popen(cmd)
    except OSError as e:
        print(f"measure.py: cannot start {cmd[0]}: {e}", file=sys.stderr)
        with open(out, "w") as f:
            json.dump({"rc": 127, "seconds": 0.0, "peak_rss_mb": 0.0, "error": str(e)}, f)
        return 127
    _, status, ru = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t0
    rc = os.waitstatus_to_exitcode(status)
    p.returncode = rc
    with open(out, "w") as f:
        json.dump({"rc": rc, "seconds": round(dt, 3), "peak_rss_mb": round(ru.ru_maxrss / 1024, 1),
                   "cpu_seconds": round(ru.ru_utime + ru.ru_stime, 3)}, f)
    return rc


if __name__ == "__main__":
    sys.exit(main())
