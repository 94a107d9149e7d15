"""Run hostile mutants outside pytest and print their failures grouped by command and cause, one line each.

    python -m tests.hostile.summary                 # the default set (each kind once, seed 0) + unmutated sources
    python -m tests.hostile.summary --seeds 1-3     # the slow sweep's seeds over all sources (corpus included)
    python -m tests.hostile.summary --kinds ext-nul,cycle --sources cnn

Each line: command, cause (exception type and message head, or the broken promise), then the mutants showing it.
"""
from __future__ import annotations

import argparse
import collections
import re
import shutil
import tempfile
from pathlib import Path

from tests.hostile.mutants import BUILT, KINDS, available_sources
from tests.hostile.test_mutants import DEFAULT, run_mutant


def cause(r, bad) -> str:
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    if "Traceback" in r.stderr and lines:
        last = lines[-1]
        last = re.sub(r"/tmp/\S+", "<tmp>", last)
        last = re.sub(r"/onnxruntime_src/\S+ [^(]*\((?:[^()]|\([^()]*\))*\)(?: \[with [^\]]*\])? ", "", last)
        return "traceback " + last[:170]
    head = re.sub(r"/tmp/\S+", "<tmp>", lines[0])[:150] if lines else ""
    return "; ".join(re.sub(r"/tmp/\S+", "<tmp>", b)[:120] for b in bad) + (f" | {head}" if head else "")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="", help="a-b: run these seeds over all sources (default: the default set)")
    ap.add_argument("--sources", default="")
    ap.add_argument("--kinds", default="")
    ap.add_argument("--shard", default="", help="i/n: every n-th case from the i-th (1-based)")
    a = ap.parse_args(argv)
    if a.seeds:
        lo, _, hi = a.seeds.partition("-")
        seeds = range(int(lo), int(hi or lo) + 1)
        cases = [(s, k, n) for n in seeds for s in available_sources() for k in KINDS]
    else:
        cases = [(s, "none", 0) for s in BUILT] + DEFAULT
    if a.sources:
        cases = [c for c in cases if c[0] in a.sources.split(",")]
    if a.kinds:
        cases = [c for c in cases if c[1] in a.kinds.split(",")]
    if a.shard:
        i, k = (int(x) for x in a.shard.split("/"))
        cases = cases[i - 1::k]
    groups = collections.defaultdict(list)
    n = 0
    for src, kind, seed in cases:
        tmp = Path(tempfile.mkdtemp(prefix="qc-hostile-"))
        try:
            mut, results, leftovers = run_mutant(tmp, src, kind, seed)
            if mut is None:
                continue
            n += 1
            for cmd, r, bad in results:
                if bad:
                    groups[(cmd, cause(r, bad))].append(f"{mut.id} ({mut.what[:60]})")
            if leftovers:
                groups[("any", f"leftovers {leftovers}")].append(mut.id)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{n} mutants, {sum(len(v) for v in groups.values())} failing runs in {len(groups)} groups")
    for (cmd, c), ids in sorted(groups.items(), key=lambda kv: (kv[0][0], -len(kv[1]))):
        print(f"[{cmd}] x{len(ids)} {c}\n      e.g. " + "; ".join(ids[:3]))


if __name__ == "__main__":
    main()
