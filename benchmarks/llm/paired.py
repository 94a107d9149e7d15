"""Per-sequence next-token loss and KL(float || model) of several models on eval.npz, paired against the first
model: is a perplexity gap beyond noise?

    python paired.py EVAL.npz FLOAT.onnx BASE.onnx OTHER.onnx ...

One JSON line per model: perplexity, the mean paired loss difference against BASE and its t (mean / standard
error over the sequences), the KL divergence from FLOAT's next-token distribution (x1e-4 nats/token), its paired
t against BASE, and how many sequences have a lower KL than BASE's. Perplexity moves either way under small
weight noise; KL measures how far the model is from float.
"""
from __future__ import annotations

import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perplexity import load_ids, run_logits, session  # noqa: E402


def log_probs(logits):
    """log softmax of the logits at every position but the last: (N, seq - 1, V) float64."""
    z = logits[:, :-1].astype(np.float64)
    z -= z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def t_stat(d) -> float:
    se = d.std(ddof=1) / math.sqrt(len(d)) if len(d) > 1 else 0.0
    return round(float(d.mean() / se), 2) if se else float("nan")


def main(argv) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    ids = load_ids(argv[0])
    targets = ids[:, 0, 1:]
    lp_float = log_probs(run_logits(session(argv[1]), ids))
    p_float = np.exp(lp_float)
    loss, kl = {}, {}
    for m in argv[2:]:
        lp = log_probs(run_logits(session(m), ids))
        loss[m] = -np.take_along_axis(lp, targets[..., None], -1)[..., 0].mean(1)
        kl[m] = (p_float * (lp_float - lp)).sum(-1).mean(1)
    base = argv[2]
    for m in argv[2:]:
        d, dk = loss[m] - loss[base], kl[m] - kl[base]
        print(json.dumps({"model": m, "perplexity": round(math.exp(loss[m].mean()), 4),
                          "dloss": round(float(d.mean()), 6), "t_loss": t_stat(d),
                          "kl_1e4": round(1e4 * float(kl[m].mean()), 3), "t_kl": t_stat(dk),
                          "seqs_kl_lower": int((dk < 0).sum())}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
