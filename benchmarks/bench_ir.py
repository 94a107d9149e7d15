"""IR round-trip benchmark: qcompiler load + canonicalize + save against onnx and onnx-graphsurgeon, same run.

Why: a pass pipeline on an exported LLM (~90k nodes) must not cost much more than reading and writing the file,
and a command must not pay at start-up for the parts of qcompiler it does not use.
Baselines, measured on the same temp file as Q, in process and as whole processes (`python -c ...` against
`python -m qcompiler run`, so interpreter start-up and imports count):
    A  onnx.load(p) + onnx.save(m, p2)                                         (floor: parse + serialize)
    B  gs.import_onnx(onnx.load(p)) + onnx.save(gs.export_onnx(g), p2)         (onnx-graphsurgeon)
    Q  load_model(p) + run_pipeline(m, "canonicalize") + save_model(m, p2)      (qcompiler)
       as a process: qcompiler run p -o p2 --pipeline canonicalize
    L  onnx.load(p) against M  load_model(p)                                    (the import alone, in process)
Then the start-up of each command on a two-node model (`--help`, `run`, `inspect`, `match`, `list-passes`,
`quantize --help`).
Targets: Q/A <= 1.5 and Q/B <= 1.0 (in process and as whole processes), M/L <= 2.0, `qcompiler --help` < 0.15 s,
finding every LayerNorm and GELU match < 2 s. The measurements are interleaved (A, B, Q, A, B, Q, ...) and each
is the best of --runs runs after one warm-up: on a shared machine the ratios of the same run are what compare,
and the CPU seconds (user + system) beside the wall times vary less with other jobs. Exit status is 0 even when a
target is missed (this measures, it does not test); a missed target is printed as MISSED. The last line is JSON.

    python benchmarks/bench_ir.py [--nodes 90000] [--runs 3] [--verify] [--no-processes]

onnx-graphsurgeon is an optional extra (`pip install -e '.[bench]'`); without it B is skipped with a note.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if __package__ in (None, ""):  # run as a script: make `benchmarks` and `qcompiler` importable from the repo
    sys.path.insert(0, ROOT)
    if sys.path[1:2] == [HERE]:
        del sys.path[1]

import onnx  # noqa: E402

TARGET_Q_OVER_A = 1.5
TARGET_Q_OVER_B = 1.0
TARGET_LOAD_RATIO = 2.0
TARGET_HELP_S = 0.15
TARGET_MATCH_S = 2.0
GS_MISSING = ("onnx-graphsurgeon (baseline B) is not installed, B skipped; it is an optional extra: "
              "pip install -e '.[bench]'  (or: pip install 'onnx-graphsurgeon>=0.5')")


def _interleaved(fns: dict, runs: int) -> dict:
    """{label: (best wall s, best CPU s)}: one warm-up round, then `runs` rounds calling every function in turn
    (GC collected between calls, not during)."""
    best = {k: (float("inf"), float("inf")) for k in fns}
    for r in range(runs + 1):
        for k, fn in fns.items():
            gc.collect()
            t, c = time.perf_counter(), time.process_time()
            fn()
            t, c = time.perf_counter() - t, time.process_time() - c
            if r:
                best[k] = (min(best[k][0], t), min(best[k][1], c))
    return best


def _process_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _run_process(argv: list, env: dict) -> tuple:
    """(wall s, CPU s of the child) of one process; a failure stops the benchmark with the child's stderr."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise SystemExit(f"bench_ir.py: {' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()[-400:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _interleaved_processes(commands: dict, runs: int) -> dict:
    """{label: (best wall s, best CPU s)} of whole processes, interleaved like `_interleaved`."""
    env = _process_env()
    best = {k: (float("inf"), float("inf")) for k in commands}
    for r in range(runs + 1):
        for k, argv in commands.items():
            wall, cpu = _run_process(argv, env)
            if r:
                best[k] = (min(best[k][0], wall), min(best[k][1], cpu))
    return best


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


def _make_small_model(path: str) -> None:
    """Two nodes: the start-up of a command is then its imports, not its work."""
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                           helper.make_node("Neg", ["r"], ["y"], name="neg")], "small", [x], [y])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def _graphsurgeon():
    """onnx_graphsurgeon, or None when it is not installed (it is the `bench` extra, not a requirement)."""
    try:
        import onnx_graphsurgeon as gs
    except ImportError:
        return None
    return gs


def bench(nodes: int, runs: int, verify: bool, processes: bool = True) -> dict:
    gs = _graphsurgeon()
    from qcompiler import load_model, save_model
    from qcompiler.passmanager import run_pipeline

    tmp = tempfile.mkdtemp(prefix="bench_ir_")
    src, out = os.path.join(tmp, "llm.onnx"), os.path.join(tmp, "out.onnx")
    small, small_out = os.path.join(tmp, "small.onnx"), os.path.join(tmp, "small_out.onnx")
    try:
        n_nodes = _make_model(nodes, src)
        _make_small_model(small)
        size_mb = os.path.getsize(src) / 1e6
        print(f"graph: {n_nodes} nodes, {size_mb:.1f} MB ({src})", flush=True)

        stages: dict = {}
        canon: list = []

        def run_q():
            m = load_model(src)
            t = time.perf_counter()
            run_pipeline(m, "canonicalize")
            canon.append(time.perf_counter() - t)
            save_model(m, out)

        fns = {"A": lambda: onnx.save(onnx.load(src), out)}
        if gs is not None:
            fns["B"] = lambda: onnx.save(gs.export_onnx(gs.import_onnx(onnx.load(src))), out)
        fns["Q"] = run_q
        fns["L"] = lambda: onnx.load(src)
        fns["M"] = lambda: load_model(src)
        with _stage_timers(stages):
            inproc = _interleaved(fns, runs)
        print("in process: " + ", ".join(f"{k} {v[0]:.2f} s" for k, v in inproc.items()), flush=True)
        q_calls = stages["model_to_byte_pieces" if "model_to_byte_pieces" in stages else "model_to_proto"]
        skip = 1  # the warm-up call
        breakdown = {
            # Q's calls of load_proto/model_from_proto are every other one (M calls them too)
            "parse": min(stages["load_proto"][2 * skip::2]),
            "import": min(stages["model_from_proto"][2 * skip::2]),
            "canonicalize": min(canon[skip:]),
            # save_model builds bytes directly (model_to_byte_pieces) unless it writes external data
            "export": min(q_calls[skip:]),
        }
        result = {"nodes": n_nodes, "file_mb": round(size_mb, 1), "runs": runs,
                  "in_process": {k: {"wall_s": w, "cpu_s": c} for k, (w, c) in inproc.items()},
                  "Q_breakdown_s": breakdown}
        if gs is None:
            result["note"] = GS_MISSING
        if processes:
            py = [sys.executable, "-c"]
            cmds = {"A": py + [f"import onnx; onnx.save(onnx.load({src!r}), {out!r})"]}
            if gs is not None:
                cmds["B"] = py + ["import onnx, onnx_graphsurgeon as gs; "
                                  f"onnx.save(gs.export_onnx(gs.import_onnx(onnx.load({src!r}))), {out!r})"]
            cmds["Q"] = [sys.executable, "-m", "qcompiler", "run", src, "-o", out, "--pipeline", "canonicalize"]
            whole = _interleaved_processes(cmds, runs)
            print("whole processes: " + ", ".join(f"{k} {v[0]:.2f} s" for k, v in whole.items()), flush=True)
            result["processes"] = {k: {"wall_s": w, "cpu_s": c} for k, (w, c) in whole.items()}
            qc = [sys.executable, "-m", "qcompiler"]
            startup = _interleaved_processes({
                "python -c pass": [sys.executable, "-c", "pass"],
                "qcompiler --help": qc + ["--help"],
                "qcompiler run SMALL --pipeline canonicalize": qc + ["run", small, "-o", small_out, "--pipeline",
                                                                    "canonicalize"],
                "qcompiler inspect SMALL": qc + ["inspect", small],
                "qcompiler match SMALL layernorm": qc + ["match", small, "layernorm"],
                "qcompiler list-passes": qc + ["list-passes"],
                "qcompiler quantize --help": qc + ["quantize", "--help"],
            }, runs)
            result["startup"] = {k: {"wall_s": w, "cpu_s": c} for k, (w, c) in startup.items()}

        out_nodes = len(onnx.load(out, load_external_data=False).graph.node)
        result["out_nodes"] = out_nodes
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
        t = _interleaved({"match": run}, runs)["match"][0]
    except Exception as e:  # a pattern not registered yet is a note, not a crash
        return {"match_s": None, "match_note": f"skipped: {type(e).__name__}: {e}"}
    return {"match_s": t, "match_counts": dict(counts)}


def _mark(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def _ratio_rows(times: dict, prefix: str) -> list:
    rows = []
    for num, den, target, what in (("Q", "A", TARGET_Q_OVER_A, "onnx load+save"),
                                   ("Q", "B", TARGET_Q_OVER_B, "graphsurgeon round trip"),
                                   ("M", "L", TARGET_LOAD_RATIO, "load_model / onnx.load")):
        if num in times and den in times:
            w = times[num]["wall_s"] / times[den]["wall_s"]
            c = times[num]["cpu_s"] / times[den]["cpu_s"]
            rows.append((f"{prefix}{num}/{den} ({what})", f"{w:.2f}", f"{c:.2f}",
                         f"target <= {target}  {_mark(w <= target)}"))
    return rows


def report(r: dict) -> None:
    labels = {"A": "A  onnx load+save", "B": "B  graphsurgeon import+export", "Q": "Q  qcompiler load+canonicalize+save",
              "L": "L  onnx.load", "M": "M  qcompiler load_model"}
    rows = [("in process", "wall", "cpu", "")]
    ip = r["in_process"]
    for k, v in ip.items():
        rows.append(("  " + labels[k], f"{v['wall_s']:.2f} s", f"{v['cpu_s']:.2f} s", ""))
    for name, v in r["Q_breakdown_s"].items():
        rows.append((f"     Q: {name}", f"{v:.2f} s", "", ""))
    rows += _ratio_rows(ip, "  ")
    if "processes" in r:
        rows.append(("whole processes", "", "", ""))
        pr = r["processes"]
        plabels = {"A": "A  python -c onnx load+save", "B": "B  python -c graphsurgeon round trip",
                   "Q": "Q  qcompiler run BIG -o OUT --pipeline canonicalize"}
        for k, v in pr.items():
            rows.append(("  " + plabels[k], f"{v['wall_s']:.2f} s", f"{v['cpu_s']:.2f} s", ""))
        rows += _ratio_rows(pr, "  ")
        rows.append(("start-up (two-node model)", "", "", ""))
        for k, v in r["startup"].items():
            note = f"target < {TARGET_HELP_S} s  {_mark(v['wall_s'] < TARGET_HELP_S)}" if k == "qcompiler --help" else ""
            rows.append(("  " + k, f"{v['wall_s']:.3f} s", f"{v['cpu_s']:.3f} s", note))
    if r.get("match_s") is not None:
        c = r["match_counts"]
        rows.append((f"find LayerNorm ({c['layernorm']}) + GELU ({c['gelu']}) matches", f"{r['match_s']:.2f} s", "",
                     f"target < {TARGET_MATCH_S} s  {_mark(r['match_s'] < TARGET_MATCH_S)}"))
    else:
        rows.append(("find LayerNorm + GELU matches", "-", "", r["match_note"]))
    if "verify_s" in r:
        rows.append(("verify (invariants, not in Q)", f"{r['verify_s']:.2f} s", "", ""))
    print()
    print(f"IR benchmark: {r['nodes']} nodes in, {r['out_nodes']} out, {r['file_mb']} MB, best of {r['runs']} "
          f"interleaved runs")
    if r.get("note"):
        print(f"  note: {r['note']}")
    w = max(len(x[0]) for x in rows)
    for name, wall, cpu, note in rows:
        print(f"  {name:<{w}}  {wall:>9}  {cpu:>9}  {note}")

    def rounded(x):
        if isinstance(x, float):
            return round(x, 4)
        if isinstance(x, dict):
            return {k: rounded(v) for k, v in x.items()}
        return x
    print(json.dumps(rounded(r)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=90_000, help="minimum node count of the generated graph")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per measurement (best; one warm-up first)")
    ap.add_argument("--verify", action="store_true", help="also run qcompiler.ir.verify once (untimed in Q)")
    ap.add_argument("--no-processes", action="store_true", help="skip the whole-process and start-up timings")
    args = ap.parse_args(argv)
    if _graphsurgeon() is None:
        print(f"bench_ir.py: {GS_MISSING}", file=sys.stderr)
    report(bench(args.nodes, max(1, args.runs), args.verify, processes=not args.no_processes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
