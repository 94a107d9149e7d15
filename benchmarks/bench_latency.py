"""Latency of quantized models in onnxruntime: float vs qcompiler vs onnxruntime's quantize_static, interleaved.

usage: python benchmarks/bench_latency.py [--corpus DIR] [--models a,b] [--runs 30] [--threads 1] [--clock cpu|wall]
                                         [--optimize balanced[,latency,...]] [--eval] [--details]
                                         [--ort-variants per_channel[,per_tensor]]

For each corpus model (DIR/*/model.onnx with calib.npz; read in place, never copied) and three small models
built here with random weights (MobileNet-style Conv+HardSwish+SE, ResNet-style Conv+BN+Relu+Add, a BERT-style
encoder), the float model is quantized by qcompiler (`qcompiler.quant.api.quantize`, default settings) and by
onnxruntime (`quantize_static`, QDQ, per-channel, MinMax, its default int8 types) on the same calibration samples,
and the three models are timed round-robin in one process (qcompiler/quant/runtime/latency.py: default session options, a fixed
intra-op thread count, median of --runs after warm-up). The table gives the medians, the two ratios
qc/float and qc/ort, and how many nodes of each quantized model run on integer kernels in onnxruntime's
optimized graph (qcompiler/quant/runtime/kernels.py), and the size of each file (float, qc, ort; MB and the ratios
to float). `--details` prints, per model, why qcompiler's float nodes are float.
`--optimize a,b` quantizes once per mode (qc rows `model/mode`, all timed in the same round-robin); `--eval` adds
the accuracy of the qc and the ort model: the corpus model's own eval.py (agreement, cosine or top-1 drop in
points), or for a built model the worst output SQNR against float on its calibration samples (dB).
`--ort-variants per_channel,per_tensor` quantizes with onnxruntime once per variant, times all of them in the
same round-robin and lists them under the table; the ort columns show the first, its accuracy column the best.
The last column names the targets a row misses (`ok` when none): slow>float (qc/float > 1.05), slow>ort
(qc/ort > 1.05 against any variant whose accuracy is within 0.5 point of qc's; dB for built models), acc<ort (qc
less accurate than ort's best variant), size>float (qc's file larger than float's), size>ort (under `--optimize size` only: qc's file over
1.05x ort's; `balanced` keeps a float kernel's weights exact float, docs/optimize.md).
The CPU's instruction-set flags come first (AVX2 / AVX512-VNNI / AVX-VNNI: VNNI makes u8 x s8 products cheap).
Compare ratios within one run; the machine is shared and absolute times move. The default clock is the timing
thread's CPU time (qcompiler/quant/runtime/latency.py): under load the wall-clock median of a run longer than a scheduler slice
jumps several-fold (a 1.7 ms model read 10-20 ms at load average 12 while its 1.2 ms float model did not).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from qcompiler.onnx_io import model_to_proto  # noqa: E402
from qcompiler.quant.api import quantize  # noqa: E402
from qcompiler.quant.runtime.kernels import kernel_report  # noqa: E402
from qcompiler.quant.runtime.latency import time_interleaved  # noqa: E402

CORPUS = "/work/shared/corpus"
N_CALIB = 16


def cpu_flags() -> dict:
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags.update(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return {k: k in flags for k in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8")}


# ---- small models with random weights -------------------------------------------------------------------------

class _B:
    """A tiny graph builder: unique names, initializers from numpy."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.k = [], [], 0

    def name(self, p):
        self.k += 1
        return f"{p}{self.k}"

    def w(self, shape, scale=None):
        n = self.name("w")
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        a = self.rng.normal(0, scale or (2.0 / fan_in) ** 0.5, shape).astype(np.float32)
        self.inits.append(numpy_helper.from_array(a, n))
        return n

    def c(self, arr):
        n = self.name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(arr), n))
        return n

    def op(self, op, inputs, **attrs):
        out = self.name(op.lower() + "_")
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.name(op), **attrs))
        return out

    def conv(self, x, cin, cout, k=3, s=1, group=1, bias=True):
        ins = [x, self.w((cout, cin // group, k, k))] + ([self.c(self.rng.normal(0, 0.05, cout).astype(np.float32))]
                                                        if bias else [])
        return self.op("Conv", ins, kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4, group=group)

    def bn(self, x, c):
        r = self.rng
        return self.op("BatchNormalization", [x, self.c(r.uniform(0.5, 1.5, c).astype(np.float32)),
                                              self.c(r.normal(0, 0.1, c).astype(np.float32)),
                                              self.c(r.normal(0, 0.1, c).astype(np.float32)),
                                              self.c(r.uniform(0.5, 1.5, c).astype(np.float32))])

    def model(self, x, shape, y, opset=17):
        g = helper.make_graph(self.nodes, "g", [helper.make_tensor_value_info(x, TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, None)], self.inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
        m.ir_version = 8
        return m


def mobilenet_like(seed=0):
    """MobileNetV3-style: stem Conv+HardSwish, inverted residual blocks (expand 1x1 + HardSwish, depthwise 3x3 +
    HardSwish, squeeze-excite GAP-Conv-Relu-Conv-HardSigmoid-Mul, project 1x1, residual Add), GAP, Gemm."""
    b = _B(seed)
    x = b.op("HardSwish", [b.conv("x", 3, 16, s=2)])
    c = 16
    for cout, s, e in ((24, 2, 64), (24, 1, 72), (40, 2, 96), (40, 1, 120)):
        h = b.op("HardSwish", [b.conv(x, c, e, k=1)])
        h = b.op("HardSwish", [b.conv(h, e, e, s=s, group=e)])
        se = b.op("GlobalAveragePool", [h])
        se = b.op("Relu", [b.conv(se, e, e // 4, k=1)])
        se = b.op("HardSigmoid", [b.conv(se, e // 4, e, k=1)], alpha=1 / 6, beta=0.5)
        h = b.op("Mul", [h, se])
        h = b.conv(h, e, cout, k=1)
        x = b.op("Add", [x, h]) if (s == 1 and c == cout) else h
        c = cout
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
    y = b.op("Gemm", [x, b.w((10, c)), b.c(np.zeros(10, np.float32))], transB=1)
    return b.model("x", [1, 3, 160, 160], y), [1, 3, 160, 160]


def resnet_like(seed=1):
    """ResNet-style: stem Conv+BN+Relu, MaxPool, basic blocks (Conv+BN+Relu, Conv+BN, shortcut, Add, Relu)."""
    b = _B(seed)
    x = b.op("Relu", [b.bn(b.conv("x", 3, 32, k=3, s=2, bias=False), 32)])
    x = b.op("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    c = 32
    for cout, s in ((32, 1), (64, 2), (64, 1), (128, 2)):
        h = b.op("Relu", [b.bn(b.conv(x, c, cout, s=s, bias=False), cout)])
        h = b.bn(b.conv(h, cout, cout, bias=False), cout)
        sc = x if (s == 1 and c == cout) else b.bn(b.conv(x, c, cout, k=1, s=s, bias=False), cout)
        x = b.op("Relu", [b.op("Add", [h, sc])])
        c = cout
    x = b.op("Flatten", [b.op("GlobalAveragePool", [x])])
    y = b.op("Gemm", [x, b.w((10, c)), b.c(np.zeros(10, np.float32))], transB=1)
    return b.model("x", [1, 3, 128, 128], y), [1, 3, 128, 128]


def bert_like(seed=2, layers=2, seq=64, hidden=256, heads=4, ffn=1024):
    """A BERT-style encoder on embeddings: per layer Q/K/V MatMul+Add, scaled scores, Softmax, context, output
    projection, residual + LayerNormalization, GELU (Erf form) feed-forward, residual + LayerNormalization."""
    b = _B(seed)
    d = hidden // heads
    x = "x"
    shp = b.c(np.array([1, seq, heads, d], np.int64))
    back = b.c(np.array([1, seq, hidden], np.int64))

    def linear(t, n_in, n_out):
        return b.op("Add", [b.op("MatMul", [t, b.w((n_in, n_out), 0.05)]),
                            b.c(b.rng.normal(0, 0.02, n_out).astype(np.float32))])

    def ln(t):
        return b.op("LayerNormalization", [t, b.c(np.ones(hidden, np.float32)), b.c(np.zeros(hidden, np.float32))],
                    axis=-1, epsilon=1e-12)

    for _ in range(layers):
        q = b.op("Transpose", [b.op("Reshape", [linear(x, hidden, hidden), shp])], perm=[0, 2, 1, 3])
        k = b.op("Transpose", [b.op("Reshape", [linear(x, hidden, hidden), shp])], perm=[0, 2, 3, 1])
        v = b.op("Transpose", [b.op("Reshape", [linear(x, hidden, hidden), shp])], perm=[0, 2, 1, 3])
        s = b.op("Div", [b.op("MatMul", [q, k]), b.c(np.array(d ** 0.5, np.float32))])
        p = b.op("Softmax", [s], axis=-1)
        ctx = b.op("Reshape", [b.op("Transpose", [b.op("MatMul", [p, v])], perm=[0, 2, 1, 3]), back])
        x = ln(b.op("Add", [x, linear(ctx, hidden, hidden)]))
        h = linear(x, hidden, ffn)
        g = b.op("Mul", [b.op("Mul", [h, b.op("Add", [b.op("Erf", [b.op("Div", [h, b.c(np.array(2 ** 0.5,
                                                                                                  np.float32))])]),
                                                      b.c(np.array(1.0, np.float32))])]),
                         b.c(np.array(0.5, np.float32))])
        x = ln(b.op("Add", [x, linear(g, ffn, hidden)]))
    return b.model("x", [1, seq, hidden], x), [1, seq, hidden]


BUILT = {"mobilenet_like": mobilenet_like, "resnet_like": resnet_like, "bert_like": bert_like}


# ---- quantizers -------------------------------------------------------------------------------------------------

class _Reader:
    def __init__(self, samples):
        self.samples, self.i = samples, 0

    def get_next(self):
        if self.i >= len(self.samples):
            return None
        self.i += 1
        return self.samples[self.i - 1]


ORT_VARIANTS = ("per_channel", "per_tensor")


def ort_quantize(float_path, samples, out_path, variant="per_channel"):
    from onnxruntime.quantization import CalibrationDataReader, CalibrationMethod, QuantFormat, quantize_static

    class Reader(_Reader, CalibrationDataReader):
        pass

    import logging
    logging.getLogger().setLevel(logging.ERROR)
    quantize_static(float_path, out_path, Reader(samples), quant_format=QuantFormat.QDQ,
                    per_channel=variant == "per_channel", calibrate_method=CalibrationMethod.MinMax)
    return onnx.load(out_path)


def corpus_samples(md):
    d = np.load(os.path.join(md, "calib.npz"))
    n = next(iter(d.values())).shape[0]
    return [{k: d[k][i] for k in d.files} for i in range(n)]


def cases(corpus, only):
    out = []
    for md in sorted(glob.glob(os.path.join(corpus, "*", "model.onnx"))):
        name = os.path.basename(os.path.dirname(md))
        if not only or name in only:
            out.append((name, md, None))
    for name, fn in BUILT.items():
        if not only or name in only:
            out.append((name, None, fn))
    return out


def accuracy(path, model, samples, fmodel, tmp) -> tuple:
    """(text, points) of `model`: the corpus model's eval.py (its metric in points, x100; a drop in points for
    top-1 metrics), else the worst output SQNR against the float model on the calibration samples (dB). `points`
    is higher-better and comparable between two models of the same row (the 0.5-point rule of the targets)."""
    folder = os.path.dirname(path) if path else None
    ev = os.path.join(folder, "eval.py") if folder else None
    if ev and os.path.isfile(ev):
        import subprocess
        qpath = os.path.join(tmp, "eval.qdq.onnx")
        onnx.save(model, qpath)
        r = subprocess.run([sys.executable, ev, qpath], capture_output=True, text=True)
        try:
            d = json.loads(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return "eval failed", float("nan")
        pts = 100 * d["value"]
        if d.get("metric") == "agreement" or "cosine" in str(d.get("metric")):
            return f"{'agree' if d['metric'] == 'agreement' else 'cosine'} {d['value']:.4f}", pts
        return f"drop {100 * (d['float_value'] - d['value']):.2f}pt", pts
    from qcompiler.ort_session import create_session
    from qcompiler.sqnr import db_from_powers, powers
    fs, qs = create_session(fmodel, role="float"), create_session(model, role="quantized")
    sig, noise = {}, {}
    for feed in samples:
        for i, (a, b) in enumerate(zip(fs.raw.run(None, feed), qs.raw.run(None, feed))):
            s, n = powers(a, b)
            sig[i], noise[i] = sig.get(i, 0.0) + s, noise.get(i, 0.0) + n
    worst = min(db_from_powers(sig[i], noise[i]) for i in sig)
    return f"SQNR {worst:.1f} dB", worst


def file_bytes(model, path) -> int:
    """Bytes of `model` written to `path` (one file: every model here is under 2 GB)."""
    onnx.save(model, path)
    return os.path.getsize(path)


TOL = 0.05        # the targets: no model slower than float, or than onnxruntime's, by more than 5 %
ACC_POINTS = 0.5  # ... than onnxruntime's where its accuracy is within this many points of ours


def missed(r) -> str:
    """The targets a row misses: slower than float or onnxruntime (at about its accuracy) by more than 5 %,
    below onnxruntime's accuracy, a file larger than float's, or (`--optimize size`, the objective that buys
    bytes) larger than onnxruntime's by more than 5 %. `balanced` keeps a float kernel's weights exact float
    (docs/optimize.md): its file is judged against float only."""
    out = []
    if r["qc_over_float"] > 1 + TOL:
        out.append("slow>float")
    acc_q = r.get("accuracy_points")
    variants = r["ort_variants"].values()
    if any(r["qc_ms"] > (1 + TOL) * v["ms"] and (acc_q is None or v.get("accuracy_points") is None
                                                  or abs(acc_q - v["accuracy_points"]) <= ACC_POINTS)
           for v in variants):
        out.append("slow>ort")
    best = max((v["accuracy_points"] for v in variants if v.get("accuracy_points") is not None), default=None)
    if acc_q is not None and best is not None and acc_q < best:
        out.append("acc<ort")
    if r["qc_bytes"] > r["float_bytes"]:
        out.append("size>float")
    if r["optimize"] == "size" and r["qc_bytes"] > (1 + TOL) * r["ort_bytes"]:
        out.append("size>ort")
    return ",".join(out) or "ok"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=CORPUS)
    ap.add_argument("--models", default="", help="comma-separated names (default: all)")
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads of every session (0: onnxruntime's)")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="cpu: the timing thread's CPU time (threads=1; robust on a loaded machine); wall: elapsed")
    ap.add_argument("--details", action="store_true", help="why qcompiler's float nodes are float, per model")
    ap.add_argument("--optimize", default="balanced", help="comma-separated --optimize modes for qcompiler")
    ap.add_argument("--eval", action="store_true", help="accuracy of each qc model (corpus eval.py, else SQNR dB)")
    ap.add_argument("--ort-variants", default="per_channel",
                    help=f"comma-separated quantize_static variants ({', '.join(ORT_VARIANTS)}); the first fills "
                         "the ort columns, the targets are judged against every one")
    args = ap.parse_args(argv)
    only = {m for m in args.models.split(",") if m}
    threads = args.threads or None
    if args.clock == "cpu" and threads != 1:
        ap.error("--clock cpu needs --threads 1")
    flags = cpu_flags()
    import onnxruntime
    print(f"onnxruntime {onnxruntime.__version__}, CPU flags: "
          + ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in flags.items())
          + f"; threads={threads or 'default'}, runs={args.runs} (median, interleaved, {args.clock} clock)")
    modes = [m for m in args.optimize.split(",") if m]
    ort_variants = [v for v in args.ort_variants.split(",") if v]
    if not ort_variants or any(v not in ORT_VARIANTS for v in ort_variants):
        ap.error(f"--ort-variants: a comma-separated list of {', '.join(ORT_VARIANTS)}")
    aw = 30 if len(ort_variants) > 1 else 16
    hdr = (f"{'model':25s} {'float ms':>9s} {'qc ms':>8s} {'ort ms':>8s} {'qc/float':>9s} {'qc/ort':>7s} "
           f"{'int qc':>7s} {'int ort':>8s} {'float MB':>9s} {'qc MB':>8s} {'ort MB':>8s} {'qc/float':>9s} "
           f"{'ort/float':>9s}" + (f" {'accuracy':>16s} {'ort accuracy':>{aw}s}" if args.eval else "")
           + "  targets")
    rows, details = [], []
    tmp = tempfile.mkdtemp(prefix="bench-latency-")
    try:
        for name, path, fn in cases(args.corpus, only):
            if path is not None:
                fmodel = onnx.load(path)
                samples = corpus_samples(os.path.dirname(path))
                fpath = path
            else:
                fmodel, shape = fn()
                rng = np.random.default_rng(7)
                samples = [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(N_CALIB)]
                fpath = os.path.join(tmp, f"{name}.onnx")
                onnx.save(fmodel, fpath)
            f_bytes = os.path.getsize(fpath)
            qcs, t_qc, acc, q_bytes = {}, {}, {}, {}
            for mode in modes:
                t0 = time.perf_counter()
                res = quantize(fpath, list(samples), progress=False, optimize=mode)
                qcs[mode] = model_to_proto(res.model)
                t_qc[mode] = time.perf_counter() - t0
                q_bytes[mode] = file_bytes(qcs[mode], os.path.join(tmp, f"{name}.qc.onnx"))
                if args.eval:
                    acc[mode] = accuracy(path, qcs[mode], samples, fmodel, tmp)
            orts, ovar = {}, {}
            for v in ort_variants:
                ort_path = os.path.join(tmp, f"{name}.ort.{v}.onnx")
                orts[v] = ort_quantize(fpath, list(samples), ort_path, v)
                ovar[v] = {"bytes": os.path.getsize(ort_path)}
                if args.eval:
                    ovar[v]["accuracy"], ovar[v]["accuracy_points"] = accuracy(path, orts[v], samples, fmodel, tmp)
            med = time_interleaved({"float": fmodel, **{f"qc/{m}": q for m, q in qcs.items()},
                                    **{f"ort/{v}": o for v, o in orts.items()}},
                                   samples[0], args.runs, args.warmup, threads, args.clock)
            for v in ort_variants:
                ovar[v]["ms"] = med[f"ort/{v}"]
            first = ovar[ort_variants[0]]
            med["ort"], o_bytes = first["ms"], first["bytes"]
            ko = kernel_report(orts[ort_variants[0]], threads=threads)
            for mode, qc in qcs.items():
                kq = kernel_report(qc, threads=threads)
                q_ms = med[f"qc/{mode}"]
                row = {"model": name if len(modes) == 1 else f"{name}/{mode}", "optimize": mode,
                       "float_ms": med["float"], "qc_ms": q_ms, "ort_ms": med["ort"],
                       "qc_over_float": q_ms / med["float"], "qc_over_ort": q_ms / med["ort"],
                       "int_nodes_qc": kq.integer_count, "int_nodes_ort": ko.integer_count,
                       "float_nodes_qc": len(kq.float_nodes), "float_nodes_ort": len(ko.float_nodes),
                       "runtime_qdq_qc": kq.runtime_qdq, "runtime_qdq_ort": ko.runtime_qdq,
                       "float_bytes": f_bytes, "qc_bytes": q_bytes[mode], "ort_bytes": o_bytes,
                       "qc_bytes_over_float": q_bytes[mode] / f_bytes, "ort_bytes_over_float": o_bytes / f_bytes,
                       "qc_quantize_s": round(t_qc[mode], 2), "ort_variants": ovar}
                if args.eval:
                    best = max(ort_variants, key=lambda v: ovar[v]["accuracy_points"])
                    row.update(accuracy=acc[mode][0], accuracy_points=acc[mode][1],
                               ort_accuracy=ovar[best]["accuracy"] + (f" [{best}]" if len(ort_variants) > 1 else ""),
                               ort_accuracy_points=ovar[best]["accuracy_points"])
                row["targets"] = missed(row)
                rows.append(row)
                print(f"{row['model']}: float {med['float']:.3f} ms, qc {q_ms:.3f} ms, "
                      + ", ".join(f"ort/{v} {ovar[v]['ms']:.3f} ms" for v in ort_variants), file=sys.stderr, flush=True)
                if args.details:
                    details.append((row["model"], kq))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(hdr)
    for r in rows:
        print(f"{r['model']:25s} {r['float_ms']:9.3f} {r['qc_ms']:8.3f} {r['ort_ms']:8.3f} {r['qc_over_float']:9.2f} "
              f"{r['qc_over_ort']:7.2f} {r['int_nodes_qc']:7d} {r['int_nodes_ort']:8d} {r['float_bytes'] / 1e6:9.3f} "
              f"{r['qc_bytes'] / 1e6:8.3f} {r['ort_bytes'] / 1e6:8.3f} {r['qc_bytes_over_float']:9.2f} "
              f"{r['ort_bytes_over_float']:9.2f}"
              + (f" {r['accuracy']:>16s} {r['ort_accuracy']:>{aw}s}" if args.eval else "") + f"  {r['targets']}")
    if len(ort_variants) > 1:
        print("\nonnxruntime variants (ms, MB, accuracy):")
        for r in rows:
            print(f"  {r['model']:25s} " + "; ".join(
                f"{v} {d['ms']:.3f} ms {d['bytes'] / 1e6:.3f} MB" + (f" {d['accuracy']}" if 'accuracy' in d else "")
                for v, d in r["ort_variants"].items()))
    for name, kq in details:
        print(f"\n{name}: {kq.integer_count} nodes on integer kernels, {len(kq.float_nodes)} float; "
              f"onnxruntime keeps {kq.runtime_qdq} Q/DQ")
        for reason, n in kq.reasons().most_common():
            print(f"  {n:3d} x {reason}")
    print(json.dumps({"cpu": flags, "threads": threads, "runs": args.runs, "clock": args.clock,
                      "rows": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()}
                               for r in rows]}))


if __name__ == "__main__":
    main()
