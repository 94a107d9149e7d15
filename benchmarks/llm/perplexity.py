"""Perplexity and logits SQNR of an ONNX decoder with onnxruntime (project venv or benchmark venv).

    python perplexity.py MODEL.onnx EVAL.npz [--ref FLOAT.onnx] [--samples N] [--save-logits OUT.npy]

EVAL.npz: key `input_ids`, shape (N, 1, seq) int64 (one sequence per sample). The model takes `input_ids`
[1, seq] and returns `logits` [1, seq, vocab]. Perplexity = exp(mean next-token cross-entropy): logits at
position t score token t+1, over every sample (N * (seq-1) predictions), natural log.
Default onnxruntime SessionOptions (CPU provider). Prints one JSON line: perplexity, loss (nats/token),
tokens, seconds, logits shape, and with --ref the logits SQNR (dB) of MODEL against the reference model on the
same inputs; --save-logits writes the float32 logits (N, seq, vocab).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np


def load_ids(eval_npz, samples=0):
    ids = np.load(eval_npz)["input_ids"]
    if ids.ndim == 2:
        ids = ids[:, None, :]
    if samples:
        ids = ids[:samples]
    return ids.astype(np.int64)


def session(model_path, threads=0, optimized_path=None):
    import onnxruntime as ort
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
    if optimized_path:
        so.optimized_model_filepath = optimized_path
        # big models: the optimized file keeps its initializers in a side file (protobuf's 2 GB limit)
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                    optimized_path.rsplit("/", 1)[-1] + ".data")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    return ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])


def run_logits(sess, ids):
    """ids (N, 1, seq) -> logits (N, seq, vocab) float32."""
    out = None
    for i in range(len(ids)):
        lo = sess.run(["logits"], {"input_ids": ids[i]})[0][0]
        if out is None:
            out = np.empty((len(ids),) + lo.shape, np.float32)
        out[i] = lo
    return out


def cross_entropy(logits, ids):
    """Mean next-token cross-entropy (nats) and token count. logits (N, seq, V), ids (N, 1, seq)."""
    tot, n = 0.0, 0
    for lo, x in zip(logits, ids[:, 0, :]):
        z = lo[:-1].astype(np.float64)
        z = z - z.max(-1, keepdims=True)
        lse = np.log(np.exp(z).sum(-1))
        tot += float((lse - z[np.arange(len(z)), x[1:]]).sum())
        n += len(z)
    return tot / n, n


def sqnr_db(ref, cand):
    """10*log10(sum ref^2 / sum (ref - cand)^2) over all logits; inf when identical, nan on non-finite output."""
    ref = np.asarray(ref, np.float64)
    cand = np.asarray(cand, np.float64)
    if not np.all(np.isfinite(cand)):
        return float("nan")
    err = float(((ref - cand) ** 2).sum())
    sig = float((ref ** 2).sum())
    return float("inf") if err == 0 else 10 * math.log10(sig / err)


def logits_sqnr(float_model, cand_model, eval_npz, samples=0):
    """Logits SQNR (dB) of cand_model against float_model on the same inputs (default session options)."""
    ids = load_ids(eval_npz, samples)
    ref = run_logits(session(float_model), ids)
    cand = run_logits(session(cand_model), ids)
    return sqnr_db(ref, cand)


def evaluate(model_path, eval_npz, samples=0, ref_logits=None):
    ids = load_ids(eval_npz, samples)
    t0 = time.perf_counter()
    lo = run_logits(session(model_path), ids)
    dt = time.perf_counter() - t0
    loss, n = cross_entropy(lo, ids)
    res = {"perplexity": round(math.exp(loss), 5), "loss": round(loss, 6), "tokens": n, "samples": len(ids),
           "seconds": round(dt, 3), "logits_shape": list(lo.shape)}
    if ref_logits is not None:
        res["sqnr_db"] = round(sqnr_db(ref_logits, lo), 3)
    return res, lo


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("eval_npz")
    ap.add_argument("--ref", help="float model: also report logits SQNR against it")
    ap.add_argument("--samples", type=int, default=0, help="first N samples only (0: all)")
    ap.add_argument("--save-logits")
    a = ap.parse_args(argv)
    ref = None
    if a.ref:
        ref = run_logits(session(a.ref), load_ids(a.eval_npz, a.samples))
    res, lo = evaluate(a.model, a.eval_npz, a.samples, ref)
    if a.save_logits:
        np.save(a.save_logits, lo)
        res["logits"] = a.save_logits
    res["model"] = a.model
    print(json.dumps(res))


if __name__ == "__main__":
    sys.exit(main())
