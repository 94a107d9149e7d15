"""Train a small real decoder on text that ships on this machine, then export it (benchmark venv, torch).

    /work/venv_bench/bin/python train_decoder.py --out /tmp/llm_work/trained [--steps 700]

Model: Llama-shaped (RMSNorm, RoPE, SwiGLU), byte-level vocabulary (256 tokens: a token is one byte of UTF-8
text, no tokenizer files needed), tied input/output embeddings. Defaults: hidden 256, 4 layers, intermediate 768,
4 heads, context 128.
Text: Python's standard library sources (top-level *.py of the running interpreter's lib, or --pylib) and the
license texts in /usr/share/common-licenses. Split by FILE, deterministically: files sorted by name, every
10th file (index % 10 == 3) is held out. The held-out files give eval.npz; the training files give calib.npz.
Training: AdamW, linear warm-up then cosine decay over --steps (default 700 steps of 16x128 bytes: ~8 min on
2 idle cores), seeded data order, so a rerun gives the same weights up to float nondeterminism.

Writes DIR/model.onnx + model.onnx.data (input `input_ids` int64 [batch, seq], output `logits`), DIR/calib.npz
(`input_ids`, (128, 1, 128), random windows of training text, seeded), DIR/eval.npz (`input_ids`, (64, 1, 128),
evenly spaced windows of held-out text), DIR/weights.pt (state dict) and DIR/info.json (config, steps, losses,
float perplexity on eval.npz measured in torch, export facts incl. what the tied lm_head became in the graph).
"""
from __future__ import annotations

import argparse
import glob
import math
import os
import sys
import sysconfig
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

LICENSES = "/usr/share/common-licenses"


def corpus_files(pylib):
    files = sorted(glob.glob(os.path.join(pylib, "*.py")))
    files += sorted(p for p in glob.glob(os.path.join(LICENSES, "*")) if os.path.isfile(p) and not os.path.islink(p))
    return files


def split_files(files):
    train, held = [], []
    for i, f in enumerate(files):
        (held if i % 10 == 3 else train).append(f)
    return train, held


def load_bytes(files):
    parts = []
    for f in files:
        with open(f, "rb") as fh:
            parts.append(fh.read())
    return np.frombuffer(b"\n\n".join(parts), dtype=np.uint8).astype(np.int64)


def windows_random(data, n, seq, rng):
    starts = rng.integers(0, len(data) - seq - 1, size=n)
    return np.stack([data[s:s + seq] for s in starts])


def windows_even(data, n, seq):
    starts = np.linspace(0, len(data) - seq - 1, n).astype(np.int64)
    return np.stack([data[s:s + seq] for s in starts])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/llm_work/trained")
    ap.add_argument("--pylib", default=sysconfig.get_paths()["stdlib"])
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--steps", type=int, default=700, help="training steps (the schedule follows them)")
    ap.add_argument("--minutes", type=float, default=0.0,
                    help="instead of --steps: a wall-time budget that the schedule follows (not reproducible)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calib-samples", type=int, default=128)
    ap.add_argument("--eval-samples", type=int, default=64)
    a = ap.parse_args(argv)

    import export_util as E
    import torch
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)

    files = corpus_files(a.pylib)
    train_f, held_f = split_files(files)
    train, held = load_bytes(train_f), load_bytes(held_f)
    print(f"corpus: {len(files)} files ({a.pylib}/*.py + {LICENSES}); train {len(train_f)} files "
          f"{len(train) / 1e6:.2f} MB, held out {len(held_f)} files {len(held) / 1e6:.2f} MB", flush=True)
    os.makedirs(a.out, exist_ok=True)
    eval_ids = windows_even(held, a.eval_samples, a.seq)
    calib_ids = windows_random(train, a.calib_samples, a.seq, np.random.default_rng(a.seed + 100))
    np.savez(os.path.join(a.out, "eval.npz"), input_ids=eval_ids[:, None, :])
    np.savez(os.path.join(a.out, "calib.npz"), input_ids=calib_ids[:, None, :])

    cfg = E.llama_config(a.hidden, a.layers, a.intermediate, 256, a.heads, tie=True, max_pos=max(2048, a.seq))
    from transformers import LlamaForCausalLM
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: hidden {a.hidden} layers {a.layers} intermediate {a.intermediate} heads {a.heads} vocab 256 "
          f"tied, {n_params / 1e6:.2f} M params", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    budget = a.minutes * 60
    warm = 50

    def lr_at(step, frac):
        if step < warm:
            return a.lr * (step + 1) / warm
        return a.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))

    def eval_loss(m):
        m.eval()
        with torch.no_grad():
            x = torch.from_numpy(eval_ids)
            tot = 0.0
            for i in range(0, len(x), 16):
                lo = m(input_ids=x[i:i + 16]).logits
                tot += torch.nn.functional.cross_entropy(lo[:, :-1].reshape(-1, 256), x[i:i + 16, 1:].reshape(-1),
                                                         reduction="sum").item()
        m.train()
        return tot / (len(x) * (a.seq - 1))

    t0 = time.perf_counter()
    step, losses, ema = 0, [], None
    while True:
        el = time.perf_counter() - t0
        frac = el / budget if a.minutes else step / a.steps
        if frac >= 1.0:
            break
        for g in opt.param_groups:
            g["lr"] = lr_at(step, frac)
        xb = torch.from_numpy(windows_random(train, a.batch, a.seq + 1, rng))
        logits = model(input_ids=xb[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), xb[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        step += 1
        if step % 50 == 0:
            losses.append((step, round(el, 1), round(ema, 4)))
            print(f"step {step} {el:.0f}s train loss (ema) {ema:.3f} lr {opt.param_groups[0]['lr']:.2e}", flush=True)
    train_s = time.perf_counter() - t0
    ev = eval_loss(model)
    print(f"trained {step} steps in {train_s:.0f} s ({step * a.batch * a.seq / train_s:.0f} tokens/s); "
          f"held-out loss {ev:.4f} nats/byte, perplexity {math.exp(ev):.3f}", flush=True)
    sd = model.state_dict()
    torch.save(sd, os.path.join(a.out, "weights.pt"))

    # export from an eager-attention copy (plain MatMul/Softmax in the graph)
    em = E.build_model(cfg, seed=a.seed)
    em.load_state_dict(sd)
    em.eval()
    facts = E.export(em, a.out)
    info = dict(kind="trained", config={"hidden": a.hidden, "layers": a.layers, "intermediate": a.intermediate,
                                            "heads": a.heads, "vocab": 256, "tie": True, "seq": a.seq},
                params=n_params, steps=step, batch=a.batch, lr=a.lr, train_seconds=round(train_s, 1),
                train_files=len(train_f), heldout_files=[os.path.basename(f) for f in held_f],
                train_bytes=len(train), heldout_bytes=len(held), losses=losses,
                torch_eval_loss=round(ev, 5), torch_eval_perplexity=round(math.exp(ev), 4), **facts)
    E.write_json(os.path.join(a.out, "info.json"), info)
    h = facts["lm_head"]
    print(f"exported {a.out}: {facts['nodes']} nodes, data {facts['data_bytes'] / 2**20:.1f} MiB; lm_head {h}")


if __name__ == "__main__":
    main()
