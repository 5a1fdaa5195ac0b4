#!/usr/bin/env python3
"""Golden fixtures for tests/test_gpt.c: a minimal GPT-2 and Llama-style model in
PyTorch (written here, no transformers library), run in float64 so the reference is
as exact as possible, while fathom runs in float32 and is compared within tolerances.

For each variant it writes two safetensors files under tests/fixtures/gpt/:
  <variant>_init.safetensors  the initial weights under Hugging Face names (GPT-2 Conv1D
                              weights stored [in, out], exactly as HF checkpoints are), f32
  <variant>_ref.safetensors   x/y batches, step-0 logits and loss, grad.<name> for every
                              parameter (same layout as the init file), and the losses of
                              10 AdamW steps (one batch per step, clipping on)
Run:  .venv/bin/python tools/make_gpt_fixtures.py
"""
import json
import math
import os

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "gpt")
DT = torch.float64

# The hyper-parameters the C test repeats (keep them in sync).
CFG = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, vocab_size=64)
B, T, STEPS = 2, 16, 10
OPT = dict(lr=3e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, clip=1.0)


def gpt2_params(g, bias=True):
    C, L, V = CFG["n_embd"], CFG["n_layer"], CFG["vocab_size"]
    p = {}
    rn = lambda *s, std=0.02: torch.randn(*s, generator=g, dtype=DT) * std
    p["transformer.wte.weight"] = rn(V, C)
    p["transformer.wpe.weight"] = rn(CFG["block_size"], C)
    for i in range(L):
        h = f"transformer.h.{i}."
        # LayerNorm weights/biases are perturbed so their gradients are exercised
        p[h + "ln_1.weight"] = 1 + rn(C, std=0.1)
        p[h + "ln_1.bias"] = rn(C, std=0.1)
        p[h + "attn.c_attn.weight"] = rn(C, 3 * C)  # Conv1D: [in, out]
        p[h + "attn.c_attn.bias"] = rn(3 * C)
        p[h + "attn.c_proj.weight"] = rn(C, C, std=0.02 / math.sqrt(2 * L))
        p[h + "attn.c_proj.bias"] = rn(C)
        p[h + "ln_2.weight"] = 1 + rn(C, std=0.1)
        p[h + "ln_2.bias"] = rn(C, std=0.1)
        p[h + "mlp.c_fc.weight"] = rn(C, 4 * C)
        p[h + "mlp.c_fc.bias"] = rn(4 * C)
        p[h + "mlp.c_proj.weight"] = rn(4 * C, C, std=0.02 / math.sqrt(2 * L))
        p[h + "mlp.c_proj.bias"] = rn(C)
    p["transformer.ln_f.weight"] = 1 + rn(C, std=0.1)
    p["transformer.ln_f.bias"] = rn(C, std=0.1)
    return p


def gpt2_forward(p, x):
    C, H, L = CFG["n_embd"], CFG["n_head"], CFG["n_layer"]
    Bx, Tx = x.shape
    h = p["transformer.wte.weight"][x] + p["transformer.wpe.weight"][:Tx]
    for i in range(L):
        k = f"transformer.h.{i}."
        a = F.layer_norm(h, (C,), p[k + "ln_1.weight"], p[k + "ln_1.bias"], 1e-5)
        qkv = a @ p[k + "attn.c_attn.weight"] + p[k + "attn.c_attn.bias"]
        q, kk, v = qkv.split(C, dim=2)
        q = q.view(Bx, Tx, H, C // H).transpose(1, 2)
        kk = kk.view(Bx, Tx, H, C // H).transpose(1, 2)
        v = v.view(Bx, Tx, H, C // H).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, kk, v, is_causal=True)
        y = y.transpose(1, 2).reshape(Bx, Tx, C)
        h = h + y @ p[k + "attn.c_proj.weight"] + p[k + "attn.c_proj.bias"]
        a = F.layer_norm(h, (C,), p[k + "ln_2.weight"], p[k + "ln_2.bias"], 1e-5)
        a = F.gelu(a @ p[k + "mlp.c_fc.weight"] + p[k + "mlp.c_fc.bias"], approximate="tanh")
        h = h + a @ p[k + "mlp.c_proj.weight"] + p[k + "mlp.c_proj.bias"]
    h = F.layer_norm(h, (C,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], 1e-5)
    return h @ p["transformer.wte.weight"].t()  # tied output embedding


LLAMA = dict(n_kv_head=2, ffn_hidden=96, rope_theta=10000.0, norm_eps=1e-5)


def llama_params(g):
    C, L, V, H = CFG["n_embd"], CFG["n_layer"], CFG["vocab_size"], CFG["n_head"]
    D, KV, Fh = C // H, LLAMA["n_kv_head"], LLAMA["ffn_hidden"]
    rn = lambda *s, std=0.02: torch.randn(*s, generator=g, dtype=DT) * std
    p = {"model.embed_tokens.weight": rn(V, C)}
    for i in range(L):
        k = f"model.layers.{i}."
        p[k + "input_layernorm.weight"] = 1 + rn(C, std=0.1)
        p[k + "self_attn.q_proj.weight"] = rn(H * D, C)  # nn.Linear: [out, in]
        p[k + "self_attn.k_proj.weight"] = rn(KV * D, C)
        p[k + "self_attn.v_proj.weight"] = rn(KV * D, C)
        p[k + "self_attn.o_proj.weight"] = rn(C, H * D, std=0.02 / math.sqrt(2 * L))
        p[k + "post_attention_layernorm.weight"] = 1 + rn(C, std=0.1)
        p[k + "mlp.gate_proj.weight"] = rn(Fh, C)
        p[k + "mlp.up_proj.weight"] = rn(Fh, C)
        p[k + "mlp.down_proj.weight"] = rn(C, Fh, std=0.02 / math.sqrt(2 * L))
    p["model.norm.weight"] = 1 + rn(C, std=0.1)
    return p


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, Tx):
    D = x.shape[-1]
    inv = 1.0 / (LLAMA["rope_theta"] ** (torch.arange(0, D, 2, dtype=DT) / D))
    f = torch.outer(torch.arange(Tx, dtype=DT), inv)
    emb = torch.cat([f, f], dim=-1)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * emb.cos() + torch.cat([-x2, x1], dim=-1) * emb.sin()


def llama_forward(p, x):
    C, H, L = CFG["n_embd"], CFG["n_head"], CFG["n_layer"]
    KV, D, eps = LLAMA["n_kv_head"], C // H, LLAMA["norm_eps"]
    Bx, Tx = x.shape
    h = p["model.embed_tokens.weight"][x]
    for i in range(L):
        k = f"model.layers.{i}."
        a = rms_norm(h, p[k + "input_layernorm.weight"], eps)
        q = (a @ p[k + "self_attn.q_proj.weight"].t()).view(Bx, Tx, H, D).transpose(1, 2)
        kk = (a @ p[k + "self_attn.k_proj.weight"].t()).view(Bx, Tx, KV, D).transpose(1, 2)
        v = (a @ p[k + "self_attn.v_proj.weight"].t()).view(Bx, Tx, KV, D).transpose(1, 2)
        q, kk = rope(q, Tx), rope(kk, Tx)
        rep = H // KV
        kk = kk.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, kk, v, is_causal=True)
        y = y.transpose(1, 2).reshape(Bx, Tx, C)
        h = h + y @ p[k + "self_attn.o_proj.weight"].t()
        a = rms_norm(h, p[k + "post_attention_layernorm.weight"], eps)
        a = F.silu(a @ p[k + "mlp.gate_proj.weight"].t()) * (a @ p[k + "mlp.up_proj.weight"].t())
        h = h + a @ p[k + "mlp.down_proj.weight"].t()
    h = rms_norm(h, p["model.norm.weight"], eps)
    return h @ p["model.embed_tokens.weight"].t()


def batches(g):
    # A learnable stream (a noisy counting pattern), so the 10 losses really fall.
    V = CFG["vocab_size"]
    xs, ys = [], []
    for _ in range(STEPS):
        start = torch.randint(0, V, (B, 1), generator=g)
        seq = (start + torch.arange(T + 1) * 3) % V
        noise = torch.randint(0, V, (B, T + 1), generator=g)
        mask = torch.rand(B, T + 1, generator=g) < 0.1
        seq = torch.where(mask, noise, seq)
        xs.append(seq[:, :T])
        ys.append(seq[:, 1:])
    return torch.stack(xs), torch.stack(ys)


def run(name, params, forward):
    g = torch.Generator().manual_seed(1234)
    X, Y = batches(g)
    # the fixture weights are f32: the reference starts from exactly those values
    p = {k: v.float().double().requires_grad_(True) for k, v in params.items()}
    names = list(p.keys())
    # decay only 2-D tensors (weights and embeddings), as fathom does
    decay = {k for k in names if p[k].dim() >= 2}
    opt = torch.optim.AdamW(
        [{"params": [p[k] for k in names if k in decay], "weight_decay": OPT["weight_decay"]},
         {"params": [p[k] for k in names if k not in decay], "weight_decay": 0.0}],
        lr=OPT["lr"], betas=(OPT["beta1"], OPT["beta2"]), eps=OPT["eps"])
    ref = {}
    losses = []
    for step in range(STEPS):
        logits = forward(p, X[step])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), Y[step].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if step == 0:
            ref["logits"] = logits.detach().float()
            ref["loss"] = loss.detach().float().reshape(1)
            for k in names:
                ref["grad." + k] = p[k].grad.detach().float()
        torch.nn.utils.clip_grad_norm_([p[k] for k in names], OPT["clip"])
        losses.append(loss.item())
        opt.step()
    ref["x"] = X.to(torch.int64)
    ref["y"] = Y.to(torch.int64)
    ref["losses"] = torch.tensor(losses, dtype=torch.float64)
    meta = {"config": json.dumps(CFG), "optim": json.dumps(OPT)}
    save_file({k: v.float().contiguous() for k, v in params.items()},
              os.path.join(OUT, name + "_init.safetensors"), metadata=meta)
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(OUT, name + "_ref.safetensors"),
              metadata=meta)
    print(name, "losses", " ".join(f"{l:.6f}" for l in losses))


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    run("gpt2", gpt2_params(torch.Generator().manual_seed(42)), gpt2_forward)
    run("llama", llama_params(torch.Generator().manual_seed(43)), llama_forward)


if __name__ == "__main__":
    main()
