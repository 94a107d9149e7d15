"""SmoothQuant on minilm_l6: mean cosine with and without `--recipe smoothquant`, per setting.

usage: python benchmarks/bench_smoothquant.py [--corpus DIR] [--alpha A] [--runs 40] [--no-latency] [--only TEXT]

Settings (the corpus model and its calib.npz are read in place, never copied; each candidate is scored by the
model's own eval.py, mean cosine to the float sentence embedding over 200 sentences):
- `default`: qcompiler's defaults for ort_cpu (activations 8 bits cannot carry widened to 16, and those left
  float when no integer kernel reads them: --optimize balanced).
- `W8A8`: every activation on an 8-bit grid (a profile {base: ort_cpu, wide_activation_bits: 8}: nothing
  widened), the safety net off, so the number is the plan as asked.
- `W8A8, residual stream float`: W8A8 with the residual stream (the dense Adds and the residual Adds, i.e. the
  LayerNorm inputs) excluded: what the MatMul inputs cost on their own.
- `W8A8 as in the paper (--config w8a8)`: the preset qcompiler/quant/settings/presets/w8a8.yaml, SmoothQuant's own
  definition (Xiao et al. 2023): int8 inputs and weights for the linear layers and the attention matmuls
  (every MatMul/Gemm), every element-wise op float. Run as a user would (safety net on); the target
  (mean cosine >= 0.995) is this row with smoothquant. The exact CLI command of each row is printed below the
  table. `seq-mse weights`: the same with Sequential MSE weight ranges (after smoothing the 7-bit per-channel
  weights cost as much as all the MatMul inputs together).
Each is run without and with smoothquant (alpha searched per layer, or --alpha for all). The table gives the
cosine (mean / min), how many MatMuls have int8 weights, the smoothquant folds (fold / fold+restore / explicit
Mul) and, unless --no-latency, the median CPU time of one sentence (qcompiler/quant/runtime/latency.py, clock="cpu",
interleaved, 1 thread) of the quantized model against float. The machine is shared: compare ratios in one run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

W8A8 = {"base": "ort_cpu", "wide_activation_bits": 8}
RESIDUAL_STREAM = [r"dense/Add$", r"output/Add$"]
SETTINGS = [("default", {}),
            ("W8A8", {"target": W8A8, "min_sqnr": float("-inf")}),
            ("W8A8, residual stream float", {"target": W8A8, "min_sqnr": float("-inf"), "exclude": RESIDUAL_STREAM}),
            ("W8A8 as in the paper (--config w8a8)", {"config": "w8a8"}),
            ("W8A8 as in the paper, seq-mse weights", {"config": "w8a8", "recipe": ["seq-mse"]})]
_W8A8_FILE = "w8a8_all.yaml"   # the W8A8 profile, written beside the commands


def _command(kw, sq, alpha, model, calib):
    """The `qcompiler quantize` line that makes the same model."""
    cmd = ["qcompiler", "quantize", model, "--calib", calib, "-o", "q.onnx"]
    if kw.get("config"):
        cmd += ["--config", kw["config"]]
    if kw.get("target"):
        cmd += ["--target", _W8A8_FILE]
    for e in kw.get("exclude", ()):
        cmd += ["--exclude", f"'{e}'"]
    if kw.get("min_sqnr") == float("-inf"):
        cmd += ["--min-sqnr", "-1000"]
    recipe = (["smoothquant"] if sq else []) + list(kw.get("recipe", ()))
    if sq and alpha is not None:
        cmd += ["--smoothquant-alpha", f"{alpha:g}"]
        recipe.remove("smoothquant")
    if recipe:
        cmd += ["--recipe", ",".join(recipe)]
    return " ".join(cmd + ["--allow-low-sqnr"])


def _cosine(folder, path):
    out = subprocess.run([sys.executable, os.path.join(folder, "eval.py"), path], capture_output=True, text=True,
                         check=True).stdout
    d = json.loads(out.strip().splitlines()[-1])
    return d["value"], d["min"]


def _latency(float_path, quant_path, runs):
    from qcompiler.onnx_io import load_model
    from qcompiler.quant.runtime.latency import measure_latency
    d = np.load(os.path.join(os.path.dirname(float_path), "eval.npz"))
    feed = {k: d[k][0] for k in d.files}
    lat = measure_latency(load_model(float_path), load_model(quant_path), feed=feed, runs=runs, threads=1, clock="cpu")
    return lat.float_ms, lat.quant_ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default="/work/shared/corpus")
    ap.add_argument("--alpha", type=float, default=None, help="fixed alpha (default: searched per layer)")
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--no-latency", action="store_true")
    ap.add_argument("--only", default=None, help="run only the settings whose label contains this text")
    a = ap.parse_args()
    folder = os.path.join(a.corpus, "minilm_l6")
    model = os.path.join(folder, "model.onnx")
    if not os.path.isfile(model):
        print(f"no minilm_l6 in {a.corpus}", file=sys.stderr)
        return 2
    from qcompiler.onnx_io import save_model
    from qcompiler.quant import quantize
    rows, commands = [], []
    calib = os.path.join(folder, "calib.npz")
    with tempfile.TemporaryDirectory() as tmp:
        for label, kw in SETTINGS:
            if a.only and a.only not in label:
                continue
            for sq in (False, True):
                commands.append((label, "smoothquant" if sq else "-", _command(kw, sq, a.alpha, model, calib)))
                extra = {"recipe": ["smoothquant"] + list(kw.get("recipe", ())), "smoothquant_alpha": a.alpha} \
                    if sq else {}
                r = quantize(model, os.path.join(folder, "calib.npz"), **dict(kw, **extra))
                path = os.path.join(tmp, f"q{len(rows)}.onnx")
                save_model(r.model, path)
                mean, low = _cosine(folder, path)
                int8 = sum(1 for k, v in r.report["layers"].items()
                           if k.endswith("MatMul") and "int8" in str(v.get("input1", "")))
                folds = ""
                if sq:
                    (st,) = [res.stats for p, res in r.passes if p.name == "smoothquant"]
                    c = st["fold_counts"]
                    folds = f"{c['fold']}/{c['fold+restore']}/{c['mul']} ({st['skipped']} skipped)"
                lat = "" if a.no_latency else "%.2f / %.2f ms" % _latency(model, path, a.runs)
                rows.append((label, "smoothquant" if sq else "-", f"{mean:.6f} / {low:.4f}", str(int8), folds, lat))
                print(" | ".join(rows[-1]), flush=True)
    print()
    print("| setting | recipe | mean / min cosine | MatMuls with int8 weights | fold / fold+restore / Mul | "
          "CPU ms float / quantized |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\ncommands (then `python {os.path.join(folder, 'eval.py')} q.onnx`; {_W8A8_FILE}: "
          f"{json.dumps(W8A8)}):")
    for label, rec, cmd in commands:
        print(f"- {label}, {rec}: {cmd}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
