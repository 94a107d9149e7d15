"""Cross-layer equalisation (`--recipe cle`) on corpus CNNs: eval.py metric and eval-set SQNR,
without and with cle, for per-channel W8A8 (the default), per-tensor W8A8 and per-tensor W8A16.

usage: python benchmarks/bench_cle.py [--corpus DIR] [--models digits_cnn,ppocr_cls] [--out DIR]

Each row runs `qcompiler quantize MODEL --calib calib.npz [--per-tensor] [--act-bits 16] [--recipe cle]
--min-sqnr -1000` (the safety net off, so the rows compare the quantization itself), then the model's own
eval.py, and the output SQNR against the float model over eval.npz (one sample at a time). The cle note from the
report (pairs, equalised, absorbed, why not) is printed under each cle row.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CORPUS = os.environ.get("QC_CORPUS", os.path.join(HERE, "..", "..", "shared", "corpus"))
SETTINGS = (("per-channel W8A8", []), ("per-tensor W8A8", ["--per-tensor"]),
            ("per-tensor W8A16", ["--per-tensor", "--act-bits", "16"]))


def evaluate(md, cand):
    r = subprocess.run([sys.executable, os.path.join(md, "eval.py"), cand, "--float", os.path.join(md, "model.onnx")],
                       capture_output=True, text=True)
    return json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None


def eval_outputs(md, path):
    from qcompiler.ort_session import create_session
    d = np.load(os.path.join(md, "eval.npz"))
    sess = create_session(onnx.load(path))
    name = sess.get_inputs()[0].name
    x = d[[k for k in d.files if k != "labels"][0]]
    return np.concatenate([np.asarray(sess.run(None, {name: x[i]})[0]) for i in range(len(x))])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=DEFAULT_CORPUS)
    ap.add_argument("--models", default="digits_cnn,ppocr_cls")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    from qcompiler.sqnr import sqnr_db
    out = a.out or tempfile.mkdtemp(prefix="bench_cle_")
    print("| model | setting | metric without cle | with cle | eval SQNR dB without | with |")
    print("|---|---|---|---|---|---|")
    notes = []
    for model in a.models.split(","):
        md = os.path.join(a.corpus, model)
        ref = eval_outputs(md, os.path.join(md, "model.onnx"))
        for label, flags in SETTINGS:
            got = []
            for recipe in ([], ["--recipe", "cle"]):
                tag = f"{model}_{label.replace(' ', '_')}_{'cle' if recipe else 'plain'}"
                cand, rep = os.path.join(out, tag + ".onnx"), os.path.join(out, tag + ".json")
                r = subprocess.run([sys.executable, "-m", "qcompiler", "quantize", os.path.join(md, "model.onnx"),
                                    "--calib", os.path.join(md, "calib.npz"), "-o", cand, "--report", rep,
                                    "--min-sqnr", "-1000"] + flags + recipe, capture_output=True, text=True)
                if r.returncode != 0:
                    got.append(("failed", float("nan")))
                    notes.append(f"{tag}: exit {r.returncode}: {r.stderr.strip()[-200:]}")
                    continue
                metric = evaluate(md, cand)
                got.append((metric["value"] if metric else "eval failed", sqnr_db(ref, eval_outputs(md, cand))))
                if recipe:
                    notes += [f"{tag}: {n}" for n in json.load(open(rep))["notes"] if n.startswith("cle")]
            (m0, s0), (m1, s1) = got
            print(f"| {model} | {label} | {m0} | {m1} | {s0:.2f} | {s1:.2f} |")
    for n in notes:
        print(n)


if __name__ == "__main__":
    main()
