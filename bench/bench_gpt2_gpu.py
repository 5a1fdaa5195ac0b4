#!/usr/bin/env python3
"""GPT-2 124M (12 layers, 768 wide, 12 heads, T=1024, vocab 50257) training on one GPU in
PyTorch: bf16 autocast, torch.compile, fused AdamW, the same TF32 setting as fathom's side
(fathom multiplies f32 in true f32 unless FATHOM_CUDA_TF32=1; pass --tf32 to match that
variable). The peer row of tools/gpu-check.sh; fathom's row comes from `fathom train` with
the same shape on the same GPU.

Prints one JSON line: tokens/s over the timed steps (after --warmup steps, which include
compilation), MFU against the dense bf16 peak given (--peak-tflops, default the H100/H200
SXM datasheet's 989), and peak allocated memory. The FLOPs per token are the usual
6 * parameters (without the position embedding) + 12 * layers * T * width (attention),
as llm.c and nanoGPT count them, so both sides are judged by one formula.

usage: python3 bench/bench_gpt2_gpu.py [--batch 8] [--steps 20] [--warmup 5] [--tf32]
       [--no-compile] [--peak-tflops 989]
smoke test without a GPU: --device cpu --no-compile --layers 1 --width 64 --heads 2 --seq 32
       --vocab 100 --batch 2 --steps 2 --warmup 1"""
import argparse, json, math, sys, time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, T, L, d, h):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(T, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(L))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--tf32", action="store_true", help="allow TF32 for f32 matmuls (as FATHOM_CUDA_TF32=1)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak of the GPU")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test of this script with tiny sizes")
    a = ap.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"bench": "gpt2_124m_train", "error": "no CUDA device visible to PyTorch"}))
        return 2
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    torch.manual_seed(1337)
    dev = a.device
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    model = GPT(a.vocab, a.seq, a.layers, a.width, a.heads).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    n_flop_params = n_params - model.wpe.weight.numel()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    step_fn = model if a.no_compile else torch.compile(model)
    g = torch.Generator(device=dev).manual_seed(0)
    data = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=dev, generator=g)
    x, y = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    losses = []

    def step():
        with torch.autocast(device_type=dev, dtype=torch.bfloat16):
            loss = step_fn(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        losses.append(step().item())
    sync()
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    losses.append(loss.item())  # one sync at the end: no host round trip per step
    sync()
    dt = time.perf_counter() - t0
    tok_s = a.batch * a.seq * a.steps / dt
    flop_per_tok = 6 * n_flop_params + 12 * a.layers * a.seq * a.width
    mfu = tok_s * flop_per_tok / (a.peak_tflops * 1e12)
    print(json.dumps({
        "bench": "gpt2_124m_train", "side": "torch", "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
        "compile": not a.no_compile, "tf32": a.tf32, "batch": a.batch, "seq": a.seq, "vocab": a.vocab, "params": n_params,
        "steps": a.steps, "tokens_per_s": round(tok_s, 1), "mfu": round(mfu, 4),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2 ** 30, 3) if dev == "cuda" else None,
        "first_loss": round(losses[0], 4), "last_loss": round(losses[-1], 4),
        "loss_is_finite": all(math.isfinite(v) for v in losses)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
