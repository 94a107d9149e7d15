"""Sequential MSE (issue 15 item 2): accuracy on minilm_l6 W4A16 per-block, search speed, and aimet-onnx.

usage: python benchmarks/bench_seq_mse.py [--corpus DIR] [--block 32] [--skip-aimet] [--skip-synthetic]

1. minilm_l6, int4 weights per block (--block-size 32) and 16-bit activations: `qcompiler quantize` with and
   without `--recipe seq-mse`; the model's eval.py gives the mean cosine to the float embedding (target >= 0.98).
   Wall and CPU seconds of the seq-mse pass, and per layer (its report: capture + search).
2. The search alone on one synthetic 4096 x 4096 MatMul (4096 input rows): per channel and per block 32
   (issue: "a 4096x4096 MatMul in seconds").
3. aimet-onnx 2.42 (its own venv, QCOMPILER_AIMET_PYTHON, never a dependency; anchors section F): a W4A16
   block-32 QuantizationSimModel of the same model with min_max, `apply_seq_mse(sim, calib, num_candidates=20)`
   on the same calibration samples, timed; its QDQ export scored by the same eval.py.
Load on this machine is shared: CPU seconds (process_time) are printed beside wall seconds.

Measured 2026-11-24 (load average ~15 on 2 cores): min_max 0.9590, seq-mse 0.9806; seq-mse pass 1155 s wall /
~73 s CPU for 36 layers (~2 CPU-s per layer); 4096 x 4096 search 23 s CPU per channel, 30 s CPU per block 32.
aimet-onnx apply_seq_mse on the same model and samples: 10 layers in 54 min wall / 516 s CPU (~50 CPU-s per
layer), stopped there (it would have needed ~3 h more under that load), so no AIMET cosine.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_CORPUS = os.environ.get("QC_CORPUS", os.path.join(ROOT, "..", "..", "shared", "corpus"))
AIMET_PYTHON = os.environ.get("QCOMPILER_AIMET_PYTHON", os.path.join(ROOT, ".venv-aimet", "bin", "python"))


# --- the AIMET side (runs under AIMET's python; imports nothing outside that venv) ---------------------------
def worker(model_path, calib_path, out_path, block):
    import resource

    import numpy as np
    import onnx
    from aimet_onnx.quantsim import QuantizationSimModel, set_blockwise_quantization_for_weights
    from aimet_onnx.sequential_mse.seq_mse import apply_seq_mse
    import aimet_onnx
    model = onnx.load(model_path)
    data = dict(np.load(calib_path))
    ranks = {i.name: len(i.type.tensor_type.shape.dim) for i in model.graph.input}
    n = min(v.shape[0] for v in data.values())
    feeds = [{k: (v[i] if v[i].ndim == ranks[k] else v[i:i + 1]) for k, v in data.items() if k in ranks}
             for i in range(n)]
    cfg = os.path.join(os.path.dirname(aimet_onnx.__file__), "common", "quantsim_config",
                       "default_config_per_channel.json")
    sim = QuantizationSimModel(model, quant_scheme="min_max", config_file=cfg, activation_type="int16")
    set_blockwise_quantization_for_weights(sim, ("MatMul", "Gemm"), 4, True, int(block))
    layers = sum(1 for nd in model.graph.node if nd.op_type in ("MatMul", "Gemm")
                 and nd.input[1] in {t.name for t in model.graph.initializer})
    w0, c0 = time.perf_counter(), time.process_time()
    apply_seq_mse(sim, feeds, num_candidates=20)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    sim.compute_encodings(feeds)
    onnx.save(sim.to_onnx_qdq(), out_path)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps({"wall": wall, "cpu": cpu, "layers": layers, "peak_mb": rss}))


# --- the qcompiler side ----------------------------------------------------------------------------------------
def cosine(corpus, candidate):
    p = subprocess.run([sys.executable, os.path.join(corpus, "minilm_l6", "eval.py"), candidate],
                       capture_output=True, text=True)
    return json.loads(p.stdout.strip().splitlines()[-1])["value"] if p.returncode == 0 else None


def ours(corpus, out, block, recipe):
    import resource
    from qcompiler.onnx_io.files import save_model
    from qcompiler.quant import quantize
    src, calib = os.path.join(corpus, "minilm_l6", "model.onnx"), os.path.join(corpus, "minilm_l6", "calib.npz")
    c0 = time.process_time()
    res = quantize(src, calib, weight_bits=4, act_bits=16, weight_block=block, recipe=recipe, progress=False)
    cpu = time.process_time() - c0
    path = os.path.join(out, f"minilm_{recipe or 'min_max'}.onnx")
    save_model(res.model, path)
    rows = {k: v["seq_mse"] for k, v in res.report["layers"].items() if "seq_mse" in v}
    stats = next((r.stats for p, r in res.passes if p.name == "seq-mse"), {})
    return {"cosine": cosine(corpus, path), "seq_mse_wall": res.report["seconds"].get("seq-mse"),
            "total_cpu": cpu, "layers": rows, "stats": stats,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def synthetic():
    import numpy as np
    from types import SimpleNamespace
    from qcompiler.quant.encoding import compute_encoding
    from qcompiler.quant.layer_inputs import Layer
    from qcompiler.quant.qdq import block_encoding
    from qcompiler.quant.seq_mse import choose
    rng = np.random.default_rng(0)
    k = n = 4096
    x = (rng.normal(size=(4096, k)) * rng.uniform(0.1, 3, k)).astype(np.float32)
    w = (rng.normal(size=(k, n)) / np.sqrt(k)).astype(np.float32)
    node = SimpleNamespace(name="mm", inputs=[None, SimpleNamespace(name="w", const_value=lambda: w)])
    out = {}
    for mode in ("per-channel", "per-block 32"):
        enc = compute_encoding(w.min(0), w.max(0), bits=4, symmetric=True, signed=True, axis=1) \
            if mode == "per-channel" else block_encoding(w, 0, 32, 4, True)
        w0, c0 = time.perf_counter(), time.process_time()
        r = choose(Layer(node, SimpleNamespace(encoding=enc)), x)
        out[mode] = {"wall": time.perf_counter() - w0, "cpu": time.process_time() - c0, "exact": r.exact,
                     "mse": (r.mse_before, r.mse_after)}
    return out


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:])
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=DEFAULT_CORPUS)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--skip-aimet", action="store_true")
    ap.add_argument("--skip-synthetic", action="store_true")
    a = ap.parse_args()
    out = tempfile.mkdtemp(prefix="bench_seq_mse_")
    print(f"minilm_l6 W4A16 per-block {a.block} (outputs in {out})")
    base = ours(a.corpus, out, a.block, None)
    print(f"  min_max:             cosine {base['cosine']}")
    seq = ours(a.corpus, out, a.block, "seq-mse")
    n = len(seq["layers"])
    st = seq["stats"]
    print(f"  seq-mse:             cosine {seq['cosine']}  (target >= 0.98)")
    print(f"  seq-mse pass:        {seq['seq_mse_wall']:.1f} s wall for {n} layers = {seq['seq_mse_wall'] / n:.2f} s"
          f"/layer (capture {st.get('capture_seconds')} s, search {st.get('search_seconds')} s); whole quantize "
          f"{seq['total_cpu']:.1f} s CPU; peak RSS {seq['peak_mb']:.0f} MB")
    before = sum(r["mse_before"] for r in seq["layers"].values())
    after = sum(r["mse_after"] for r in seq["layers"].values())
    print(f"  summed layer output MSE on the captured rows: {before:.4g} -> {after:.4g}")
    if not a.skip_synthetic:
        for mode, r in synthetic().items():
            print(f"  4096x4096 MatMul search, {mode}: {r['wall']:.2f} s wall, {r['cpu']:.2f} s CPU "
                  f"(exact Gram: {r['exact']}; MSE {r['mse'][0]:.4g} -> {r['mse'][1]:.4g})")
    if a.skip_aimet:
        return 0
    if not os.path.exists(AIMET_PYTHON):
        print(f"  aimet-onnx: no python at {AIMET_PYTHON} (set QCOMPILER_AIMET_PYTHON); skipped")
        return 0
    path = os.path.join(out, "minilm_aimet_seq_mse.onnx")
    src, calib = os.path.join(a.corpus, "minilm_l6", "model.onnx"), os.path.join(a.corpus, "minilm_l6", "calib.npz")
    w0 = time.perf_counter()
    p = subprocess.run([AIMET_PYTHON, os.path.abspath(__file__), "--worker", src, calib, path, str(a.block)],
                       capture_output=True, text=True, timeout=7200)
    res = next((json.loads(line[7:]) for line in p.stdout.splitlines() if line.startswith("RESULT ")), None)
    if res is None:
        tail = (p.stderr.strip().splitlines() or ["(no output)"])[-1]
        print(f"  aimet-onnx: failed (exit {p.returncode}): {tail[:200]}")
        return 0
    print(f"  aimet-onnx apply_seq_mse: {res['wall']:.1f} s wall, {res['cpu']:.1f} s CPU for {res['layers']} layers "
          f"= {res['wall'] / res['layers']:.2f} s/layer; cosine {cosine(a.corpus, path)}; peak RSS "
          f"{res['peak_mb']:.0f} MB; worker {time.perf_counter() - w0:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
