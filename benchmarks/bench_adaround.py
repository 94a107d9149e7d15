#!/usr/bin/env python3
"""AdaRound on digits_cnn W4A8: qcompiler's `adaround` pass against aimet-onnx's apply_adaround,
same model, same calibration data, one run.

    python benchmarks/bench_adaround.py [--corpus DIR] [--model digits_cnn] [--aimet-iterations 10000] [--no-aimet]

Rows: float, qcompiler round-to-nearest W4A8 (`qcompiler quantize M --calib C --weight-bits 4`), qcompiler
AdaRound W4A8 (`... --recipe adaround`), and when aimet-onnx is installed (QCOMPILER_AIMET_PYTHON, default
/work/venv-aimet/bin/python) AIMET's plain W4A8 and AdaRound W4A8 (BatchNorm folded, int4 per-channel weights,
int8 activations, min_max, its per-channel config; apply_adaround with `--aimet-iterations`, then
compute_encodings and to_onnx_qdq). Each model is scored by the corpus's eval.py (top-1 on 360 images: one image
is 0.28 points). Wall times: the whole `quantize` call, the adaround pass alone, and AIMET's apply_adaround; then
a per-layer table (qcompiler: iterations, layer loss against round-to-nearest, seconds; AIMET: seconds per
adaround_module call). Target: top-1 drop <= 0.3 points against float, in at most half of AIMET's wall time.

Both sides run in their own fresh subprocess, one after the other (the machine is shared: the figures are wall
times under whatever load there is, so compare within one run).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_CORPUS = os.environ.get("QC_CORPUS", "/work/shared/corpus")
AIMET_PYTHON = os.environ.get("QCOMPILER_AIMET_PYTHON", "/work/venv-aimet/bin/python")
W4A8 = ["--weight-bits", "4", "--act-bits", "8"]


# --- the AIMET side (runs under AIMET's python; imports nothing from qcompiler) --------------------------------
def worker_aimet(model_path, calib_path, out, iterations):
    import numpy as np
    import onnx
    import aimet_onnx
    from aimet_onnx.adaround import adaround_optimizer as opt_mod
    from aimet_onnx.adaround.adaround_weight import Adaround
    from aimet_onnx.batch_norm_fold import fold_all_batch_norms_to_weight
    from aimet_onnx.quantsim import QuantizationSimModel
    model = onnx.load(model_path)
    data = dict(np.load(calib_path))
    feeds = [{k: v[i] for k, v in data.items()} for i in range(min(v.shape[0] for v in data.values()))]
    fold_all_batch_norms_to_weight(model)
    folded = os.path.join(out, "folded.onnx")
    onnx.save(model, folded)
    cfg = os.path.join(os.path.dirname(aimet_onnx.__file__), "common", "quantsim_config",
                       "default_config_per_channel.json")

    def sim():
        return QuantizationSimModel(onnx.load(folded), param_type="int4", activation_type="int8",
                                    quant_scheme="min_max", config_file=cfg)
    res = {}
    t = time.perf_counter()
    s = sim()
    s.compute_encodings(feeds)
    onnx.save(s.to_onnx_qdq(), os.path.join(out, "aimet_plain.onnx"))
    res["plain_seconds"] = time.perf_counter() - t
    del s
    per_layer = {}
    producer = {o: n.name for n in model.graph.node for o in n.output}   # module output -> node name
    orig = opt_mod.AdaroundOptimizer.adaround_module.__func__

    def timed(cls, module, *a, **k):
        t0 = time.perf_counter()
        r = orig(cls, module, *a, **k)
        out_name = module.outputs[0] if module.outputs else "?"
        per_layer[producer.get(out_name, out_name)] = time.perf_counter() - t0
        return r
    opt_mod.AdaroundOptimizer.adaround_module = classmethod(timed)
    t = time.perf_counter()
    s = sim()
    t_ada = time.perf_counter()
    Adaround.apply_adaround(s, feeds, num_iterations=iterations)
    res["adaround_seconds"] = time.perf_counter() - t_ada
    s.compute_encodings(feeds)
    onnx.save(s.to_onnx_qdq(), os.path.join(out, "aimet_adaround.onnx"))
    res["total_seconds"] = time.perf_counter() - t
    res["per_layer"] = per_layer
    return res


# --- the qcompiler side (a fresh process, like AIMET's) ---------------------------------------------------------
def worker_qcompiler(model_path, calib_path, out):
    from qcompiler.quant import quantize
    t = time.perf_counter()
    res = quantize(model_path, calib_path, weight_bits=4, act_bits=8, recipe="adaround")
    total = time.perf_counter() - t
    res.save(os.path.join(out, "qc_adaround.onnx"))
    stats = next(r.stats for p, r in res.passes if p.name == "adaround")
    return {"total_seconds": total, "adaround_seconds": res.report["seconds"].get("adaround"),
            "per_layer": stats["per_layer"], "skipped": stats["skipped"], "iterations": stats["iterations"]}


def worker_main(argv):
    if argv[0] == "aimet":
        out = worker_aimet(argv[1], argv[2], argv[3], int(argv[4]))
    else:
        out = worker_qcompiler(argv[1], argv[2], argv[3])
    print("RESULT " + json.dumps(out))


# --- the driver ---------------------------------------------------------------------------------------------------
def _worker(python, *args, timeout=3600):
    t = time.perf_counter()
    p = subprocess.run([python, os.path.abspath(__file__), "--worker", *map(str, args)], capture_output=True,
                       text=True, timeout=timeout, cwd=ROOT)
    wall = time.perf_counter() - t
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"worker failed (exit {p.returncode}): {(p.stderr or p.stdout).strip()[-800:]}")
    r = json.loads(line[7:])
    r["process_seconds"] = wall
    return r


def top1(corpus, model, candidate):
    p = subprocess.run([sys.executable, os.path.join(corpus, model, "eval.py"), candidate], capture_output=True,
                       text=True)
    if p.returncode:
        raise RuntimeError(f"eval failed: {p.stderr.strip()[-300:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def aimet_available() -> str:
    if not os.path.exists(AIMET_PYTHON):
        return f"no python at {AIMET_PYTHON}"
    p = subprocess.run([AIMET_PYTHON, "-c", "import aimet_onnx"], capture_output=True, text=True)
    return "" if p.returncode == 0 else f"{AIMET_PYTHON} cannot import aimet_onnx"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=DEFAULT_CORPUS)
    ap.add_argument("--model", default="digits_cnn")
    ap.add_argument("--aimet-iterations", type=int, default=10000)
    ap.add_argument("--no-aimet", action="store_true")
    args = ap.parse_args()
    folder = os.path.join(args.corpus, args.model)
    model, calib = os.path.join(folder, "model.onnx"), os.path.join(folder, "calib.npz")
    with tempfile.TemporaryDirectory() as out:
        rows = []
        # round to nearest, through the CLI as a user runs it
        rtn = os.path.join(out, "qc_rtn.onnx")
        t = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "qcompiler", "quantize", model, "--calib", calib, *W4A8, "-o", rtn,
                            "-q"], capture_output=True, text=True, cwd=ROOT)
        if p.returncode:
            raise SystemExit(f"qcompiler quantize failed: {p.stderr.strip()[-300:]}")
        rtn_s = time.perf_counter() - t
        ev = top1(args.corpus, args.model, rtn)
        flt = ev["float_value"]
        rows.append(("float", flt, "-", "-"))
        rows.append(("qcompiler W4A8 round-to-nearest", ev["value"], f"{rtn_s:.1f} (process)", "-"))
        qc = _worker(sys.executable, "qcompiler", model, calib, out)
        ev_qc = top1(args.corpus, args.model, os.path.join(out, "qc_adaround.onnx"))
        rows.append(("qcompiler W4A8 adaround", ev_qc["value"], f"{qc['total_seconds']:.1f} quantize, "
                     f"{qc['process_seconds']:.1f} process", f"{qc['adaround_seconds']:.1f} (adaround pass)"))
        why = "--no-aimet" if args.no_aimet else aimet_available()
        am = None
        if not why:
            am = _worker(AIMET_PYTHON, "aimet", model, calib, out, args.aimet_iterations, timeout=7200)
            ev_plain = top1(args.corpus, args.model, os.path.join(out, "aimet_plain.onnx"))
            ev_ada = top1(args.corpus, args.model, os.path.join(out, "aimet_adaround.onnx"))
            rows.append(("AIMET W4A8 plain", ev_plain["value"], f"{am['plain_seconds']:.1f}", "-"))
            rows.append((f"AIMET W4A8 adaround ({args.aimet_iterations} it.)", ev_ada["value"],
                         f"{am['total_seconds']:.1f} sim+adaround+encodings, {am['process_seconds']:.1f} process",
                         f"{am['adaround_seconds']:.1f} (apply_adaround)"))
        print(f"{args.model} W4A8, {len(qc['per_layer'])} layers rounded by qcompiler "
              f"({qc['iterations']} iterations in all, {qc['skipped']} skipped)")
        print(f"{'':44s} {'top-1':>8s} {'drop (pt)':>10s}  wall s (whole)  /  wall s (adaround)")
        for name, v, whole, part in rows:
            print(f"{name:44s} {v:8.5f} {100 * (flt - v):10.2f}  {whole}  /  {part}")
        if why:
            print(f"AIMET not run: {why}")
        print()
        print(f"{'layer':28s} {'bits':>4s} {'iter.':>6s} {'loss RTN':>10s} {'loss ada':>10s} {'qc s':>7s} "
              f"{'AIMET s':>8s}")
        aimet_layers = (am or {}).get("per_layer", {})
        for name, r in qc["per_layer"].items():
            a = aimet_layers.get(name)
            print(f"{name[:28]:28s} {r['bits']:4d} {r['iterations']:6d} {r['loss_nearest']:10.4g} {r['loss']:10.4g} "
                  f"{r['seconds']:7.2f} {'' if a is None else f'{a:8.2f}'}")
        for name in sorted(set(aimet_layers) - set(qc["per_layer"])):
            print(f"{name[:28]:28s} {'':4s} {'':6s} {'':10s} {'':10s} {'':7s} {aimet_layers[name]:8.2f}")
        ok_drop = 100 * (flt - ev_qc["value"]) <= 0.3 + 1e-9
        line = f"target: drop <= 0.3 points: {'met' if ok_drop else 'MISSED'}"
        if am:
            ratio = qc["total_seconds"] / am["adaround_seconds"]
            line += (f"; whole quantize {qc['total_seconds']:.1f} s vs AIMET apply_adaround "
                     f"{am['adaround_seconds']:.1f} s = {ratio:.3f}x ({'met' if ratio <= 0.5 else 'MISSED'} <= 0.5x)")
        print(line)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2:])
    else:
        main()
