"""Quantization time of this tree against a baseline git commit, interleaved, on every corpus model.

usage: python benchmarks/bench_quantize_time.py --baseline REF [--corpus DIR] [--models a,b] [--repeats N]

The baseline is checked out into a temporary git worktree (removed after) and imported from there, with its
`passes/` and `patterns/` folders mapped to `qcompiler.passes` / `qcompiler.patterns` as setup.cfg maps them;
each run is its own process (the second `quantize()` call's wall time: imports and first-call costs excluded),
baseline and current alternate, and
the table prints the median wall and CPU seconds of each (warm: the second call; cold: the first) and their ratios
(current/baseline; < 1 is faster), plus the task
metric of both so a speed-up that changes the result shows. quantize time must not grow.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_CORPUS = os.environ.get("QC_CORPUS", os.path.join(ROOT, "..", "shared", "corpus"))

# run in a child process: import qcompiler from ROOT (argv[1]) with its package_dir mapping, quantize, time
CHILD = r'''
import importlib.abc, importlib.util, json, os, sys, time
root, model, calib, out = sys.argv[1:5]
sys.path.insert(0, root)
MAP = {"qcompiler.passes": os.path.join(root, "passes"), "qcompiler.patterns": os.path.join(root, "patterns")}

class Mapped(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        for pkg, folder in MAP.items():
            if name == pkg or name.startswith(pkg + "."):
                rel = name[len(pkg):].lstrip(".").replace(".", os.sep)
                base = os.path.join(folder, rel) if rel else folder
                if os.path.isdir(base):
                    return importlib.util.spec_from_file_location(name, os.path.join(base, "__init__.py"),
                                                                  submodule_search_locations=[base])
                return importlib.util.spec_from_file_location(name, base + ".py")
        return None

sys.meta_path.insert(0, Mapped())
from qcompiler.quant.api import quantize
w0, c0 = time.perf_counter(), time.process_time()
quantize(model, calib, progress=False)   # cold: first-call costs (lazy imports, onnxruntime's first session)
cold, cold_cpu = time.perf_counter() - w0, time.process_time() - c0
t0, c0 = time.perf_counter(), time.process_time()
res = quantize(model, calib, progress=False)
secs, cpu = time.perf_counter() - t0, time.process_time() - c0
res.save(out)
print(json.dumps({"seconds": secs, "cpu": cpu, "cold": cold, "cold_cpu": cold_cpu}))
'''


def _child(root, model, calib, out):
    r = subprocess.run([sys.executable, "-c", CHILD, root, model, calib, out], capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2")))
    if r.returncode != 0:
        raise SystemExit(f"quantize failed in {root}: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def _metric(model_dir, qmodel):
    r = subprocess.run([sys.executable, os.path.join(model_dir, "eval.py"), qmodel], capture_output=True,
                       text=True, cwd=model_dir)
    try:
        d = json.loads(r.stdout.strip().splitlines()[-1])
        return f"{d['metric']}={d['value']:.4f}"
    except Exception:   # noqa: BLE001 - a benchmark prints what it can
        return "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="git commit or ref to compare with")
    ap.add_argument("--corpus", default=DEFAULT_CORPUS)
    ap.add_argument("--models", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    models = a.models.split(",") if a.models else sorted(
        d for d in os.listdir(a.corpus) if os.path.isfile(os.path.join(a.corpus, d, "model.onnx")))
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "baseline")
        subprocess.run(["git", "-C", ROOT, "worktree", "add", "-q", "--detach", base, a.baseline], check=True)
        try:
            print(f"baseline {a.baseline} vs current tree, {a.repeats} interleaved runs each, median seconds; "
                  f"warm = the second quantize() call, cold = the first (lazy imports, first session); cpu = "
                  f"process CPU time (all threads), the steadier figure on a loaded machine")
            print(f"{'model':<12}{'':<6}{'base wall':>10}{'cur wall':>10}{'ratio':>7}{'base cpu':>10}{'cur cpu':>10}"
                  f"{'ratio':>7}  metric baseline / current")
            for m in models:
                d = os.path.join(a.corpus, m)
                args = (os.path.join(d, "model.onnx"), os.path.join(d, "calib.npz"))
                tb, tc = [], []
                for _ in range(a.repeats):
                    tb.append(_child(base, *args, os.path.join(tmp, "b.onnx")))
                    tc.append(_child(ROOT, *args, os.path.join(tmp, "c.onnx")))
                metrics = f"{_metric(d, os.path.join(tmp, 'b.onnx'))} / {_metric(d, os.path.join(tmp, 'c.onnx'))}"
                for label, wk, ck in (("warm", "seconds", "cpu"), ("cold", "cold", "cold_cpu")):
                    bw, cw = statistics.median(r[wk] for r in tb), statistics.median(r[wk] for r in tc)
                    bc, cc = statistics.median(r[ck] for r in tb), statistics.median(r[ck] for r in tc)
                    print(f"{m:<12}{label:<6}{bw:>10.3f}{cw:>10.3f}{cw / bw:>7.2f}{bc:>10.3f}{cc:>10.3f}{cc / bc:>7.2f}"
                          f"  {metrics if label == 'warm' else ''}", flush=True)
        finally:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", base], check=False)


if __name__ == "__main__":
    main()
