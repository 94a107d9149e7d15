"""Every calibration scheme on corpus models: task metric, calibration time, and the ratios to min_max.

usage: python benchmarks/bench_schemes.py [--corpus DIR] [--models digits_cnn,ppocr_cls] [--schemes a,b] [--out DIR]

min_max runs first; each scheme's row gives the eval.py metric, the metric minus min_max's (issue 12 item 5: no
scheme more than 0.5 point below), calibration seconds and their ratio to min_max's (at most 3x), and how many
activations the scheme clipped by more than `CLIP_WARN_FRACTION` of their observed range
(`observers.clipped_fractions`). Each quantization runs in this process, one after the other.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CORPUS = os.environ.get("QC_CORPUS", os.path.join(HERE, "..", "..", "shared", "corpus"))
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
    a = ap.parse_args()
    from qcompiler.quant import api
    from qcompiler.quant import calibrate as calibrate_module
    from qcompiler.quant.api import quantize
    from qcompiler.quant.calibrate import clipped_fractions
    from qcompiler.quant.observers import CLIP_WARN_FRACTION
    captured = []
    real_calibrate = calibrate_module.calibrate

    def calibrate(*args, **kw):   # keep the CalibrationResult for clipped_fractions
        captured.append(real_calibrate(*args, **kw))
        return captured[-1]

    for module in (api, calibrate_module):   # wherever the pipeline looks it up
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
            captured.clear()
            total = time.perf_counter() - t0
            out = os.path.join(out_dir, f"{m}.{s}.onnx")
            res.save(out)
            ev = evaluate(md, out)
            row = {"model": m, "scheme": s, "value": ev["value"] if ev else None,
                   "calib_s": round(res.stats["calibration_seconds"], 3), "total_s": round(total, 2),
                   "warned": sum(1 for f in clipped.values() if f > CLIP_WARN_FRACTION),
                   "max_clip": round(max(clipped.values(), default=0.0), 3)}
            if s == "min_max":
                base = row
            row["delta_pts"] = None if row["value"] is None else round(100 * (row["value"] - base["value"]), 2)
            row["calib_ratio"] = round(row["calib_s"] / max(base["calib_s"], 1e-9), 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print()
    hdr = f"{'model':<11}{'scheme':<13}{'metric':>8}{'Δ pts':>8}{'calib s':>9}{'×min_max':>9}{'total s':>9}{'warned':>8}{'max clip':>9}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        v = "n/a" if r["value"] is None else f"{r['value']:.4f}"
        d = "" if r["delta_pts"] is None else f"{r['delta_pts']:+.2f}"
        print(f"{r['model']:<11}{r['scheme']:<13}{v:>8}{d:>8}{r['calib_s']:>9.2f}{r['calib_ratio']:>9.2f}"
              f"{r['total_s']:>9.2f}{r['warned']:>8}{r['max_clip']:>9.3f}")


if __name__ == "__main__":
    main()
