"""Every calibration scheme on corpus models: task metric, calibration time, and the ratios to min_max.

usage: python benchmarks/bench_schemes.py [--corpus DIR] [--models digits_cnn,ppocr_cls] [--schemes a,b] [--out DIR]
                                          [--subsets K]

min_max runs first; each scheme's row gives the eval.py metric, the metric minus min_max's (no
scheme more than 0.5 point below), calibration seconds (wall clock and the process's CPU time: onnxruntime's
thread plus the observers', steadier on a loaded machine) and their ratio to min_max's (at most 3x), the range
search's seconds (`assign-encodings`, after calibration), and how many activations the scheme clipped by more
than `CLIP_WARN_FRACTION` of their observed range (`observers.clipped_fractions`). Each quantization runs in this
process, one after the other.

`--subsets K` also quantizes with K random 7/8 subsets of calib.npz (seeds 0..K-1) and prints each scheme's mean,
min and max metric over them: on ppocr_cls min_max alone moves from 0.975 to 0.99 between subsets (400 eval
images, a handful of them within the quantization noise of the decision boundary), so one calibration set cannot
tell a 0.5-point difference from luck.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CORPUS = os.environ.get("QC_CORPUS", next(
    (d for d in (os.path.join(HERE, "..", "..", "shared", "corpus"), "/work/shared/corpus") if os.path.isdir(d)),
    "/work/shared/corpus"))
SCHEMES = ("min_max", "tf_enhanced", "percentile", "entropy", "mse")


def evaluate(md, cand):
    r = subprocess.run([sys.executable, os.path.join(md, "eval.py"), cand, "--float", os.path.join(md, "model.onnx")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=DEFAULT_CORPUS)
    ap.add_argument("--models", default="digits_cnn,ppocr_cls")
    ap.add_argument("--schemes", default=",".join(SCHEMES))
    ap.add_argument("--out", default="")
    ap.add_argument("--subsets", type=int, default=0)
    a = ap.parse_args()
    from qcompiler.quant import api
    from qcompiler.quant.calibration import calibrate as calibrate_module
    from qcompiler.quant.api import quantize
    from qcompiler.quant.calibration.calibrate import clipped_fractions
    from qcompiler.quant.calibration.observers import CLIP_WARN_FRACTION
    import qcompiler.passes.quantize.calibrate as calibrate_pass
    captured, cpu = [], []
    real_calibrate = calibrate_module.calibrate

    def calibrate(*args, **kw):   # keep the CalibrationResult for clipped_fractions, and its CPU seconds
        c0 = time.process_time()
        captured.append(real_calibrate(*args, **kw))
        cpu.append(time.process_time() - c0)
        return captured[-1]

    for module in (api, calibrate_module, calibrate_pass):   # wherever the pipeline looks it up
        if getattr(module, "calibrate", None) is real_calibrate:
            module.calibrate = calibrate
    out_dir = a.out or tempfile.mkdtemp(prefix="qc_schemes_")
    os.makedirs(out_dir, exist_ok=True)
    schemes = [s for s in a.schemes.split(",") if s]
    if "min_max" in schemes:
        schemes.remove("min_max")
    schemes.insert(0, "min_max")
    rows = []
    for m in a.models.split(","):
        md = os.path.join(os.path.abspath(a.corpus), m)
        base = None
        for s in schemes:
            t0 = time.perf_counter()
            res = quantize(os.path.join(md, "model.onnx"), os.path.join(md, "calib.npz"), scheme=s)
            clipped = clipped_fractions(captured[-1], res.encodings["activations"]) if captured else {}
            calib_cpu = cpu[-1] if cpu else float("nan")
            captured.clear()
            cpu.clear()
            total = time.perf_counter() - t0
            out = os.path.join(out_dir, f"{m}.{s}.onnx")
            res.save(out)
            ev = evaluate(md, out)
            row = {"model": m, "scheme": s, "value": ev["value"] if ev else None,
                   "calib_s": round(res.stats["calibration_seconds"], 3), "calib_cpu_s": round(calib_cpu, 3),
                   "search_s": round(res.report["seconds"].get("assign-encodings", 0.0), 3), "total_s": round(total, 2),
                   "warned": sum(1 for f in clipped.values() if f > CLIP_WARN_FRACTION),
                   "max_clip": round(max(clipped.values(), default=0.0), 3)}
            if s == "min_max":
                base = row
            row["delta_pts"] = None if row["value"] is None else round(100 * (row["value"] - base["value"]), 2)
            row["calib_ratio"] = round(row["calib_s"] / max(base["calib_s"], 1e-9), 2)
            row["cpu_ratio"] = round(row["calib_cpu_s"] / max(base["calib_cpu_s"], 1e-9), 2)
            if a.subsets:
                vals = subset_metrics(md, s, a.subsets, out_dir, quantize)
                row["subsets"] = {"mean": round(float(sum(vals) / len(vals)), 4), "min": min(vals), "max": max(vals)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    hdr = (f"{'model':<11}{'scheme':<13}{'metric':>8}{'Δ pts':>8}{'calib s':>9}{'×min_max':>9}{'cpu s':>8}"
           f"{'×min_max':>9}{'search s':>9}{'total s':>9}{'warned':>7}{'max clip':>9}")
    if a.subsets:
        hdr += f"  subsets mean [min..max] (K={a.subsets})"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        v = "n/a" if r["value"] is None else f"{r['value']:.4f}"
        d = "" if r["delta_pts"] is None else f"{r['delta_pts']:+.2f}"
        line = (f"{r['model']:<11}{r['scheme']:<13}{v:>8}{d:>8}{r['calib_s']:>9.2f}{r['calib_ratio']:>9.2f}"
                f"{r['calib_cpu_s']:>8.2f}{r['cpu_ratio']:>9.2f}{r['search_s']:>9.2f}{r['total_s']:>9.2f}"
                f"{r['warned']:>7}{r['max_clip']:>9.3f}")
        if "subsets" in r:
            sub = r["subsets"]
            line += f"  {sub['mean']:.4f} [{sub['min']:.4f}..{sub['max']:.4f}]"
        print(line)


def subset_metrics(md, scheme, k, out_dir, quantize):
    """The eval metric of `scheme` calibrated on k random 7/8 subsets of calib.npz (seeds 0..k-1)."""
    import numpy as np
    data = np.load(os.path.join(md, "calib.npz"))
    arrays = {key: data[key] for key in data.files}
    n = len(next(iter(arrays.values())))
    vals = []
    for seed in range(k):
        idx = np.sort(np.random.default_rng(seed).choice(n, max(1, n * 7 // 8), replace=False))
        sub = os.path.join(out_dir, f"{os.path.basename(md)}.calib{seed}.npz")
        if not os.path.exists(sub):
            np.savez(sub, **{key: arr[idx] for key, arr in arrays.items()})
        cand = os.path.join(out_dir, f"{os.path.basename(md)}.{scheme}.sub{seed}.onnx")
        quantize(os.path.join(md, "model.onnx"), sub, scheme=scheme).save(cand)
        ev = evaluate(md, cand)
        if ev is not None:
            vals.append(ev["value"])
    return vals or [float("nan")]


if __name__ == "__main__":
    main()
