"""IR round-trip benchmark: qcompiler load + canonicalize + save against onnx and onnx-graphsurgeon, same run.

Why: a pass pipeline on an exported LLM (~90k nodes) must not cost much more than reading and writing the file.
Baselines, measured here on the same temp file as Q:
    A  onnx.load(p) + onnx.save(m, p2)                                         (floor: parse + serialize)
    B  gs.import_onnx(onnx.load(p)) + onnx.save(gs.export_onnx(g), p2)         (onnx-graphsurgeon)
    Q  load_model(p) + run_pipeline(m, "canonicalize") + save_model(m, p2)      (qcompiler)
Targets: Q/A <= 1.5, Q/B <= 1.0, finding every LayerNorm and GELU match < 2 s. Each time is the median of
--runs runs after one warm-up. Exit status is 0 even when a target is missed (this measures, it does not test);
a missed target is printed as MISSED. The last line is JSON.

    python benchmarks/bench_ir.py [--nodes 90000] [--runs 3] [--verify]

Needs onnx-graphsurgeon, an optional extra (`pip install -e '.[bench]'`); without it the script says so and
exits 2.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager

HERE = os.path.dirname(os.path.abspath(__file__))
if __package__ in (None, ""):  # run as a script: make `benchmarks` and `qcompiler` importable from the repo
    sys.path.insert(0, os.path.dirname(HERE))
    if sys.path[1:2] == [HERE]:
        del sys.path[1]

import onnx  # noqa: E402

TARGET_Q_OVER_A = 1.5
TARGET_Q_OVER_B = 1.0
TARGET_MATCH_S = 2.0


def _median_time(fn, runs: int) -> float:
    """Median wall time of `runs` calls after one warm-up call (GC collected between runs, not during)."""
    fn()
    times = []
    for _ in range(runs):
        gc.collect()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


@contextmanager
def _stage_timers(stages: dict):
    """Wrap the functions load_model/save_model call, so Q's breakdown comes from the real public calls."""
    from qcompiler.onnx_io import files
    wrapped = ("load_proto", "model_from_proto", "model_to_proto", "model_to_byte_pieces")
    originals = {name: getattr(files, name) for name in wrapped if hasattr(files, name)}

    def timed(name, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                stages.setdefault(name, []).append(time.perf_counter() - t)
        return wrapper

    try:
        for name, fn in originals.items():
            setattr(files, name, timed(name, fn))
        yield
    finally:
        for name, fn in originals.items():
            setattr(files, name, fn)


def _make_model(nodes: int, path: str) -> int:
    from benchmarks.llm_graph import layers_for_nodes, make_llm_graph
    model = make_llm_graph(layers_for_nodes(nodes))
    onnx.save(model, path)
    return len(model.graph.node)


GS_MISSING = ("bench_ir.py: onnx-graphsurgeon (baseline B) is not installed; it is an optional extra: "
              "pip install -e '.[bench]'  (or: pip install 'onnx-graphsurgeon>=0.5')")


def _graphsurgeon():
    """onnx_graphsurgeon, or None when it is not installed (it is the `bench` extra, not a requirement)."""
    try:
        import onnx_graphsurgeon as gs
    except ImportError:
        return None
    return gs


def bench(nodes: int, runs: int, verify: bool) -> dict:
    gs = _graphsurgeon()
    if gs is None:
        raise SystemExit(GS_MISSING)
    from qcompiler import load_model, save_model
    from qcompiler.passmanager import run_pipeline

    tmp = tempfile.mkdtemp(prefix="bench_ir_")
    src, out = os.path.join(tmp, "llm.onnx"), os.path.join(tmp, "out.onnx")
    try:
        n_nodes = _make_model(nodes, src)
        size_mb = os.path.getsize(src) / 1e6
        print(f"graph: {n_nodes} nodes, {size_mb:.1f} MB ({src})", flush=True)

        def run_a():
            onnx.save(onnx.load(src), out)

        def run_b():
            onnx.save(gs.export_onnx(gs.import_onnx(onnx.load(src))), out)

        stages: dict = {}
        canon: list = []

        def run_q():
            m = load_model(src)
            t = time.perf_counter()
            run_pipeline(m, "canonicalize")
            canon.append(time.perf_counter() - t)
            save_model(m, out)

        a = _median_time(run_a, runs)
        print(f"A onnx load+save          {a:7.2f} s", flush=True)
        b = _median_time(run_b, runs)
        print(f"B graphsurgeon round trip {b:7.2f} s", flush=True)
        with _stage_timers(stages):
            q = _median_time(run_q, runs)
        print(f"Q qcompiler round trip    {q:7.2f} s", flush=True)
        skip = 1  # the warm-up call
        breakdown = {
            "parse": statistics.median(stages["load_proto"][skip:]),
            "import": statistics.median(stages["model_from_proto"][skip:]),
            "canonicalize": statistics.median(canon[skip:]),
            # save_model builds bytes directly (model_to_byte_pieces) unless it writes external data
            "export": statistics.median((stages.get("model_to_byte_pieces") or stages["model_to_proto"])[skip:]),
        }
        breakdown["serialize"] = max(0.0, q - sum(breakdown.values()))

        out_nodes = len(onnx.load(out, load_external_data=False).graph.node)
        result = {"nodes": n_nodes, "file_mb": round(size_mb, 1), "runs": runs, "A_s": a, "B_s": b, "Q_s": q,
                  "Q_over_A": q / a, "Q_over_B": q / b, "Q_breakdown_s": breakdown, "out_nodes": out_nodes}

        model = load_model(src)
        run_pipeline(model, "canonicalize")
        if verify:
            from qcompiler.ir import verify as verify_ir
            t = time.perf_counter()
            verify_ir(model.graph)
            result["verify_s"] = time.perf_counter() - t
        result.update(_bench_matches(model.graph, runs))
        return result
    finally:
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))
        os.rmdir(tmp)


def _bench_matches(graph, runs: int) -> dict:
    """Time finding every LayerNorm and GELU match (both patterns in one measurement)."""
    try:
        from qcompiler.patterns import find_matches
    except ImportError as e:
        return {"match_s": None, "match_note": f"skipped: qcompiler.patterns.find_matches not importable ({e})"}
    counts = {}

    def run():
        for name in ("layernorm", "gelu"):
            counts[name] = len(find_matches(graph, name))

    try:
        t = _median_time(run, runs)
    except Exception as e:  # a pattern not registered yet is a note, not a crash
        return {"match_s": None, "match_note": f"skipped: {type(e).__name__}: {e}"}
    return {"match_s": t, "match_counts": dict(counts)}


def _mark(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def report(r: dict) -> None:
    bd = r["Q_breakdown_s"]
    rows = [
        ("A  onnx load+save (baseline)", f"{r['A_s']:.2f} s", ""),
        ("B  graphsurgeon import+export (baseline)", f"{r['B_s']:.2f} s", ""),
        ("Q  qcompiler load+canonicalize+save", f"{r['Q_s']:.2f} s", ""),
        ("     parse (protobuf)", f"{bd['parse']:.2f} s", ""),
        ("     import (proto -> IR)", f"{bd['import']:.2f} s", ""),
        ("     canonicalize", f"{bd['canonicalize']:.2f} s", ""),
        ("     export + serialize (IR -> bytes)", f"{bd['export']:.2f} s", ""),
        ("     write (and the rest)", f"{bd['serialize']:.2f} s", ""),
        ("Q/A (onnx baseline)", f"{r['Q_over_A']:.2f}", f"target <= {TARGET_Q_OVER_A}  "
                                                         f"{_mark(r['Q_over_A'] <= TARGET_Q_OVER_A)}"),
        ("Q/B (graphsurgeon baseline)", f"{r['Q_over_B']:.2f}", f"target <= {TARGET_Q_OVER_B}  "
                                                                 f"{_mark(r['Q_over_B'] <= TARGET_Q_OVER_B)}"),
    ]
    if r.get("match_s") is not None:
        c = r["match_counts"]
        rows.append((f"find LayerNorm ({c['layernorm']}) + GELU ({c['gelu']}) matches", f"{r['match_s']:.2f} s",
                     f"target < {TARGET_MATCH_S} s  {_mark(r['match_s'] < TARGET_MATCH_S)}"))
    else:
        rows.append(("find LayerNorm + GELU matches", "-", r["match_note"]))
    if "verify_s" in r:
        rows.append(("verify (invariants, not in Q)", f"{r['verify_s']:.2f} s", ""))
    print()
    print(f"IR benchmark: {r['nodes']} nodes in, {r['out_nodes']} out, {r['file_mb']} MB, median of {r['runs']} runs")
    w = max(len(x[0]) for x in rows)
    for name, val, note in rows:
        print(f"  {name:<{w}}  {val:>8}  {note}")
    print(json.dumps({k: (round(v, 4) if isinstance(v, float) else
                          {kk: round(vv, 4) for kk, vv in v.items()} if k == "Q_breakdown_s" else v)
                      for k, v in r.items()}))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=90_000, help="minimum node count of the generated graph")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per measurement (median; one warm-up first)")
    ap.add_argument("--verify", action="store_true", help="also run qcompiler.ir.verify once (untimed in Q)")
    args = ap.parse_args(argv)
    if _graphsurgeon() is None:     # before the minutes spent building the graph
        print(GS_MISSING, file=sys.stderr)
        return 2
    report(bench(args.nodes, max(1, args.runs), args.verify))
    return 0


if __name__ == "__main__":
    sys.exit(main())
