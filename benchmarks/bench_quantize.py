"""Quantize every corpus model with qcompiler and with onnxruntime's quantize_static, side by side.

usage: python benchmarks/bench_quantize.py [--corpus DIR] [--models a,b] [--out DIR]

Per model and tool it prints: the task metric from the model's eval.py, the output SQNR against float on the
first 64 eval samples, quantization wall time, CPU time (all threads; the steadier figure on a loaded machine) and peak RSS (each tool
in its own process, imports included), the ratio of
quantization time to one float inference pass over the calibration data, and onnxruntime CPU latency of the
produced model (default session options = ORT_ENABLE_ALL, one sample per run, median). Ratios are qcompiler/ORT.
AIMET-ONNX and INC figures come from the corpus README (they need their own venvs; see anchors section F).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnxruntime as ort

from qcompiler.sqnr import db_from_powers, powers

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CORPUS = os.environ.get("QC_CORPUS", os.path.join(HERE, "..", "..", "shared", "corpus"))


def session(path):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def samples(npz_path, limit=None):
    d = np.load(npz_path, allow_pickle=False)
    keys = [k for k in d.files if k != "labels"]
    n = d[keys[0]].shape[0] if limit is None else min(limit, d[keys[0]].shape[0])
    return [{k: d[k][i] for k in keys} for i in range(n)]


def float_pass_seconds(model, calib):
    s = session(model)
    names = {i.name for i in s.get_inputs()}
    s.run(None, {k: v for k, v in calib[0].items() if k in names})
    t0 = time.perf_counter()
    for f in calib:
        s.run(None, {k: v for k, v in f.items() if k in names})
    return time.perf_counter() - t0


def outputs(path, feeds):
    s = session(path)
    names = {i.name for i in s.get_inputs()}
    return [s.run(None, {k: v for k, v in f.items() if k in names}) for f in feeds]


def sqnr(ref, got):
    num = den = 0.0
    for r, g in zip(ref, got):
        for a, b in zip(r, g):
            if np.asarray(a).dtype.kind != "f":
                continue
            signal, noise = powers(a, b)
            num += signal
            den += noise
    return db_from_powers(num, den)


def latencies_ms(paths: dict, feeds, n=30, rounds=10) -> dict:
    """Median ms per single-sample run for each model, measured in interleaved rounds (a burst of load on the
    shared machine then hits every model alike, instead of whichever happened to run at that moment)."""
    sessions = {k: session(p) for k, p in paths.items()}
    names = {k: {i.name for i in s.get_inputs()} for k, s in sessions.items()}
    feeds = feeds[:n]
    times = {k: [] for k in sessions}
    for k, s in sessions.items():
        for f in feeds[:5]:
            s.run(None, {a: b for a, b in f.items() if a in names[k]})
    for _ in range(rounds):
        for k, s in sessions.items():
            for f in feeds:
                feed = {a: b for a, b in f.items() if a in names[k]}
                t0 = time.perf_counter()
                s.run(None, feed)
                times[k].append(time.perf_counter() - t0)
    return {k: 1000 * float(np.median(v)) for k, v in times.items()}


def evaluate(md, cand):
    r = subprocess.run([sys.executable, os.path.join(md, "eval.py"), cand, "--float", os.path.join(md, "model.onnx")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None, (r.stderr.strip().splitlines() or ["eval failed"])[-1]
    return json.loads(r.stdout.strip().splitlines()[-1]), None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=DEFAULT_CORPUS)
    ap.add_argument("--models", default="")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    corpus = os.path.abspath(a.corpus)
    models = [m for m in (a.models.split(",") if a.models else sorted(os.listdir(corpus)))
              if os.path.isfile(os.path.join(corpus, m, "model.onnx"))]
    out_dir = a.out or tempfile.mkdtemp(prefix="qc_bench_")
    os.makedirs(out_dir, exist_ok=True)
    rows = []
    print(f"corpus {corpus}; outputs in {out_dir}; onnxruntime {ort.__version__}, default session options (ORT_ENABLE_ALL)")
    for m in models:
        md = os.path.join(corpus, m)
        fmodel = os.path.join(md, "model.onnx")
        calib = samples(os.path.join(md, "calib.npz"))
        ev = samples(os.path.join(md, "eval.npz"), 64)
        fpass = float_pass_seconds(fmodel, calib)
        ref = outputs(fmodel, ev)
        for tool in ("ort", "qcompiler"):
            out = os.path.join(out_dir, f"{m}.{tool}.onnx")
            r = subprocess.run([sys.executable, os.path.join(HERE, "quant_runner.py"), tool, md, out],
                               capture_output=True, text=True)
            row = {"model": m, "tool": tool}
            if r.returncode != 0:
                row["error"] = (r.stderr.strip().splitlines() or ["failed"])[-1][:200]
                rows.append(row)
                print(json.dumps(row))
                continue
            row.update(json.loads(r.stdout.strip().splitlines()[-1]))
            res, err = evaluate(md, out)
            row["metric"] = res["metric"] if res else None
            row["value"] = res["value"] if res else None
            if err:
                row["eval_error"] = err[:200]
            row["sqnr_db"] = round(sqnr(ref, outputs(out, ev)), 2)
            row["time_vs_float_pass"] = round(row["seconds"] / max(fpass, 1e-9), 2)
            row["_path"] = out
            rows.append(row)
        row_f = {"model": m, "tool": "float", "float_pass_s": round(fpass, 3), "_path": fmodel}
        rows.append(row_f)
        mine = [r for r in rows if r["model"] == m and "_path" in r]
        lat = latencies_ms({r["tool"]: r["_path"] for r in mine}, ev)
        for r in mine:
            r["latency_ms"] = round(lat[r["tool"]], 3)
            del r["_path"]
            print(json.dumps(r))
    print()
    hdr = (f"{'model':<11}{'tool':<10}{'metric':<22}{'value':>8}{'SQNR dB':>9}{'quant s':>9}{'cpu s':>8}{'peak MB':>9}"
           f"{'t/float':>9}{'lat ms':>8}")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        if r["tool"] == "float":
            print(f"{r['model']:<11}{'float':<10}{'':<22}{'':>8}{'':>9}{'':>9}{'':>8}{'':>9}{'':>9}{r['latency_ms']:>8.3f}")
            continue
        if "error" in r:
            print(f"{r['model']:<11}{r['tool']:<10}ERROR {r['error'][:80]}")
            continue
        v = f"{r['value']:.4f}" if r.get("value") is not None else "n/a"
        print(f"{r['model']:<11}{r['tool']:<10}{(r['metric'] or ''):<22}{v:>8}{r['sqnr_db']:>9.2f}{r['seconds']:>9.2f}{r.get('cpu_seconds', float('nan')):>8.2f}"
              f"{r['peak_rss_mb']:>9.0f}{r['time_vs_float_pass']:>9.2f}{r['latency_ms']:>8.3f}")
    print()
    for m in models:
        q = next((r for r in rows if r["model"] == m and r["tool"] == "qcompiler" and "error" not in r), None)
        o = next((r for r in rows if r["model"] == m and r["tool"] == "ort" and "error" not in r), None)
        if q and o:
            print(f"{m}: metric qcompiler {q['value']} vs ORT {o['value']}; quant time ratio qcompiler/ORT "
                  f"wall {q['seconds'] / o['seconds']:.2f}, cpu {q['cpu_seconds'] / max(o['cpu_seconds'], 1e-9):.2f}; "
                  f"latency ratio qcompiler/ORT {q['latency_ms'] / o['latency_ms']:.2f}")


if __name__ == "__main__":
    main()
