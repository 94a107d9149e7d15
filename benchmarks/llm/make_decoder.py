"""Build a random-init Llama-shaped decoder and export it to ONNX (benchmark venv: /work/venv_bench/bin/python).

    python make_decoder.py --preset 0.5b --out /tmp/llm_work/0.5b
    python make_decoder.py --preset growth-8 --out /tmp/llm_work/growth-8
    python make_decoder.py --hidden 256 --layers 4 --intermediate 768 --vocab 1024 --heads 4 --tie-embeddings --out D

Writes DIR/model.onnx + DIR/model.onnx.data (external data), DIR/calib.npz and DIR/eval.npz (key `input_ids`,
shape (N, 1, seq) int64, seeded random tokens: calibration and measurement inputs are different draws) and
DIR/info.json (config, sizes, export time, op counts, what the lm_head looks like in the graph).
Random weights (std 0.02, RMSNorm weights 1) have no outlier channels: use train_decoder.py for accuracy work.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

PRESETS = {
    # ~0.55 B parameters, 2.2 GB float32: untied embeddings (embed 32000x1536 and lm_head 1536x32000)
    "0.5b": {"hidden": 1536, "layers": 16, "intermediate": 4096, "vocab": 32000, "heads": 12, "tie": False},
}


def preset(name):
    if name in PRESETS:
        return dict(PRESETS[name])
    if name.startswith("growth-"):
        n = int(name.split("-", 1)[1])
        if not 1 <= n <= 64:
            raise SystemExit(f"growth-N: N={n} out of range")
        return {"hidden": 512, "layers": n, "intermediate": 1408, "vocab": 32000, "heads": 8, "tie": False}
    raise SystemExit(f"unknown preset {name!r}: 0.5b or growth-N")


def random_tokens(path, n, seq, vocab, seed):
    rng = np.random.default_rng(seed)
    np.savez(path, input_ids=rng.integers(0, vocab, size=(n, 1, seq), dtype=np.int64))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", help="0.5b | growth-N (hidden 512, N layers)")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=1408)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--tie-embeddings", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calib-samples", type=int, default=32)
    ap.add_argument("--eval-samples", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)

    cfgd = preset(a.preset) if a.preset else {"hidden": a.hidden, "layers": a.layers, "intermediate": a.intermediate,
                                                   "vocab": a.vocab, "heads": a.heads, "tie": a.tie_embeddings}
    if a.preset and a.tie_embeddings:
        cfgd["tie"] = True
    import export_util as E
    import torch
    torch.set_num_threads(os.cpu_count() or 1)
    t0 = time.perf_counter()
    cfg = E.llama_config(cfgd["hidden"], cfgd["layers"], cfgd["intermediate"], cfgd["vocab"], cfgd["heads"],
                         tie=cfgd["tie"])
    model = E.build_model(cfg, seed=a.seed)
    n_params = sum(p.numel() for p in model.parameters())
    t_build = time.perf_counter() - t0
    print(f"built {cfgd} params={n_params / 1e6:.1f} M ({n_params * 4 / 2**30:.2f} GiB float32) in {t_build:.1f} s",
          flush=True)
    facts = E.export(model, a.out)
    del model
    random_tokens(os.path.join(a.out, "calib.npz"), a.calib_samples, a.seq, cfgd["vocab"], a.seed + 1)
    random_tokens(os.path.join(a.out, "eval.npz"), a.eval_samples, a.seq, cfgd["vocab"], a.seed + 2)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    info = dict(kind="random", preset=a.preset, config=cfgd, params=n_params, seed=a.seed, seq=a.seq,
                build_seconds=round(t_build, 1), total_seconds=round(time.perf_counter() - t0, 1),
                peak_rss_mb=round(peak), **facts)
    E.write_json(os.path.join(a.out, "info.json"), info)
    print(f"exported {a.out}: model.onnx {facts['model_onnx_bytes'] / 2**20:.2f} MiB + data "
          f"{facts['data_bytes'] / 2**30:.3f} GiB, {facts['nodes']} nodes; export {facts['export_seconds']} s, "
          f"total {info['total_seconds']} s, peak RSS {peak / 1024:.2f} GiB")
    h = facts["lm_head"]
    print(f"lm_head: {h.get('op')} inputs={[(i.get('producer') or 'initializer', i.get('initializer') or i.get('shape')) for i in h.get('inputs', [])]} shares_embedding_table={h.get('shares_embedding_table')}")


if __name__ == "__main__":
    main()
