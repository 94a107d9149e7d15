"""Quantization inside If/Loop/Scan bodies: the test models and the corpus char_rnn, in one run.

usage: python benchmarks/bench_bodies.py [--corpus DIR] [--target ort_cpu] [--runs 200] [--clock cpu|wall]
                                       [--optimize accuracy|balanced|latency]

Per model: QuantizeLinear nodes inside bodies (and in all), the worst output SQNR against float over every
branch's evaluation inputs (char_rnn: its first 64 eval windows), onnxruntime CPU latency of the float and the
quantized model (default session options, one intra-op thread, float and quantized runs interleaved by
qcompiler/quant/runtime/latency.time_interleaved, median over `--runs` runs of the first evaluation input of each branch, summed
over the branches; `--clock cpu` (default) times the CPU time of the running thread, which leaves out the time a
loaded machine keeps the process waiting) and the ratio; `kern f/q`: the nodes inside the bodies of onnxruntime's
optimized float and quantized graphs (what each If run or Loop/Scan iteration launches: with tensors of 8 to 256
values a kernel costs about the same whatever it computes, so this count, not the arithmetic, sets a tiny body's
latency). char_rnn has no bodies (its LSTM/GRU are ops of the main graph): it shows that main-graph models are
unchanged and how recurrent weights are stored on the target.

Why tiny bodies run slower quantized (measured on the CPU clock, one thread, this machine): a kernel launch costs
2-4 us whatever it computes, and the quantized Loop cell launches 41-45 kernels per iteration against float's 24
(onnxruntime fuses MatMul+Add into one float Gemm, while the quantized cell keeps a QLinearMatMul per MatMul, a
QLinearAdd per Add and Q/DQ around the Adds, Tanh and Muls it has no 8-bit kernel for). Single ops in a main
graph show the same: int8 QLinearConv/QLinearMatMul beat float only from about 0.25-1 M multiply-accumulates per
call (Conv 16->16 on 16x16: 0.76x; Conv 4->4 on 8x8: 1.30x; MatMul 1x64x64: 1.25x; MatMul 64x128x128: 0.89x).
`--optimize balanced` leaves float a body where no op runs an integer kernel (If(LSTM | GRU): 1.13x -> 1.08x);
a body whose integer kernels are merely tiny keeps its quantizers (the issue's promise on the default target).
"""
import argparse
import os
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
from qcompiler.sqnr import sqnr_db  # noqa: E402
DEFAULT_CORPUS = os.environ.get("QC_CORPUS", next(
    (p for p in (os.path.join(HERE, *[".."] * k, "shared", "corpus") for k in (2, 3)) if os.path.isdir(p)),
    os.path.join(HERE, "..", "..", "shared", "corpus")))   # /work/main or a worktree /work/wt/NAME


def session(proto):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


def quantizers(proto):
    """(QuantizeLinear nodes inside bodies, in all)."""
    def walk(g, inside):
        n_in = n_all = 0
        for n in g.node:
            if n.op_type == "QuantizeLinear":
                n_all += 1
                n_in += inside
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    i, t = walk(a.g, 1)
                    n_in, n_all = n_in + i, n_all + t
        return n_in, n_all
    return walk(proto.graph, 0)


def body_kernels(proto) -> int:
    """Nodes inside bodies of onnxruntime's optimized graph (one If branch each, one Loop/Scan iteration): the
    kernels a run or an iteration launches, which is what a body of tiny tensors costs."""
    from qcompiler.quant.runtime.kernels import optimized_graph

    def walk(g, inside):
        n = 0
        for node in g.node:
            n += inside
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    n += walk(a.g, 1)
        return n
    return walk(optimized_graph(proto).graph, 0)


def worst_sqnr(fs, qs, evals):
    worst = float("inf")
    for ev in evals:
        ref = [fs.run(None, f) for f in ev]
        got = [qs.run(None, f) for f in ev]
        for k in range(len(ref[0])):
            worst = min(worst, sqnr_db(np.stack([r[k] for r in ref]), np.stack([g[k] for g in got])))
    return worst


def latency_ms(proto, q, evals, runs, clock):
    """(float ms, quantized ms): medians of interleaved runs on each branch's first input, summed."""
    from qcompiler.quant.runtime.latency import time_interleaved
    lf = lq = 0.0
    for ev in evals:
        med = time_interleaved({"float": proto, "quantized": q}, ev[0], runs=runs, warmup=20, threads=1, clock=clock)
        lf, lq = lf + med["float"], lq + med["quantized"]
    return lf, lq


def bench(name, proto, calib, evals, target, runs, clock="cpu", optimize="balanced"):
    from qcompiler import model_to_proto
    from qcompiler.quant.api import quantize
    t0 = time.perf_counter()
    res = quantize(proto, calib, target=target, optimize=optimize)
    secs = time.perf_counter() - t0
    q = model_to_proto(res.model)
    fs, qs = session(proto), session(q)
    inside, total = quantizers(q)
    lf, lq = latency_ms(proto, q, evals, runs, clock)
    pre = res.report.get("prefolded_params", {})
    floated = sum(1 for b in res.plan.bodies if not b.activations)
    kern = f"{body_kernels(proto)}/{body_kernels(q)}"
    print(f"{name:16s} {inside:6d} {total:6d} {worst_sqnr(fs, qs, evals):8.1f} {lf:9.4f} {lq:9.4f} {lq / lf:6.2f} "
          f"{kern:>9s} {secs:6.2f}  {len(res.report['quantized_params'])} weights, {len(pre)} float on grid, "
          f"{floated}/{len(res.plan.bodies)} bodies without activation quantizers")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=DEFAULT_CORPUS)
    ap.add_argument("--target", default="ort_cpu")
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    ap.add_argument("--optimize", choices=["accuracy", "balanced", "latency"], default="balanced")
    a = ap.parse_args()
    from tests.quant.body_models import MODELS
    print(f"target {a.target}, --optimize {a.optimize}; latency: onnxruntime CPU, default session options, one "
          f"thread, {a.clock} clock, median of {a.runs} interleaved runs per branch (summed over branches)")
    print(f"{'model':16s} {'Q body':>6s} {'Q all':>6s} {'SQNR dB':>8s} {'float ms':>9s} {'quant ms':>9s} "
          f"{'ratio':>6s} {'kern f/q':>9s} {'q sec':>6s}  weights")
    for name, build in MODELS.items():
        proto, calib, evals = build()
        bench(name, proto, calib, evals, a.target, a.runs, a.clock, a.optimize)
    folder = os.path.join(a.corpus, "char_rnn")
    if os.path.isfile(os.path.join(folder, "model.onnx")):
        proto = onnx.load(os.path.join(folder, "model.onnx"))
        c, e = np.load(os.path.join(folder, "calib.npz")), np.load(os.path.join(folder, "eval.npz"))
        calib = [{"chars": c["chars"][i]} for i in range(c["chars"].shape[0])]
        evals = [[{"chars": e["chars"][i]} for i in range(64)]]
        bench("char_rnn", proto, calib, evals, a.target, a.runs, a.clock, a.optimize)
    else:
        print(f"char_rnn: not found under {a.corpus}")


if __name__ == "__main__":
    main()
