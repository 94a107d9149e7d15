"""AIMET-ONNX <-> qcompiler encodings, both directions and both formats, on corpus models.

usage: python benchmarks/bench_aimet_interop.py [--corpus DIR] [--models digits_cnn,minilm_l6] [--out DIR]

aimet-onnx runs in its own venv, never as a qcompiler dependency (anchors section F):
    python3 -m venv .venv-aimet && .venv-aimet/bin/pip install torch==2.13.0 torchvision==0.28.0 aimet-onnx==2.42.0
(about 2 minutes here). QCOMPILER_AIMET_PYTHON names that venv's python (default: .venv-aimet/bin/python at the
repository root). Without it the script says so and exits 0: nothing is checked.

Per model:
1. AIMET folds BatchNorm (batch_norm_fold.fold_all_batch_norms_to_weight), builds a W8A8 per-channel
   QuantizationSimModel (default_config_per_channel.json, min_max), computes encodings on calib.npz and exports
   encodings 1.0.0 and 2.0.0 and its own QDQ model (to_onnx_qdq). Everything below uses that folded model, so
   AIMET's and qcompiler's tensor names are the same.
2. AIMET -> qcompiler, as a new user tries it: `qcompiler quantize FOLDED --load-encodings F` per format, no
   other flag (the file's int4/int16/per-block grids choose the opset); the metric (the model's eval.py) must be
   within TOL of AIMET's own QDQ export.
3. qcompiler -> AIMET: `qcompiler quantize FOLDED --target aimet --encodings F` per format (the `aimet` profile
   is AIMET's default config: full 8-bit weight range, symmetric dynamic-MatMul inputs, no quantizer on
   data-movement outputs), then AIMET's load_encodings_to_sim into a fresh sim and to_onnx_qdq: no setting
   mismatch in the entries the file has, no entry for a quantizer AIMET's sim does not have beyond those
   AIMET's own file of that format has (2.0.0's int32 biases), and the metric within TOL of qcompiler's own
   QDQ model.
4. The ort_cpu file (7-bit weights, bw 7) loaded into AIMET with strict=False: AIMET takes the 7-bit grids.
5. With BatchNorm in the model: AIMET's encodings of the un-folded model given to qcompiler with the original
   model (which qcompiler BN-folds): refused with one line naming the cause.
Prints a pass/fail table; exit 1 when a row fails. Evaluation runs with onnxruntime's default session options
(ORT_ENABLE_ALL), as the corpus eval.py does.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_CORPUS = os.environ.get("QC_CORPUS", os.path.join(ROOT, "..", "..", "shared", "corpus"))
AIMET_PYTHON = os.environ.get("QCOMPILER_AIMET_PYTHON", os.path.join(ROOT, ".venv-aimet", "bin", "python"))
TOL = {"digits_cnn": 0.01, "minilm_l6": 0.01}      # metric difference allowed against the reference
# per model: AIMET's sim settings and the matching qcompiler flags (qcompiler -> AIMET only: loading AIMET's file
# needs none). minilm_l6 takes the case: int4 per-block MatMul weights (1.0.0 writes their scales output
# channel first) and 16-bit activations (AIMET's own W8A8 min_max export of it scores a cosine of 0.05)
SETTINGS = {"minilm_l6": {"aimet": {"activation_type": "int16", "block": [["MatMul", "Gemm"], 4, 64]},
                          "qcompiler": ["--act-bits", "16", "--weight-bits", "4", "--block-size", "64"]}}


# --- the AIMET side (runs under AIMET's python; imports neither qcompiler nor anything outside that venv) -------
def _feeds(model, calib_path):
    import numpy as np
    data = dict(np.load(calib_path))
    ranks = {i.name: len(i.type.tensor_type.shape.dim) for i in model.graph.input}
    n = min(v.shape[0] for v in data.values())
    return [{k: (v[i] if v[i].ndim == ranks[k] else v[i:i + 1]) for k, v in data.items() if k in ranks}
            for i in range(n)]


def _sim(model, settings):
    from aimet_onnx.quantsim import QuantizationSimModel, set_blockwise_quantization_for_weights
    import aimet_onnx
    cfg = os.path.join(os.path.dirname(aimet_onnx.__file__), "common", "quantsim_config",
                       "default_config_per_channel.json")
    sim = QuantizationSimModel(model, quant_scheme="min_max", config_file=cfg,
                               activation_type=settings.get("activation_type", "int8"))
    if settings.get("block"):
        ops, bits, size = settings["block"]
        set_blockwise_quantization_for_weights(sim, tuple(ops), bits, True, size)
    return sim


def worker_export(model_path, calib_path, out, settings):
    import onnx
    from aimet_onnx.batch_norm_fold import fold_all_batch_norms_to_weight
    model = onnx.load(model_path)
    has_bn = any(n.op_type == "BatchNormalization" for n in model.graph.node)
    if has_bn:      # AIMET's encodings of the un-folded model: what a user who skipped the fold gets
        sim = _sim(onnx.load(model_path), settings)
        sim.compute_encodings(_feeds(model, calib_path))
        sim.export(out, "aimet_unfolded", export_model=False, encoding_version="1.0.0")
        del sim
    fold_all_batch_norms_to_weight(model)
    onnx.save(model, os.path.join(out, "folded.onnx"))
    sim = _sim(onnx.load(os.path.join(out, "folded.onnx")), settings)
    sim.compute_encodings(_feeds(model, calib_path))
    for v in ("1.0.0", "2.0.0"):
        sim.export(out, f"aimet_{v}", export_model=False, encoding_version=v)
    onnx.save(sim.to_onnx_qdq(), os.path.join(out, "aimet_qdq.onnx"))
    return {"ok": True, "unfolded": has_bn}


def worker_load(folded, enc_path, out_model, strict, settings):
    import onnx
    from aimet_onnx.quantsim import load_encodings_to_sim
    with open(enc_path) as f:
        doc = json.load(f)
    names = {e["name"] for k in ("encodings", "activation_encodings", "param_encodings") for e in doc.get(k, [])}
    sim = _sim(onnx.load(folded), settings)
    res = {"error": None, "mismatch_in_file": [], "enabled_only": [], "mismatch_not_in_file": 0}
    try:
        mism = load_encodings_to_sim(sim, enc_path, strict=False)
    except Exception as e:     # AIMET's loader refused the file: its first line is the result
        res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        return res
    for m in mism:
        if m.quantizer_name not in names:
            res["mismatch_not_in_file"] += 1
        elif any(v for k, v in vars(m).items() if k not in ("quantizer_name", "enabled_mismatch")):
            res["mismatch_in_file"].append(m.quantizer_name)     # a grid setting differs
            for k, v in vars(m).items():
                if v and k not in ("quantizer_name", "enabled_mismatch"):
                    res.setdefault("kinds", {}).setdefault(f"{k.replace('_mismatch', '')} AIMET {v[0]}, file {v[1]}", 0)
                    res["kinds"][f"{k.replace('_mismatch', '')} AIMET {v[0]}, file {v[1]}"] += 1
        else:
            res["enabled_only"].append(m.quantizer_name)         # a quantizer AIMET's config leaves off
    bits = sorted({q.bitwidth for q in sim.qc_quantize_op_dict.values() if q.enabled})
    res["bitwidths"] = bits
    if strict:
        try:
            onnx.save(sim.to_onnx_qdq(), out_model)
        except Exception as e:
            res["error"] = f"to_onnx_qdq: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return res


def worker_main(argv):
    what, args = argv[0], argv[1:]
    settings = json.loads(args[-1])
    if what == "export":
        out = worker_export(args[0], args[1], args[2], settings)
    else:
        out = worker_load(args[0], args[1], args[2], args[3] == "strict", settings)
    print("RESULT " + json.dumps(out))


# --- the qcompiler side ----------------------------------------------------------------------------------------
def aimet(*args, timeout=1800):
    p = subprocess.run([AIMET_PYTHON, os.path.abspath(__file__), "--worker", *map(str, args)], capture_output=True,
                       text=True, timeout=timeout)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"error": f"aimet worker exit {p.returncode}: {tail[:200]}"}


def qcompiler(*args):
    p = subprocess.run([sys.executable, "-m", "qcompiler", "quantize", *map(str, args), "-q"], capture_output=True,
                       text=True)
    return p.returncode, p.stderr.strip()


def metric(corpus, model, candidate, float_model):
    p = subprocess.run([sys.executable, os.path.join(corpus, model, "eval.py"), candidate, "--float", float_model],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return None
    return json.loads(p.stdout.strip().splitlines()[-1])["value"]


def aimet_available() -> str:
    if not os.path.exists(AIMET_PYTHON):
        return f"no python at {AIMET_PYTHON}"
    p = subprocess.run([AIMET_PYTHON, "-c", "import aimet_onnx; print(aimet_onnx.__version__)"],
                       capture_output=True, text=True)
    return "" if p.returncode == 0 else f"{AIMET_PYTHON} cannot import aimet_onnx"


def run_model(corpus, model, out, rows):
    d = os.path.join(out, model)
    os.makedirs(d, exist_ok=True)
    src, calib = os.path.join(corpus, model, "model.onnx"), os.path.join(corpus, model, "calib.npz")
    st = SETTINGS.get(model, {"aimet": {}, "qcompiler": []})
    a_set, q_flags = json.dumps(st["aimet"]), st["qcompiler"]
    r = aimet("export", src, calib, d, a_set)
    if r.get("error"):
        rows.append((model, "AIMET export", "-", "FAIL", r["error"]))
        return
    folded = os.path.join(d, "folded.onnx")
    ref = metric(corpus, model, os.path.join(d, "aimet_qdq.onnx"), src)
    tol = TOL.get(model, 0.01)
    # AIMET -> qcompiler
    for v in ("1.0.0", "2.0.0"):
        enc = os.path.join(d, f"aimet_{v}.encodings")
        q = os.path.join(d, f"qc_from_aimet_{v}.onnx")
        code, err = qcompiler(folded, "--calib", calib, "-o", q, "--load-encodings", enc, "--allow-low-sqnr")
        got = metric(corpus, model, q, src) if code == 0 else None
        ok = got is not None and ref is not None and abs(got - ref) <= tol
        warn = [ln[len("qcompiler: warning: "):][:90] for ln in err.splitlines() if "warning" in ln and "SQNR" not in ln]
        rows.append((model, f"AIMET {v} -> qcompiler", f"{got} vs AIMET QDQ {ref}", "pass" if ok else "FAIL",
                     f"exit {code}, {len(warn)} warnings {warn}" + (f": {err.splitlines()[-1][:120]}" if code else "")))
    if r.get("unfolded"):       # AIMET's model was not BN-folded; qcompiler folds: refused, the cause named
        q = os.path.join(d, "qc_from_unfolded.onnx")
        code, err = qcompiler(src, "--calib", calib, "-o", q, "--load-encodings",
                              os.path.join(d, "aimet_unfolded.encodings"))
        ok = code == 2 and len(err.splitlines()) == 1 and "BN-folded" in err
        rows.append((model, "AIMET 1.0.0 un-folded -> qcompiler (folds BN)", f"exit {code}", "pass" if ok else "FAIL",
                     err.splitlines()[-1][:150] if err else "no message"))
    # qcompiler -> AIMET
    for v in ("1.0.0", "2.0.0"):
        enc = os.path.join(d, f"qc_{v}.encodings")
        q = os.path.join(d, f"qc_{v}.onnx")
        code, err = qcompiler(folded, "--calib", calib, "-o", q, "--encodings", enc, "--encodings-version", v,
                              "--target", "aimet", "--allow-low-sqnr", *q_flags)
        if code != 0:
            rows.append((model, f"qcompiler {v} -> AIMET", "-", "FAIL", err[:160]))
            continue
        own = metric(corpus, model, q, src)
        a_out = os.path.join(d, f"aimet_from_qc_{v}.onnx")
        r = aimet("load", folded, enc, a_out, "strict", a_set)
        got = metric(corpus, model, a_out, src) if not r.get("error") else None
        # a mismatch of a grid setting (bit width, symmetry, dtype, granularity) in an entry of the file fails the
        # row; an entry for a quantizer AIMET's config leaves off ("enabled" only: qcompiler quantizes a tensor
        # AIMET does not, e.g. its own int32 biases in 2.0.0) is counted, and compared with AIMET's own file
        base = aimet("load", folded, os.path.join(d, f"aimet_{v}.encodings"), "-", "loose", a_set)
        bad = r.get("mismatch_in_file", [])
        extra = sorted(set(r.get("enabled_only", [])) - set(base.get("enabled_only", [])))
        ok = (not r.get("error") and not bad and not extra and got is not None and own is not None
              and abs(got - own) <= tol)
        detail = r.get("error") or (f"{len(bad)} setting mismatches {r.get('kinds', {})} {bad[:2]}; "
                                    f"{len(r['enabled_only'])} entries for quantizers AIMET's sim leaves off "
                                    f"(AIMET's own file: {len(base.get('enabled_only', []))}), "
                                    f"{len(extra)} beyond those {extra[:2]}")
        rows.append((model, f"qcompiler {v} -> AIMET", f"{got} vs qcompiler QDQ {own}", "pass" if ok else "FAIL",
                     detail))
    # ort_cpu: 7-bit weights
    enc = os.path.join(d, "qc_ortcpu.encodings")
    code, err = qcompiler(folded, "--calib", calib, "-o", os.path.join(d, "qc_ortcpu.onnx"), "--encodings", enc,
                          "--allow-low-sqnr")
    if code == 0:
        r = aimet("load", folded, enc, "-", "loose", "{}")
        ok = not r.get("error") and 7 in r.get("bitwidths", [])
        rows.append((model, "qcompiler 1.0.0 ort_cpu -> AIMET (sim)", f"AIMET bit widths {r.get('bitwidths')}",
                     "pass" if ok else "FAIL", r.get("error") or "7-bit weight grids taken as written"))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=DEFAULT_CORPUS)
    ap.add_argument("--models", default="digits_cnn,minilm_l6")
    ap.add_argument("--out", default=None, help="keep the files here (default: a temporary folder)")
    a = ap.parse_args()
    why = aimet_available()
    if why:
        print(f"bench_aimet_interop: skipped: aimet-onnx is not installed in its own venv ({why}); see the "
              f"docstring to install it")
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = a.out or tmp
        for m in a.models.split(","):
            run_model(a.corpus, m, out, rows)
    w = [max(len(str(r[i])) for r in rows + [("model", "direction", "metric", "result", "detail")]) for i in range(4)]
    print(f"{'model':<{w[0]}}  {'direction':<{w[1]}}  {'metric':<{w[2]}}  {'result':<{w[3]}}  detail")
    for r in rows:
        print(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]:<{w[3]}}  {r[4]}")
    return 1 if any(r[3] != "pass" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
