"""Shared by make_decoder.py and train_decoder.py (benchmark venv, torch): build a Llama-shaped decoder from a
transformers LlamaConfig and export it with torch.onnx.export(dynamo=True) to DIR/model.onnx + model.onnx.data.

Graph interface: input `input_ids` int64 [batch, seq], output `logits` float32 [batch, seq, vocab]. No KV cache,
no attention_mask (all sequences are full length; causal masking is inside the graph).
"""
from __future__ import annotations

import collections
import json
import os
import time

import torch


def llama_config(hidden, layers, intermediate, vocab, heads, kv_heads=None, tie=False, max_pos=2048):
    from transformers import LlamaConfig
    return LlamaConfig(
        hidden_size=hidden, num_hidden_layers=layers, intermediate_size=intermediate, vocab_size=vocab,
        num_attention_heads=heads, num_key_value_heads=kv_heads or heads, tie_word_embeddings=tie,
        max_position_embeddings=max_pos, rms_norm_eps=1e-5, attention_dropout=0.0,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )


def build_model(cfg, seed=0):
    from transformers import LlamaForCausalLM
    torch.manual_seed(seed)
    cfg._attn_implementation = "eager"  # exports as plain MatMul/Softmax; sdpa exports the same on CPU, eager is safest
    m = LlamaForCausalLM(cfg)
    m.eval()
    return m


class LogitsOnly(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, input_ids):
        return self.m(input_ids=input_ids, use_cache=False).logits


def export(model, out_dir, seq=16, opset=18):
    """Export; returns a dict of facts (seconds, sizes, op counts). Writes model.onnx + model.onnx.data."""
    import onnx
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "model.onnx")
    for p in (path, path + ".data"):
        if os.path.exists(p):
            os.remove(p)
    wrapped = LogitsOnly(model).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, seq), dtype=torch.int64)
    batch, s = torch.export.Dim("batch", min=1, max=64), torch.export.Dim("seq", min=2, max=1024)
    t0 = time.perf_counter()
    with torch.no_grad():
        prog = torch.onnx.export(wrapped, (ids,), dynamo=True, input_names=["input_ids"], output_names=["logits"],
                                 dynamic_shapes={"input_ids": {0: batch, 1: s}}, opset_version=opset,
                                 external_data=True, optimize=True)
        prog.save(path, external_data=True)
    dt = time.perf_counter() - t0
    del prog
    m = onnx.load(path, load_external_data=False)
    ops = collections.Counter(n.op_type for n in m.graph.node)
    facts = {
        "export_seconds": round(dt, 1),
        "model_onnx_bytes": os.path.getsize(path),
        "data_bytes": os.path.getsize(path + ".data") if os.path.exists(path + ".data") else 0,
        "nodes": len(m.graph.node),
        "initializers": len(m.graph.initializer),
        "ops": dict(ops.most_common()),
        "inputs": [i.name for i in m.graph.input],
        "outputs": [o.name for o in m.graph.output],
        "lm_head": describe_head(m),
    }
    return facts


def describe_head(m):
    """What produces `logits`: the node, its inputs' producers / initializer shapes, and whether the embedding
    Gather's table is the same tensor (tied) or a separate copy."""
    prod = {o: n for n in m.graph.node for o in n.output}
    inits = {i.name: list(i.dims) for i in m.graph.initializer}
    out = m.graph.output[0].name
    n = prod.get(out)
    chain = []
    # walk back from logits through single-input reshapes to the MatMul / Gemm
    while n is not None and n.op_type not in ("MatMul", "Gemm", "MatMulNBits"):
        chain.append(n.op_type)
        n = prod.get(n.input[0])
    if n is None:
        return {"found": False}
    desc = {"op": n.op_type, "after": chain, "inputs": []}
    for i in n.input:
        if i in inits:
            desc["inputs"].append({"name": i, "initializer": inits[i]})
        elif i in prod:
            p = prod[i]
            d = {"name": i, "producer": p.op_type}
            if p.op_type == "Transpose" and p.input[0] in inits:
                d["transposes_initializer"] = p.input[0]
                d["shape"] = inits[p.input[0]]
            desc["inputs"].append(d)
    gathers = [g for g in m.graph.node if g.op_type == "Gather" and g.input[0] in inits]
    desc["embedding_gather_tables"] = [{"name": g.input[0], "shape": inits[g.input[0]]} for g in gathers]
    head_tensors = {d.get("transposes_initializer") or d["name"] for d in desc["inputs"]}
    desc["shares_embedding_table"] = any(g["name"] in head_tensors for g in desc["embedding_gather_tables"])
    return desc


def dir_bytes(d):
    return sum(os.path.getsize(os.path.join(d, f)) for f in ("model.onnx", "model.onnx.data")
               if os.path.exists(os.path.join(d, f)))


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
