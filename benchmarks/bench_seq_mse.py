"""Sequential MSE: accuracy on minilm_l6 W4A16 per-block, search speed, and aimet-onnx.

usage: python benchmarks/bench_seq_mse.py [--corpus DIR] [--block 32] [--skip-aimet] [--skip-synthetic]
       python benchmarks/bench_seq_mse.py --search-only 4096 [--no-before]   (the search alone, before/after)

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
`--search-only 4096`, 06:07 UTC (load ~2.5): per channel before 1.75 s wall / 3.32 s CPU (1 BLAS thread: 2.35 s),
after 1.44 s / 1.44 s; per block 32 before 5.65 s / 8.04 s (1 thread: 4.47 s), after 1.79 s / 1.79 s; same
chosen scales. At 05:58 (load ~3-4, before the thread limit): before 20.4 s / 25.5 s wall.
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


# --- the search before the vectorised rewrite (kept to time it against and to check the same choices) ----------
def _old_fake_quant_kn(w, scale, zp, qmin, qmax, block):
    import numpy as np
    k = w.shape[0]
    if scale.shape[-2] > 1:
        scale = np.repeat(scale, block, axis=-2)[..., :k, :]
        zp = np.repeat(zp, block, axis=-2)[..., :k, :]
    s = scale.astype(np.float32, copy=False)
    z = zp.astype(np.float32)
    q = np.rint(w / s)
    q += z
    np.clip(q, qmin, qmax, out=q)
    q -= z
    q *= s
    return q


def _old_chunk(c, k, n):
    return int(max(1, min(n, (64 << 20) // max(4 * c * k, 1))))


def old_channel_losses(f, w, scale, zp, qmin, qmax, block, h=None):
    import numpy as np
    c, k, n = scale.shape[0], w.shape[0], w.shape[1]
    out = np.empty((c, n), np.float64)
    step = _old_chunk(c, max(k, f.shape[0]), n)
    for j in range(0, n, step):
        sl = slice(j, j + step)
        e = _old_fake_quant_kn(w[:, sl], scale[:, :, sl], zp[:, :, sl], qmin, qmax, block)
        e -= w[:, sl]
        y = np.matmul(f, e)
        out[:, sl] = np.einsum("crn,crn->cn", y, y, dtype=np.float64)
        if h is not None:
            out[:, sl] -= 2.0 * np.einsum("ckn,kn->cn", e, h[:, sl], dtype=np.float64)
    return out


def old_block_losses(x, w, scale, zp, qmin, qmax, block, h=None):
    import numpy as np
    c, nb, n = scale.shape
    k = w.shape[0]
    pad = nb * block - k
    xb = np.pad(x, ((0, 0), (0, pad))) if pad else x
    xb = np.ascontiguousarray(xb.reshape(x.shape[0], nb, block).transpose(1, 0, 2))
    gb = np.matmul(xb.transpose(0, 2, 1), xb)
    del xb
    hb = None if h is None else (np.pad(h, ((0, pad), (0, 0))) if pad else h).reshape(nb, block, n)
    out = np.empty((c, nb, n), np.float64)
    step = _old_chunk(c, nb * block, n)
    for j in range(0, n, step):
        sl = slice(j, j + step)
        m = len(range(*sl.indices(n)))
        e = _old_fake_quant_kn(w[:, sl], scale[:, :, sl], zp[:, :, sl], qmin, qmax, block)
        e -= w[:, sl]
        if pad:
            e = np.pad(e, ((0, 0), (0, pad), (0, 0)))
        e = np.ascontiguousarray(e.reshape(c, nb, block, m).transpose(1, 2, 0, 3)).reshape(nb, block, c * m)
        t = np.matmul(gb, e)
        if hb is not None:
            t.reshape(nb, block, c, m)[...] -= 2.0 * hb[:, :, None, sl]
        q = np.einsum("bik,bik->bk", t, e)
        out[:, :, sl] = q.reshape(nb, c, m).transpose(1, 0, 2)
    return out


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


def synthetic(size=4096, old=False):
    """The search alone (seq_mse.choose) on a random size x size weight and `size` random input rows, per channel
    and per block 32. `old`: also time the search before the vectorised rewrite (old_*_losses above) on the same
    data (with BLAS at its default thread count, as it ran, and with one thread) and check that the new search
    chose the same candidates."""
    import numpy as np
    from types import SimpleNamespace
    from qcompiler.passes.quantize import seq_mse
    from qcompiler.quant.core.encoding import compute_encoding
    from qcompiler.quant.calibration.layer_inputs import Layer
    from qcompiler.quant.core.qdq import block_encoding
    rng = np.random.default_rng(0)
    k = n = int(size)
    x = (rng.normal(size=(size, k)) * rng.uniform(0.1, 3, k)).astype(np.float32)
    w = (rng.normal(size=(k, n)) / np.sqrt(k)).astype(np.float32)
    node = SimpleNamespace(name="mm", inputs=[None, SimpleNamespace(name="w", const_value=lambda: w)])
    new = (seq_mse.channel_losses, seq_mse.block_losses)
    out = {}
    for mode in ("per-channel", "per-block 32"):
        enc = compute_encoding(w.min(0), w.max(0), bits=4, symmetric=True, signed=True, axis=1) \
            if mode == "per-channel" else block_encoding(w, 0, 32, 4, True)
        runs = {}
        for which in (("before", "before, 1 BLAS thread", "after") if old else ("after",)):
            seq_mse.channel_losses, seq_mse.block_losses = \
                (old_channel_losses, old_block_losses) if which.startswith("before") else new
            threads = seq_mse.BLAS_THREADS
            if which == "before":               # the old search left BLAS at its default thread count
                seq_mse.BLAS_THREADS = None
            elif which == "before, 1 BLAS thread":
                seq_mse.BLAS_THREADS = 1
            try:
                w0, c0 = time.perf_counter(), time.process_time()
                r = seq_mse.choose(Layer(node, SimpleNamespace(encoding=enc)), x)
                runs[which] = {"wall": time.perf_counter() - w0, "cpu": time.process_time() - c0,
                               "exact": r.exact, "mse": (r.mse_before, r.mse_after),
                               "scale": np.asarray(r.encoding.scale)}
            finally:
                seq_mse.channel_losses, seq_mse.block_losses = new
                seq_mse.BLAS_THREADS = threads
        if old:
            runs["same"] = bool(np.array_equal(runs["before"]["scale"], runs["after"]["scale"]))
        out[mode] = runs
    return out


def print_synthetic(size, old):
    for mode, runs in synthetic(size, old).items():
        for which in ("before", "before, 1 BLAS thread", "after"):
            if which in runs:
                r = runs[which]
                print(f"  {size}x{size} MatMul search, {mode}, {which}: {r['wall']:.2f} s wall, {r['cpu']:.2f} s CPU "
                      f"(exact Gram: {r['exact']}; MSE {r['mse'][0]:.4g} -> {r['mse'][1]:.4g})")
        if "same" in runs:
            print(f"  {mode}: same chosen scales before and after: {runs['same']}")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:])
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=DEFAULT_CORPUS)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--skip-aimet", action="store_true")
    ap.add_argument("--skip-synthetic", action="store_true")
    ap.add_argument("--search-only", type=int, metavar="SIZE",
                    help="only time the search on a random SIZE x SIZE MatMul (e.g. 4096), before and after")
    ap.add_argument("--no-before", action="store_true", help="with --search-only: skip the old (slow) search")
    a = ap.parse_args()
    if a.search_only:
        print_synthetic(a.search_only, not a.no_before)
        return 0
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
        print_synthetic(4096, False)
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
