"""LLM decoder quantization: qcompiler against onnxruntime's own quantizers (and optional ModelOpt / INC peers).

    /work/venv/bin/python benchmarks/bench_llm.py --model trained            # the trained byte-level decoder
    /work/venv/bin/python benchmarks/bench_llm.py --model 0.5b --only 'ort_rtn4,qc_rtn4'
    /work/venv/bin/python benchmarks/bench_llm.py --model growth-8 --only 'ort_*'
    /work/venv/bin/python benchmarks/bench_llm.py --model /path/to/dir_or_model.onnx

--model: trained | 0.5b | growth-N | PATH (a folder with model.onnx, calib.npz, eval.npz, or a .onnx beside them).
A named model lives in WORK/NAME (--work, default /tmp/llm_work) and is built when its folder does not exist:
`trained` by benchmarks/llm/train_decoder.py, the others by benchmarks/llm/make_decoder.py, both with the benchmark
venv's python (--bench-python, default /work/venv_bench/bin/python: torch + transformers).

Every quantization is its own process, started through benchmarks/llm/measure.py (wall time, the child's own
peak RSS). A failure prints the run's last error line and the other rows go on. Then, in this process:
  size       output .onnx plus every external-data file it references (MiB)
  sqnr       logits SQNR (dB) against the float model on eval.npz (--samples N: the first N sequences)
  ppl        next-token perplexity on eval.npz (trained model only; random weights have no meaningful one)
  kernels    op types of onnxruntime's optimized graph (SessionOptions.optimized_model_filepath, default options)
             that show the quantized kernels: MatMulNBits, GatherBlockQuantized, QLinear*/MatMulInteger/
             DynamicQuantizeMatMul; `dq` counts DequantizeLinear left in the optimized graph
  latency    one intra-op thread, default options otherwise, every model's session open at once, runs
             interleaved round by round, median of --runs per sequence length (--latency-seqs, default 1,128)
Ratios qcompiler/peer (time, RSS, size, latency): weight-only int4 rows against ort_rtn4, int8 weight-only
against ort_rtn8, W8A8 against ort_w8a8. Results go to WORK/NAME/bench_llm.json; the last line printed is JSON.

Rows (--only takes a comma list of names or fnmatch patterns):
  float            the float model itself (reference for SQNR, size and latency)
  ort_*            see benchmarks/llm/peer_runner.py (onnxruntime 1.32's MatMulNBitsQuantizer and quantize_static),
                   run with --peer-python (default the benchmark venv: same onnxruntime 1.32, plus onnx_ir and torch)
  modelopt_*, inc_*  optional peers, each in its own venv (--modelopt-python, --inc-python); skipped with the
                   reason when that venv is missing or cannot import its package
  qc_rtn4          qcompiler quantize --weight-only --weight-bits 4 --block-size 32
  qc_gptq4         ... --calib calib.npz --recipe gptq
  qc_awq4          ... --calib calib.npz --recipe awq
  qc_*_acc0        the same with --accuracy-level 0 (float activations inside MatMulNBits, as ort_rtn4)
  qc_w8            qcompiler quantize --weight-only --weight-bits 8 --block-size 32
  qc_w8a8          qcompiler quantize --calib calib.npz (W8A8 default)
  every qcompiler run adds -q --no-progress --allow-low-sqnr --json --target T (--qc-target, default ort_cpu)
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LLM = os.path.join(HERE, "llm")
sys.path.insert(0, LLM)

import perplexity as P

PEER_DOC = {
    "ort_rtn4": "ORT MatMulNBits RTN int4 b32 sym",
    "ort_rtn4_asym": "ORT MatMulNBits RTN int4 b32 asym",
    "ort_rtn4_acc4": "ORT RTN int4 b32 sym, accuracy_level 4",
    "ort_rtn4_gather": "ORT RTN int4 b32 sym, MatMul+Gather",
    "ort_rtn8": "ORT MatMulNBits RTN int8 b32 sym",
    "ort_kquant4": "ORT k_quant int4 b32",
    "ort_gptq4": "ORT GPTQ int4 b32 asym (calib)",
    "ort_gptq4_fixed": "ORT GPTQ, Cholesky bug fixed (not ORT)",
    "ort_hqq4": "ORT HQQ int4 b32 (torch)",
    "ort_w8a8": "ORT quantize_static QDQ per-channel",
    "modelopt_int4": "ModelOpt int4 rtn_dq b32",
    "modelopt_awq4": "ModelOpt int4 awq_lite b32",
    "modelopt_awqclip4": "ModelOpt int4 awq_clip b32",
    "inc_rtn4": "INC (onnx-neural-compressor) RTN int4 b32 sym",
    "inc_gptq4": "INC GPTQ int4 b32 sym (calib)",
    "inc_awq4": "INC AWQ int4 b32 sym (calib)",
}
QC_ROWS = {
    "qc_rtn4": (["--weight-only", "--weight-bits", "4", "--block-size", "32"], False, "qcompiler RTN int4 b32"),
    "qc_gptq4": (["--weight-only", "--weight-bits", "4", "--block-size", "32", "--recipe", "gptq"], True,
                 "qcompiler GPTQ int4 b32"),
    "qc_awq4": (["--weight-only", "--weight-bits", "4", "--block-size", "32", "--recipe", "awq"], True,
                "qcompiler AWQ int4 b32"),
    "qc_rtn4_acc0": (["--weight-only", "--weight-bits", "4", "--block-size", "32", "--accuracy-level", "0"], False,
                     "qcompiler RTN int4 b32, accuracy_level 0"),
    "qc_awq4_acc0": (["--weight-only", "--weight-bits", "4", "--block-size", "32", "--recipe", "awq",
                      "--accuracy-level", "0"], True, "qcompiler AWQ int4 b32, accuracy_level 0"),
    "qc_w8": (["--weight-only", "--weight-bits", "8", "--block-size", "32"], False, "qcompiler int8 weight-only b32"),
    "qc_w8a8": ([], True, "qcompiler W8A8 (default)"),
}
ALL_ROWS = ["float"] + list(PEER_DOC) + list(QC_ROWS)
BASELINE = {"qc_rtn4": "ort_rtn4", "qc_gptq4": "ort_rtn4", "qc_awq4": "ort_rtn4", "qc_w8": "ort_rtn8",
            "qc_rtn4_acc0": "ort_rtn4", "qc_awq4_acc0": "ort_rtn4",
            "qc_w8a8": "ort_w8a8"}
KERNEL_OPS = ("MatMulNBits", "GatherBlockQuantized", "QLinearMatMul", "MatMulInteger", "DynamicQuantizeMatMul",
              "MatMulIntegerToFloat", "QGemm", "DequantizeLinear")


def read_json(path):
    with open(path) as f:
        return json.load(f)


def log(*a):
    print(*a, flush=True)


# ---------------------------------------------------------------- model folder

def resolve_model(a):
    """-> (model.onnx, calib.npz, eval.npz, results dir, name). Builds named models that are missing."""
    name = a.model
    if name == "trained" or name == "0.5b" or name.startswith("growth-"):
        d = os.path.join(a.work, name)
        if not os.path.exists(os.path.join(d, "model.onnx")):
            if not os.path.exists(a.bench_python):
                raise SystemExit(f"{d} is missing and {a.bench_python} (torch venv) is not there to build it")
            if name == "trained":
                cmd = [a.bench_python, os.path.join(LLM, "train_decoder.py"), "--out", d]
            else:
                cmd = [a.bench_python, os.path.join(LLM, "make_decoder.py"), "--preset", name, "--out", d]
            log(f"building {name}: {shlex.join(cmd)}")
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True)
            log(f"built {name} in {time.perf_counter() - t0:.0f} s")
        return (os.path.join(d, "model.onnx"), os.path.join(d, "calib.npz"), os.path.join(d, "eval.npz"),
                d, name)
    p = os.path.abspath(name)
    if os.path.isdir(p):
        model, d = os.path.join(p, "model.onnx"), p
    else:
        model, d = p, os.path.dirname(p)
    for f in (model, os.path.join(d, "calib.npz"), os.path.join(d, "eval.npz")):
        if not os.path.exists(f):
            raise SystemExit(f"missing {f}")
    tag = os.path.basename(d.rstrip("/")) or "model"
    return model, os.path.join(d, "calib.npz"), os.path.join(d, "eval.npz"), os.path.join(a.work, tag), tag


def model_files(path):
    """The .onnx file and the external-data files it references."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data
    m = onnx.load(path, load_external_data=False)
    files = {path}
    d = os.path.dirname(path)

    def tensors(g):
        yield from g.initializer
        for n in g.node:
            for at in n.attribute:
                if at.HasField("t"):
                    yield at.t
                if at.HasField("g"):
                    yield from tensors(at.g)
                for sg in at.graphs:
                    yield from tensors(sg)
    for t in tensors(m.graph):
        if uses_external_data(t):
            files.add(os.path.join(d, ExternalDataInfo(t).location))
    return sorted(files)


def model_bytes(path):
    return sum(os.path.getsize(f) for f in model_files(path) if os.path.exists(f))


# ---------------------------------------------------------------- quantization runs

def python_ok(py, module):
    """None when `py -c 'import module'` works, else the reason."""
    if not os.path.exists(py):
        return f"{py} not found"
    r = subprocess.run([py, "-c", f"import {module}"], capture_output=True, text=True, check=False)
    if r.returncode:
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        return f"{py} cannot import {module}: {lines[-1] if lines else r.returncode}"
    return None


def row_command(row, a, model, calib, out):
    """-> (argv, skip_reason)."""
    runner = os.path.join(LLM, "peer_runner.py")
    if row in QC_ROWS:
        extra, needs_calib, _ = QC_ROWS[row]
        argv = shlex.split(a.qcompiler) + ["quantize", model, "-o", out] + extra
        if needs_calib:
            argv += ["--calib", calib]
        argv += ["--target", a.qc_target, "-q", "--no-progress", "--allow-low-sqnr", "--json"]
        return argv, None
    if row == "ort_hqq4":
        why = python_ok(a.peer_python, "torch")
        return ([a.peer_python, runner, row, model, calib, out], None) if why is None else (None, why)
    if row.startswith("modelopt_"):
        why = python_ok(a.modelopt_python, "modelopt.onnx.quantization.int4")
        return ([a.modelopt_python, runner, row, model, calib, out], None) if why is None else (None, why)
    if row.startswith("inc_"):
        why = python_ok(a.inc_python, "onnx_neural_compressor.quantization.matmul_nbits_quantizer")
        return ([a.inc_python, runner, row, model, calib, out], None) if why is None else (None, why)
    why = python_ok(a.peer_python, "onnxruntime.quantization.matmul_nbits_quantizer")
    return ([a.peer_python, runner, row, model, calib, out], None) if why is None else (None, why)


def last_error_line(*paths):
    for p in paths:
        if not os.path.exists(p):
            continue
        with open(p, errors="replace") as f:
            lines = [ln.rstrip() for ln in f if ln.strip()]
        for ln in reversed(lines):
            if not ln.startswith((" ", "\t", "W1", "warnings.warn")):
                return ln[:400]
    return "(no output)"


def run_quantize(row, argv, out, logs, timeout):
    os.makedirs(logs, exist_ok=True)
    for p in (out, out + ".data"):
        if os.path.exists(p):
            os.remove(p)
    res_json = os.path.join(logs, f"{row}.measure.json")
    o, e = os.path.join(logs, f"{row}.out"), os.path.join(logs, f"{row}.err")
    full = [sys.executable, os.path.join(LLM, "measure.py"), res_json, "--"] + argv
    with open(o, "w") as fo, open(e, "w") as fe:
        fo.write("$ " + shlex.join(argv) + "\n")
        fo.flush()
        p = subprocess.Popen(full, stdout=fo, stderr=fe, start_new_session=True)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return {"ok": False, "error": f"timeout after {timeout} s"}
    meas = read_json(res_json) if os.path.exists(res_json) else {"rc": p.returncode}
    r = {"ok": meas.get("rc") == 0 and os.path.exists(out), **meas, "log": e}
    if not r["ok"]:
        rc = meas.get("rc")
        r["error"] = f"killed by signal {-rc}" if isinstance(rc, int) and rc < 0 else last_error_line(e, o)
    with open(o) as f:  # qcompiler --json: one JSON summary line on stdout
        for ln in f:
            if ln.startswith("{"):
                try:
                    r["tool_json"] = json.loads(ln)
                except ValueError:
                    pass
    return r


# ---------------------------------------------------------------- measurements

def kernels_of(opt_path):
    import onnx
    if not os.path.exists(opt_path):
        return {}
    m = onnx.load(opt_path, load_external_data=False)
    c = {}
    for n in m.graph.node:
        if n.op_type in KERNEL_OPS:
            c[n.op_type] = c.get(n.op_type, 0) + 1
    c["nodes"] = len(m.graph.node)
    return c


def accuracy(path, ids, ref_logits, trained, opt_path):
    """Default session options (plus optimized_model_filepath): logits on ids, SQNR, perplexity, kernels."""
    t0 = time.perf_counter()
    sess = P.session(path, optimized_path=opt_path)
    load_s = time.perf_counter() - t0
    lo = P.run_logits(sess, ids)
    del sess
    r = {"load_seconds": round(load_s, 2), "kernels": kernels_of(opt_path)}
    for f in (opt_path, opt_path + ".data"):
        if os.path.exists(f):
            os.remove(f)
    if ref_logits is not None:
        r["sqnr_db"] = round(P.sqnr_db(ref_logits, lo), 2)
    if trained:
        loss, _ = P.cross_entropy(lo, ids)
        r["perplexity"] = round(math.exp(loss), 4)
    return r, lo


def latencies(paths, ids, seqs, runs, warmup=2):
    """{row: {seq: median ms}}: one thread each, all sessions open, interleaved round by round."""
    sess = {}
    for row, p in paths.items():
        try:
            sess[row] = P.session(p, threads=1)
        except Exception as ex:  # noqa: BLE001
            log(f"  latency: {row} does not load: {ex}")
    out = {row: {} for row in sess}
    for L in seqs:
        feed = ids[0][:, :L]
        times = {row: [] for row in sess}
        for i in range(warmup + runs):
            for row, s in sess.items():
                t0 = time.perf_counter()
                s.run(["logits"], {"input_ids": feed})
                if i >= warmup:
                    times[row].append(time.perf_counter() - t0)
        for row in sess:
            out[row][L] = round(statistics.median(times[row]) * 1000, 3)
    return out


# ---------------------------------------------------------------- report

def fmt(v, spec="{:.2f}", none="-"):
    if v is None:
        return none
    if isinstance(v, float) and math.isinf(v):
        return "inf"
    return spec.format(v)


def kern_str(k):
    if not k:
        return "-"
    short = {"MatMulNBits": "NBits", "GatherBlockQuantized": "GBQ", "QLinearMatMul": "QLMM", "MatMulInteger": "MMI",
             "DynamicQuantizeMatMul": "DQMM", "MatMulIntegerToFloat": "MMI2F", "QGemm": "QGemm",
             "DequantizeLinear": "dq"}
    s = " ".join(f"{short[o]}{k[o]}" for o in KERNEL_OPS if k.get(o))
    return s or "float"


def print_table(results, seqs, trained):
    hdr = ["row", "what", "time s", "RSS MiB", "size MiB", "sqnr dB"] + (["ppl"] if trained else []) + \
        [f"lat L={L} ms" for L in seqs] + ["optimized graph"]
    rows = []
    for row, r in results.items():
        if r.get("skipped"):
            rows.append([row, r["what"], "skipped: " + r["skipped"]])
            continue
        if not r.get("ok", True):
            rows.append([row, r["what"], "FAILED: " + r.get("error", "?")])
            continue
        lat = r.get("latency_ms", {})
        rows.append([row, r["what"], fmt(r.get("seconds")), fmt(r.get("peak_rss_mb"), "{:.0f}"),
                     fmt(r.get("size_mb")), fmt(r.get("sqnr_db"))] + ([fmt(r.get("perplexity"), "{:.3f}")]
                                                                      if trained else []) +
                    [fmt(lat.get(L), "{:.2f}") for L in seqs] + [kern_str(r.get("kernels"))])
    full = [r for r in rows if len(r) == len(hdr)]
    w = [max(len(str(x[i])) for x in [hdr] + full) for i in range(len(hdr))]
    log("  ".join(h.ljust(w[i]) for i, h in enumerate(hdr)))
    for r in rows:
        if len(r) == len(hdr):
            log("  ".join(str(x).ljust(w[i]) for i, x in enumerate(r)))
        else:
            log("  ".join([r[0].ljust(w[0]), r[1].ljust(w[1]), r[2]]))


def ratios(results, seqs):
    out = {}
    for qc, peer in BASELINE.items():
        q, p = results.get(qc), results.get(peer)
        if not q or not p or not q.get("ok") or not p.get("ok") or q.get("skipped") or p.get("skipped"):
            continue
        d = {}
        for k in ("seconds", "peak_rss_mb", "size_mb"):
            if q.get(k) and p.get(k):
                d[k] = round(q[k] / p[k], 3)
        for L in seqs:
            ql, pl = q.get("latency_ms", {}).get(L), p.get("latency_ms", {}).get(L)
            if ql and pl:
                d[f"latency_L{L}"] = round(ql / pl, 3)
        out[f"{qc}/{peer}"] = d
    return out


# ---------------------------------------------------------------- main

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="trained", help="trained | 0.5b | growth-N | PATH")
    ap.add_argument("--work", default="/tmp/llm_work", help="models and outputs (never committed)")
    ap.add_argument("--only", default="", help="comma list of rows or fnmatch patterns (default: all)")
    ap.add_argument("--skip", default="", help="comma list of rows or patterns to leave out")
    ap.add_argument("--samples", type=int, default=0, help="eval sequences for SQNR/perplexity (0: all in eval.npz)")
    ap.add_argument("--runs", type=int, default=0, help="latency rounds (default 20; 5 above 1 GB of weights)")
    ap.add_argument("--latency-seqs", default="", help="comma list of sequence lengths (default 1,128; 1,16 big)")
    ap.add_argument("--no-latency", action="store_true")
    ap.add_argument("--timeout", type=float, default=7200, help="per quantization run, seconds")
    ap.add_argument("--qcompiler", default=os.path.join(os.path.dirname(sys.executable), "qcompiler"),
                    help="qcompiler command (split like a shell would)")
    ap.add_argument("--qc-target", default="ort_cpu")
    ap.add_argument("--bench-python", default="/work/venv_bench/bin/python")
    ap.add_argument("--peer-python", default="/work/venv_bench/bin/python",
                    help="python for the ort_* rows: onnxruntime's MatMulNBitsQuantizer imports onnx_ir, which the "
                         "project venv lacks; HQQ also needs torch")
    ap.add_argument("--modelopt-python", default="/work/venv_modelopt/bin/python")
    ap.add_argument("--inc-python", default="/work/venv_inc/bin/python")
    ap.add_argument("--reuse", action="store_true", help="keep outputs already in WORK/NAME/out (no re-run)")
    a = ap.parse_args(argv)

    import onnxruntime as ort
    ort.set_default_logger_severity(3)  # no warning per optimized-model dump
    model, calib, evalp, rdir, name = resolve_model(a)
    info_p = os.path.join(os.path.dirname(model), "info.json")
    info = read_json(info_p) if os.path.exists(info_p) else {}
    trained = info.get("kind") == "trained"
    fbytes = model_bytes(model)
    big = fbytes > 1e9
    seqs = [int(s) for s in (a.latency_seqs or ("1,16" if big else "1,128")).split(",") if s]
    runs = a.runs or (5 if big else 20)
    pats = [p for p in a.only.split(",") if p] or ["*"]
    skips = [p for p in a.skip.split(",") if p]
    rows = [r for r in ALL_ROWS if any(fnmatch.fnmatch(r, p) for p in pats)
            and not any(fnmatch.fnmatch(r, p) for p in skips)]
    outd, logs = os.path.join(rdir, "out"), os.path.join(rdir, "logs")
    os.makedirs(outd, exist_ok=True)
    ids = P.load_ids(evalp, a.samples)
    log(f"model {name}: {model} ({fbytes / 2**20:.1f} MiB incl. external data), kind {info.get('kind', '?')}, "
        f"config {info.get('config')}, eval {ids.shape}, rows {','.join(rows)}")
    if info.get("lm_head"):
        h = info["lm_head"]
        log(f"  lm_head in the float graph: {h.get('op')} <- "
            f"{[i.get('producer', 'initializer') + ('(' + i['transposes_initializer'] + ')' if 'transposes_initializer' in i else '') for i in h.get('inputs', [])]}, shares the embedding table: {h.get('shares_embedding_table')}")

    t0 = time.perf_counter()
    fsess = P.session(model)
    ref = P.run_logits(fsess, ids)
    del fsess
    log(f"float logits on {len(ids)} sequences: {time.perf_counter() - t0:.1f} s")

    results, paths = {}, {}
    for row in rows:
        what = PEER_DOC.get(row) or (QC_ROWS[row][2] if row in QC_ROWS else "float model")
        r = {"what": what}
        if row == "float":
            r.update(ok=True, size_mb=round(fbytes / 2**20, 2))
            path = model
        else:
            path = os.path.join(outd, f"{row}.onnx")
            argv_, skip = row_command(row, a, model, calib, path)
            if skip:
                r["skipped"] = skip
                log(f"{row}: skipped: {skip}")
                results[row] = r
                continue
            if a.reuse and os.path.exists(path):
                r.update(ok=True, reused=True)
                prev = os.path.join(logs, f"{row}.measure.json")
                if os.path.exists(prev):
                    r.update(read_json(prev))
            else:
                log(f"{row}: {shlex.join(argv_)}")
                r.update(run_quantize(row, argv_, path, logs, a.timeout))
            if not r["ok"]:
                log(f"{row}: FAILED ({r.get('seconds', '?')} s): {r.get('error')}")
                results[row] = r
                continue
            r["size_mb"] = round(model_bytes(path) / 2**20, 2)
        try:
            acc, _ = accuracy(path, ids, ref if row != "float" else None, trained,
                              os.path.join(rdir, f"opt_{row}.onnx"))
            r.update(acc)
        except Exception as ex:  # noqa: BLE001
            r.update(ok=False, error=f"onnxruntime: {type(ex).__name__}: {str(ex).splitlines()[0][:300]}")
            log(f"{row}: FAILED in onnxruntime: {r['error']}")
            results[row] = r
            continue
        paths[row] = path
        results[row] = r
        log(f"{row}: {fmt(r.get('seconds'))} s, peak RSS {fmt(r.get('peak_rss_mb'), '{:.0f}')} MiB, "
            f"{r['size_mb']:.2f} MiB, SQNR {fmt(r.get('sqnr_db'))} dB"
            + (f", ppl {r['perplexity']:.3f}" if 'perplexity' in r else "") + f", {kern_str(r.get('kernels'))}")

    if not a.no_latency and paths:
        log(f"latency: {len(paths)} models, 1 thread, interleaved, {runs} runs, seq {seqs}")
        lat = latencies(paths, ids, seqs, runs)
        for row, d in lat.items():
            results[row]["latency_ms"] = d

    log("")
    print_table(results, seqs, trained)
    rat = ratios(results, seqs)
    if rat:
        log("\nqcompiler / peer:")
        for k, d in rat.items():
            log(f"  {k}: " + ", ".join(f"{m} {v:.2f}x" for m, v in d.items()))
    summary = {"model": name, "path": model, "float_mb": round(fbytes / 2**20, 2), "kind": info.get("kind"),
               "eval_sequences": len(ids), "latency_seqs": seqs, "latency_runs": runs, "rows": results,
               "ratios": rat}
    with open(os.path.join(rdir, "bench_llm.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    log(json.dumps({"model": name, "ratios": rat,
                    "rows": {k: {m: v.get(m) for m in ("ok", "seconds", "peak_rss_mb", "size_mb", "sqnr_db",
                                                        "perplexity", "skipped", "error")
                                 if v.get(m) is not None} for k, v in results.items()}}, default=str))


if __name__ == "__main__":
    main()
