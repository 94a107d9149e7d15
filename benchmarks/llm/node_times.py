"""Per-node kernel times of two decoders side by side (onnxruntime's profiler, 1 thread, interleaved runs).

    python benchmarks/llm/node_times.py EVAL.npz A=a.onnx B=b.onnx [--seq 128] [--runs 30] [--top 40]

Wall-clock latency on a shared machine moves by ±5 % between two runs of the same model; the kernel time of one
node moves far less. Prints each model's total kernel time and its op types, then the nodes that differ most
(median microseconds per run), matched by name once the writers' suffixes (`_nbits`, `_Q4`) are stripped:
what one model's extra time is made of. EVAL.npz: key `input_ids` (N, 1, seq); the first sequence is used.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics

import numpy as np


def node_times(paths: dict, ids: np.ndarray, runs: int) -> dict:
    """{row: {node: median µs}} with every session open, runs interleaved round by round."""
    import onnxruntime as ort
    sess = {}
    for row, p in paths.items():
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.enable_profiling = True
        so.profile_file_prefix = f"node_times_{os.getpid()}_{row}"
        sess[row] = ort.InferenceSession(p, so, providers=["CPUExecutionProvider"])
    for _ in range(runs):
        for s in sess.values():
            s.run(["logits"], {"input_ids": ids})
    out = {}
    for row, s in sess.items():
        f = s.end_profiling()
        with open(f) as fh:
            events = json.load(fh)
        os.remove(f)
        by_node = collections.defaultdict(list)
        for e in events:
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                by_node[(re.sub(r"_(nbits|Q4)$", "", e["name"][:-len("_kernel_time")]), e["args"]["op_name"])].append(
                    e["dur"])
        out[row] = {k: (statistics.median(v), sum(v) / runs) for k, v in by_node.items()}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("eval_npz")
    ap.add_argument("models", nargs=2, help="NAME=PATH, twice")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--top", type=int, default=20)
    a = ap.parse_args(argv)
    ids = np.load(a.eval_npz)["input_ids"][0][:, :a.seq].astype(np.int64)
    paths = dict(m.split("=", 1) for m in a.models)
    t = node_times(paths, ids, a.runs)
    for row, nodes in t.items():
        ops = collections.Counter()
        for (_, op), (_, mean) in nodes.items():
            ops[op] += mean
        print(f"{row}: {sum(ops.values()) / 1000:.2f} ms kernels per run at L={a.seq}; "
              + ", ".join(f"{op} {us / 1000:.2f}" for op, us in ops.most_common(6)))
    ra, rb = list(t)
    na = {n: v[0] for (n, _), v in t[ra].items()}
    nb = {n: v[0] for (n, _), v in t[rb].items()}
    diff = sorted(set(na) | set(nb), key=lambda n: -abs(na.get(n, 0) - nb.get(n, 0)))[:a.top]
    print(f"{'node':40s} {ra:>10s} {rb:>10s}  (median µs)")
    for n in diff:
        print(f"{n:40s} {na.get(n, 0):10.1f} {nb.get(n, 0):10.1f}")


if __name__ == "__main__":
    main()
