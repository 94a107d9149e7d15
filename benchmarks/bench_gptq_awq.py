"""GPTQ and AWQ numerics: output SQNR against round-to-nearest on synthetic LLM-like layers, and the time of one
4096 x 4096 layer.

usage: python benchmarks/bench_gptq_awq.py [--size 4096] [--block 128] [--threads 1] [--skip-gains] [--skip-speed]

1. Gains: tests/quant/test_gptq_awq.py's `llm_layer` (correlated features, outlier input channels, heavy-tailed
   weights), 4 bits symmetric, blocks 32 and 128, three seeds: held-out output SQNR of RTN and the dB above it of
   GPTQ, GPTQ act_order (dynamic and static groups), AWQ, AWQ + clip.
2. Speed: W [size, size], H from 2 * size correlated rows; wall and CPU seconds of the inverse Cholesky factor,
   GPTQ without and with act_order, the AWQ alpha search (20 candidates, 1024 rows) and the clip search
   (10 ratios, 4096 rows), with BLAS held to --threads threads (0: BLAS's default).
Load on this machine is shared: CPU seconds (process_time) are printed beside wall seconds.
"""
import argparse
import os
import sys
import time

import numpy as np
from threadpoolctl import threadpool_limits

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from qcompiler.passes.quantize.awq import awq_clip_search, awq_quantize_shared, awq_search  # noqa: E402
from qcompiler.passes.quantize.gptq import accumulate_hessian, gptq_quantize, inverse_cholesky  # noqa: E402
from qcompiler.passes.quantize.weight_blocks import dequantize, rtn_quantize  # noqa: E402
from qcompiler.sqnr import sqnr_db  # noqa: E402
from tests.quant.test_gptq_awq import llm_layer  # noqa: E402


def out_db(x, w, wq):
    return sqnr_db(x.astype(np.float64) @ w.T.astype(np.float64), x.astype(np.float64) @ wq.T.astype(np.float64))


def gains():
    print("seed block  RTN dB | dB above RTN: GPTQ  act_order  act_order+static  AWQ  AWQ+clip")
    for seed in (0, 1, 2):
        for block in (32, 128):
            xc, xe, w = llm_layer(seed)
            h, _ = accumulate_hessian(None, xc, 0)
            rtn = out_db(xe, w, dequantize(*rtn_quantize(w, 4, block, True), block))
            row = []
            for kw in ({"act_order": False}, {"act_order": True}, {"act_order": True, "static_groups": True}):
                row.append(out_db(xe, w, dequantize(*gptq_quantize(w, h, 4, block, **kw)[:3], block)))
            for clip in (False, True):
                s, [(q, sc, zp)], _ = awq_quantize_shared([w], xc, 4, block, True, clip=clip)
                row.append(out_db(xe / s, w * s, dequantize(q, sc, zp, block)))
            print(f"{seed:4d} {block:5d} {rtn:7.2f} | " + "  ".join(f"{v - rtn:+6.2f}" for v in row))


def timed(label, fn):
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    print(f"{label:34s} {time.perf_counter() - t:7.2f} s wall {time.process_time() - c:7.2f} s CPU", flush=True)
    return out


def speed(size, block):
    rng = np.random.default_rng(0)
    mix = rng.standard_normal((size, size), dtype=np.float32) / np.float32(np.sqrt(size))
    x = rng.standard_normal((2 * size, size), dtype=np.float32) @ mix
    x[:, rng.choice(size, 8, replace=False)] *= 50
    w = (rng.standard_t(3, (size, size)) * 0.02).astype(np.float32)
    h = timed("accumulate_hessian", lambda: accumulate_hessian(None, x, 0)[0])
    timed("inverse_cholesky (float64)", lambda: inverse_cholesky(h, 0.01))
    timed("gptq act_order=False", lambda: gptq_quantize(w, h, 4, block, act_order=False))
    timed("gptq act_order=True", lambda: gptq_quantize(w, h, 4, block, act_order=True))
    s, _ = timed("awq_search (20 alphas, 1024 rows)", lambda: awq_search(w, x, 4, block, True))
    timed("awq_clip_search (10 ratios, 4096 rows)", lambda: awq_clip_search(w * s, x / s, 4, block, True))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-gains", action="store_true")
    ap.add_argument("--skip-speed", action="store_true")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores, BLAS threads {args.threads or 'default'}")
    with threadpool_limits(args.threads or None, "blas"):
        if not args.skip_gains:
            gains()
        if not args.skip_speed:
            speed(args.size, args.block)


if __name__ == "__main__":
    main()
