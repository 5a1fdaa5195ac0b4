#!/usr/bin/env python3
"""Efficiency options, fathom vs PyTorch, same GPT-2-style model and machine.

    .venv/bin/python bench/bench_efficiency.py build/bench_efficiency [--config kjv|6l] [--rounds R]

Runs the fathom bench (bench_efficiency --json, FATHOM_NUM_THREADS=2), then the
same model in PyTorch (torch.set_num_threads(2)) in a fresh process per mode:
fp32, CPU autocast bf16, CPU autocast fp16 + GradScaler, torch.utils.checkpoint
around each block (non-reentrant), and 4-way gradient accumulation.
PyTorch memory on the CPU has no allocator counters, so two measures are used:
  saved: bytes of the distinct storages autograd saves during forward
         (torch.autograd.graph.saved_tensors_hooks), the stored activations;
  act:   peak RSS during one step above the RSS at its start (after malloc_trim),
         minus the gradient bytes: activations plus backward temporaries.
Times are the best of the steps. The PyTorch children run with OMP_WAIT_POLICY=PASSIVE
(spinning OpenMP threads are several times slower on a loaded machine). Ratios are against each framework's own fp32 step in the same invocation.
"""
import ctypes
import json
import os
import subprocess
import sys
import time

CONFIGS = {
    "kjv": dict(n_layer=4, n_embd=256, n_head=4, block=128, vocab=256, batch=16),
    "6l": dict(n_layer=6, n_embd=384, n_head=6, block=256, vocab=256, batch=8),
}


def kjv_from_recipe():
    """The kjv-gpt recipe's sizes, as bench_efficiency.c reads them."""
    import configparser
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "recipes", "kjv-gpt.ini")
    if not os.path.exists(path):
        return
    cp = configparser.ConfigParser(inline_comment_prefixes=(";", "#"))
    cp.read(path)
    c = CONFIGS["kjv"]
    for sec, key, name in (("model", "n_layer", "n_layer"), ("model", "n_embd", "n_embd"), ("model", "n_head", "n_head"),
                           ("model", "block_size", "block"), ("tokenizer", "vocab_size", "vocab"),
                           ("train", "batch_size", "batch")):
        if cp.has_option(sec, key):
            c[name] = int(float(cp.get(sec, key)))


kjv_from_recipe()
MODES = ["fp32", "bf16", "fp16", "ckpt_blocks", "grad_accum4"]


def rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def child(cfg_name, mode, steps):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    torch.set_num_threads(2)
    torch.manual_seed(1234)
    c = CONFIGS[cfg_name]
    C, H, T, V, B = c["n_embd"], c["n_head"], c["block"], c["vocab"], c["batch"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.fc2 = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3 * H, C // H).split(H, dim=2)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, C))
            return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
            self.h = nn.ModuleList([Block() for _ in range(c["n_layer"])])
            self.lnf = nn.LayerNorm(C)

        def forward(self, idx, tgt, ckpt):
            x = self.wte(idx) + self.wpe.weight[: idx.shape[1]]
            for blk in self.h:
                x = checkpoint(blk, x, use_reentrant=False) if ckpt else blk(x)
            logits = F.linear(self.lnf(x), self.wte.weight)
            return F.cross_entropy(logits.float().reshape(-1, V), tgt.reshape(-1))

    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    g = torch.Generator().manual_seed(7)
    data = torch.randint(0, V, (B, T + 1), generator=g)
    x, y = data[:, :T], data[:, 1:]
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
    scaler = torch.amp.GradScaler("cpu") if mode == "fp16" else None
    accum = 4 if mode == "grad_accum4" else 1
    saved = {}

    def pack(t):
        s = t.untyped_storage()
        saved[s.data_ptr()] = s.nbytes()
        return t

    def step(measure):
        saved.clear()
        for k in range(accum):
            mb = B // accum
            xs, ys = x[k * mb:(k + 1) * mb], y[k * mb:(k + 1) * mb]
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                if dt is not None:
                    with torch.autocast("cpu", dtype=dt):
                        loss = model(xs, ys, mode == "ckpt_blocks")
                else:
                    loss = model(xs, ys, mode == "ckpt_blocks")
            if k == 0 and measure is not None:
                measure["saved"] = sum(saved.values())
            loss = loss / accum
            (scaler.scale(loss) if scaler else loss).backward()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item() * accum

    step(None)  # warm-up: optimizer state, allocator
    libc = ctypes.CDLL("libc.so.6")
    grads = sum(p.numel() * 4 for p in model.parameters())
    times, acts, saved_b = [], [], 0
    for _ in range(steps):
        libc.malloc_trim(0)
        base = rss_kib("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        m = {}
        t0 = time.perf_counter()
        step(m)
        times.append(time.perf_counter() - t0)
        acts.append(max(0, (rss_kib("VmHWM") - base) * 1024 - grads))
        saved_b = m.get("saved", 0)
    times.sort()
    print(json.dumps(dict(config=cfg_name, mode=mode, step_ms=1e3 * times[0], act_bytes=min(acts),
                          saved_bytes=saved_b, scale=scaler.get_scale() if scaler else 1.0)))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    if len(sys.argv) < 2:
        print(__doc__)
        sys.exit(2)
    binary, cfg, rounds = sys.argv[1], "kjv", 3
    args = sys.argv[2:]
    while args:
        a = args.pop(0)
        if a == "--config":
            cfg = args.pop(0)
        elif a == "--rounds":
            rounds = int(args.pop(0))
    env = dict(os.environ, FATHOM_NUM_THREADS="2")
    out = subprocess.run([binary, "--config", cfg, "--rounds", str(rounds), "--json"], env=env, capture_output=True,
                         text=True, check=True).stdout
    fa = {}
    for line in out.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            fa[r["mode"]] = r
    print(out)
    th = {}
    # OpenMP threads that spin at barriers collapse when the machine is oversubscribed
    # (measured here: 2178 ms -> 803 ms per fp32 step under a load average of 9)
    tenv = dict(os.environ)
    tenv.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    for mode in MODES:
        r = subprocess.run([sys.executable, __file__, "--child", cfg, mode, str(rounds)], capture_output=True, text=True,
                           env=tenv)
        if r.returncode != 0:
            print(f"torch {mode}: failed: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.returncode}")
            continue
        th[mode] = json.loads(r.stdout.strip().splitlines()[-1])
    base = th.get("fp32")
    print(f"\nPyTorch {__import__('torch').__version__}, config {cfg}: ratios against PyTorch fp32 in the same invocation")
    print(f"{'mode':16} {'torch act':>11} {'ratio':>7} {'torch saved':>12} {'ratio':>7} {'torch ms':>9} {'ratio':>7} "
          f"{'fathom ms':>10} {'fathom/torch':>12}")
    fmap = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "ckpt_blocks": "ckpt_blocks", "grad_accum4": "grad_accum4"}
    for mode in MODES:
        t = th.get(mode)
        if not t or not base:
            continue
        f = fa.get(fmap[mode])
        fms = f["step_ms"] if f else float("nan")
        print(f"{mode:16} {t['act_bytes'] / 2**20:9.2f}Mi {t['act_bytes'] / max(base['act_bytes'], 1):7.3f} "
              f"{t['saved_bytes'] / 2**20:10.2f}Mi {t['saved_bytes'] / max(base['saved_bytes'], 1):7.3f} "
              f"{t['step_ms']:9.1f} {t['step_ms'] / base['step_ms']:7.3f} {fms:10.1f} {fms / t['step_ms']:12.3f}")
        print(json.dumps(dict(t, framework="torch", act_ratio=t["act_bytes"] / max(base["act_bytes"], 1),
                              saved_ratio=t["saved_bytes"] / max(base["saved_bytes"], 1),
                              time_ratio=t["step_ms"] / base["step_ms"])))


if __name__ == "__main__":
    main()
