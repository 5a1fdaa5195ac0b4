#!/usr/bin/env python3
"""GPT benchmarks: fathom vs PyTorch, same machine, same threads, same config, one invocation.

Measures, for the kjv-gpt config and a 6-layer/384-wide/6-head/block-256 model:
  - training tokens/s (fathom `train` vs PyTorch eager, and torch.compile when it works offline),
  - MFU against the measured OpenBLAS sgemm ceiling (numpy's OpenBLAS on 2 threads, n=2048, fastest of
    7, measured at the start and again after each config's training, the higher kept); MKL's
    (torch.mm) is reported too,
  - convergence: validation loss after the same number of steps, PyTorch starting from fathom's
    exact initial weights and training on exactly fathom's windows (see below),
  - batch-1 generation tokens/s with a KV cache (fathom `generate` vs a simple PyTorch KV-cache loop)
    and against the memory-bandwidth bound (weights + KV bytes per token / measured copy bandwidth).
Each result is one JSON line; ratio = fathom / peer for throughputs (higher is better for fathom).
Training throughput is timed in windows of steps/10 steps on both sides (fathom's log lines, PyTorch's
own clock), the first window left out; the ratio is of the best windows (the least disturbed on a
shared machine), and the means over all windows come along.

Same start, same data: a first `fathom train` of one step at learning rate 0 (AdamW then leaves
every weight exactly as initialized) writes the initial weights under Hugging Face GPT-2 names;
PyTorch loads them. Training windows are fathom's: Philox4x32-10 of (seed, step, row), as
fm_gpt_batch_random draws them, re-implemented here; the step-1 losses of the two (same weights,
same batch) are reported side by side as the check that both really match.

  .venv/bin/python bench/bench_gpt.py --fathom build/fathom [--steps 200] [--quick]
`fathom train` must route GPT recipes (data/recipes/*.ini with [model] type = gpt) to the GPT trainer.
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")  # numpy's OpenBLAS: the sgemm ceiling, on fathom's 2 threads
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn
import torch.nn.functional as F

THREADS = 2
torch.set_num_threads(THREADS)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIGS = {
    "kjv-gpt": dict(n_layer=4, n_head=4, n_embd=128, ffn=512, block=128, batch=16),
    "gpt-6x384": dict(n_layer=6, n_head=6, n_embd=384, ffn=1536, block=256, batch=8),
}


class Block(nn.Module):
    def __init__(s, c):
        super().__init__()
        C = c["n_embd"]
        s.h = c["n_head"]
        s.ln_1, s.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
        s.c_attn, s.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        s.fc, s.proj = nn.Linear(C, c["ffn"]), nn.Linear(c["ffn"], C)

    def attn(s, x, cache=None, pos=0):
        B, T, C = x.shape
        q, k, v = s.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, s.h, C // s.h).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            cache[0][:, :, pos:pos + T] = k
            cache[1][:, :, pos:pos + T] = v
            k, v = cache[0][:, :, :pos + T], cache[1][:, :, :pos + T]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=(pos == 0))
        return s.c_proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(s, x, cache=None, pos=0):
        x = x + s.attn(s.ln_1(x), cache, pos)
        return x + s.proj(F.gelu(s.fc(s.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s, c, V):
        super().__init__()
        s.c = c
        s.wte, s.wpe = nn.Embedding(V, c["n_embd"]), nn.Embedding(c["block"], c["n_embd"])
        s.h = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        s.ln_f = nn.LayerNorm(c["n_embd"])
        for p in s.parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0, 0.02)

    def forward(s, idx, targets=None, caches=None, pos=0):
        T = idx.shape[1]
        x = s.wte(idx) + s.wpe.weight[pos:pos + T]
        for i, b in enumerate(s.h):
            x = b(x, None if caches is None else caches[i], pos)
        logits = s.ln_f(x) @ s.wte.weight.t()
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def emit(**kw):
    print(json.dumps(kw), flush=True)


def load_tokens(path):
    with open(path, "rb") as f:
        h = f.read(32)
        assert h[:8] == b"FMTOKENS", "not a fathom token file"
        vocab, width = int.from_bytes(h[12:16], "little"), int.from_bytes(h[16:20], "little")
        n = int.from_bytes(h[24:32], "little")
        ids = np.frombuffer(f.read(n * width), dtype=np.uint16 if width == 2 else np.uint32).astype(np.int64)
    return torch.from_numpy(ids), vocab


SEED = 1337  # fathom's default training seed (the recipes below do not set one)
WARMUP, LR, MIN_LR = 100, 2e-3, 2e-4


def philox4x32(key, ctr_hi, ctr_lo):
    """Philox4x32-10 as src/core/rng.c computes it (fm_philox4x32)."""
    m32 = 0xFFFFFFFF
    c0, c1, c2, c3 = ctr_lo & m32, ctr_lo >> 32, ctr_hi & m32, ctr_hi >> 32
    k0, k1 = key & m32, key >> 32
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        n0, n2 = (p1 >> 32) ^ c1 ^ k0, (p0 >> 32) ^ c3 ^ k1
        c1, c3, c0, c2 = p1 & m32, p0 & m32, n0, n2
        k0, k1 = (k0 + 0x9E3779B9) & m32, (k1 + 0xBB67AE85) & m32
    return c0, c1, c2, c3


def fathom_window_starts(split, T, B, step, seed=SEED):
    """The window starts fm_gpt_batch_random(d, 0, split, B, T, seed, step) takes."""
    span = split - T
    out = []
    for b in range(B):
        r = philox4x32(seed, step, b)
        out.append(((r[0] << 32) | r[1]) % span)
    return out


def fathom_split(n_tokens):
    return int(n_tokens * (1.0 - 0.1))  # as gpt_train.c: (int64_t)((double)n * (1.0 - val_fraction))


def fathom_lr(s, steps):
    """fm_lr_at for the cosine schedule with warmup."""
    if s < WARMUP:
        return LR * (s + 1) / WARMUP
    span = steps - WARMUP
    if span <= 0:
        return MIN_LR
    t = min(1.0, (s - WARMUP) / span)
    return MIN_LR + 0.5 * (LR - MIN_LR) * (1 + math.cos(math.pi * t))


def batch_at(ids, split, c, step):
    T = c["block"]
    st = fathom_window_starts(split, T, c["batch"], step)
    return torch.stack([ids[i:i + T] for i in st]), torch.stack([ids[i + 1:i + T + 1] for i in st])


def load_fathom_init(model, path):
    """Loads fathom's Hugging Face GPT-2 safetensors into the bench model (Conv1D weights are [in, out])."""
    from safetensors.torch import load_file
    sd = load_file(path)
    names = {"wte.weight": "transformer.wte.weight", "wpe.weight": "transformer.wpe.weight",
             "ln_f.weight": "transformer.ln_f.weight", "ln_f.bias": "transformer.ln_f.bias"}
    conv1d = set()
    for i in range(model.c["n_layer"]):
        for mine, hf in (("ln_1", "ln_1"), ("ln_2", "ln_2"), ("c_attn", "attn.c_attn"), ("c_proj", "attn.c_proj"),
                         ("fc", "mlp.c_fc"), ("proj", "mlp.c_proj")):
            for p in ("weight", "bias"):
                names[f"h.{i}.{mine}.{p}"] = f"transformer.h.{i}.{hf}.{p}"
                if p == "weight" and mine not in ("ln_1", "ln_2"):
                    conv1d.add(f"h.{i}.{mine}.weight")
    own = dict(model.named_parameters())
    assert set(own) == set(names), sorted(set(own) ^ set(names))
    assert set(sd) == set(names.values()), sorted(set(sd) ^ set(names.values()))
    with torch.no_grad():
        for k, p in own.items():
            t = sd[names[k]]
            t = t.t() if k in conv1d else t
            assert t.shape == p.shape, (k, tuple(t.shape), tuple(p.shape))
            p.copy_(t)


def windows_of(steps):
    """The timing window: fathom logs (and reports tokens/s) every this many steps; PyTorch's
    steps are timed in the same windows. The first window holds start-up and is left out."""
    return max(1, steps // 10)


def rate_stats(rates):
    """(mean, best) over the windows after the first: on a shared machine the best window is the
    closest to a quiet one, the mean is what the whole run got."""
    r = rates[1:] if len(rates) > 1 else rates
    return sum(r) / len(r), max(r)


def torch_train(model, ids, c, steps, compiled=False, log_at=()):
    """AdamW on fathom's windows with fathom's schedule. Returns (mean, best) tokens/s over the
    timing windows, the validation loss, and {step: training loss} for the steps in log_at
    (1-based, as fathom logs)."""
    split = fathom_split(len(ids))
    B, T = c["batch"], c["block"]
    decay = [p for p in model.parameters() if p.dim() >= 2]
    nodecay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.95))
    fwd = torch.compile(model) if compiled else model
    losses, rates, win = {}, [], windows_of(steps)
    t_win = time.perf_counter()
    for s in range(steps):
        x, y = batch_at(ids, split, c, s)
        for pg in opt.param_groups:
            pg["lr"] = fathom_lr(s, steps)
        loss = fwd(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if s + 1 in log_at:
            losses[s + 1] = loss.item()
        if (s + 1) % win == 0:
            now = time.perf_counter()
            rates.append(B * T * win / (now - t_win))
            t_win = now
    tok_s = rate_stats(rates)
    # validation: the same deterministic walk of the held-out split as fathom (16 batches)
    model.eval()
    with torch.no_grad():
        vl = []
        n_win = (len(ids) - split - 1) // T
        for i in range(16):
            st = [split + ((i * B + b) % n_win) * T for b in range(B)]
            x = torch.stack([ids[s:s + T] for s in st])
            y = torch.stack([ids[s + 1:s + T + 1] for s in st])
            vl.append(model(x, y).item())
    model.train()
    return tok_s, sum(vl) / len(vl), losses


def best_time(fn, reps):
    """The fastest of reps calls: on a shared machine, the one least disturbed."""
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def sgemm_peaks():
    """(OpenBLAS, MKL) sgemm FLOP/s at n = 2048 on 2 threads: numpy's OpenBLAS and torch.mm's MKL."""
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    an, bn = a.numpy(), b.numpy()
    return 2 * n ** 3 / best_time(lambda: an @ bn, 7), 2 * n ** 3 / best_time(lambda: torch.mm(a, b), 7)


def copy_bandwidth():
    a = torch.empty(64 << 20, dtype=torch.uint8)
    b = torch.empty_like(a)
    return 2 * a.numel() / best_time(lambda: b.copy_(a), 7)


def train_flops_per_token(c, V):
    C, L, T = c["n_embd"], c["n_layer"], c["block"]
    n = L * (4 * C * C + 2 * C * c["ffn"]) + V * C
    return 6 * n + 6 * L * T * C  # PaLM: 6N + 12*L*T*C/2 (causal halves attention)


def write_recipe(d, name, c, steps, lr=LR, min_lr=MIN_LR, log_every=None):
    p = os.path.join(d, name + ".ini")
    log_every = log_every or windows_of(steps)
    with open(p, "w") as f:
        f.write(f"""[model]
type = gpt
arch = gpt2
n_layer = {c['n_layer']}
n_head = {c['n_head']}
n_embd = {c['n_embd']}
ffn_hidden = {c['ffn']}
block_size = {c['block']}
[tokenizer]
kind = bpe
vocab_size = 512
[data]
corpus = kjv
[train]
batch_size = {c['batch']}
steps = {steps}
warmup = {WARMUP}
lr = {lr}
min_lr = {min_lr}
eval_every = {steps}
eval_batches = 16
ckpt_every = {steps}
log_every = {log_every}
""")
    return p


def fathom_train(fathom, recipe, out, steps):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(THREADS), FATHOM_NUM_THREADS=str(THREADS))
    # --overwrite: the init run and the real run share the directory (the real one reuses tokens.bin)
    r = subprocess.run([fathom, "train", recipe, "--out", out, "--overwrite", "--steps", str(steps), "--json"], capture_output=True, text=True, errors="replace",
                       env=env)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    rates = [float(m) for m in re.findall(r"(\d+) tok/s", r.stderr)]
    if steps % windows_of(steps):
        rates = rates[:-1]  # the last line closes a shorter window
    losses = {int(a): float(b) for a, b in re.findall(r"step (\d+)/\d+  loss ([\d.]+)", r.stderr)}
    # stdout's result object has the last step's loss in full precision
    res = json.loads(r.stdout.strip().splitlines()[-1])
    losses[steps] = res["train_loss"]
    return rate_stats(rates), res["val_loss"], losses


def fathom_generate(fathom, out, n):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(THREADS), FATHOM_NUM_THREADS=str(THREADS))
    r = subprocess.run([fathom, "generate", out, "--prompt", "And", "--tokens", str(n), "--seed", "1"],
                       capture_output=True, text=True, errors="replace", env=env)
    m = re.search(r"\(([\d.]+) tokens/s", r.stderr)
    if r.returncode != 0 or not m:
        raise RuntimeError(r.stderr[-2000:])
    return float(m.group(1))


def torch_generate(model, c, n):
    model.eval()
    C, H = c["n_embd"], c["n_head"]
    caches = [(torch.zeros(1, H, c["block"], C // H), torch.zeros(1, H, c["block"], C // H)) for _ in range(c["n_layer"])]
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        tok = torch.tensor([[0]])
        logits = model(tok, caches=caches, pos=0)
        t0 = time.perf_counter()
        for pos in range(1, n + 1):
            p = torch.softmax(logits[0, -1] / 0.8, -1)
            tok = torch.multinomial(p, 1, generator=g).view(1, 1)
            logits = model(tok, caches=caches, pos=pos)
        dt = time.perf_counter() - t0
    model.train()
    return n / dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", default=os.path.join(ROOT, "build", "fathom"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--gen-tokens", type=int, default=100)
    ap.add_argument("--configs", default="kjv-gpt,gpt-6x384")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--compile-steps", type=int, default=50, help="steps of the torch.compile run (3.. are timed)")
    a = ap.parse_args()
    peak, peak_mkl = sgemm_peaks()
    bw = copy_bandwidth()
    emit(bench="machine", sgemm_openblas_gflops=round(peak / 1e9, 1), sgemm_mkl_gflops=round(peak_mkl / 1e9, 1),
         copy_gbps=round(bw / 1e9, 1), threads=THREADS,
         torch=torch.__version__)
    with tempfile.TemporaryDirectory() as d:
        for name in a.configs.split(","):
            c = CONFIGS[name]
            out = os.path.join(d, name)
            # step 1 at lr 0: the initial weights, exported; the real run then reuses the token file
            _, _, f_first = fathom_train(a.fathom, write_recipe(d, name + "-init", c, 1, 0.0, 0.0, 1), out, 1)
            init = os.path.join(d, name + "-init.safetensors")
            shutil.copyfile(os.path.join(out, "model.safetensors"), init)
            recipe = write_recipe(d, name, c, a.steps)
            f_tok, f_val, f_losses = fathom_train(a.fathom, recipe, out, a.steps)
            ids, V = load_tokens(os.path.join(out, "tokens.bin"))
            model = GPT(c, V)
            load_fathom_init(model, init)
            with torch.no_grad():
                t_first = model(*batch_at(ids, fathom_split(len(ids)), c, 0)).item()
            t_tok, t_val, t_losses = torch_train(model, ids, c, a.steps, log_at=set(f_losses))
            fpt = train_flops_per_token(c, V)
            win = windows_of(a.steps)
            # the ceiling again, after the training runs: a shared machine may have been busy at the start
            p2 = sgemm_peaks()
            peak, peak_mkl = max(peak, p2[0]), max(peak_mkl, p2[1])
            emit(bench="gpt_train", config=name, metric=f"tokens/s, best {win}-step window", fathom=round(f_tok[1]),
                 peer="torch eager", peer_value=round(t_tok[1]), ratio=round(f_tok[1] / t_tok[1], 3), threads=THREADS,
                 fathom_mfu=round(f_tok[1] * fpt / peak, 3), torch_mfu=round(t_tok[1] * fpt / peak, 3),
                 mfu_ceiling="OpenBLAS sgemm %.1f GFLOP/s (MKL %.1f)" % (peak / 1e9, peak_mkl / 1e9),
                 mean_fathom=round(f_tok[0]), mean_peer=round(t_tok[0]), mean_ratio=round(f_tok[0] / t_tok[0], 3))
            emit(bench="gpt_convergence", config=name, steps=a.steps, fathom_val_loss=round(f_val, 6),
                 torch_val_loss=round(t_val, 6), diff=round(f_val - t_val, 6),
                 step1_loss=[round(f_first[1], 6), round(t_first, 6)],
                 train_loss={k: [round(f_losses[k], 4), round(t_losses[k], 4)] for k in sorted(f_losses)})
            if not a.no_compile:
                try:
                    cm = GPT(c, V)
                    load_fathom_init(cm, init)
                    t0 = time.perf_counter()
                    n_c = min(a.steps, a.compile_steps)
                    c_tok, _, _ = torch_train(cm, ids, c, n_c, compiled=True)
                    emit(bench="gpt_train", config=name, metric=f"tokens/s, best {windows_of(n_c)}-step window",
                         fathom=round(f_tok[1]), peer="torch.compile", peer_value=round(c_tok[1]),
                         ratio=round(f_tok[1] / c_tok[1], 3), threads=THREADS, compile_steps=n_c,
                         mean_peer=round(c_tok[0]), wall_s_with_compilation=round(time.perf_counter() - t0, 1))
                except Exception as e:  # no compiler toolchain offline, etc.
                    emit(bench="gpt_train", config=name, peer="torch.compile", error=f"{type(e).__name__}: {e}"[:2000])
            n_gen = min(a.gen_tokens, c["block"] - 2)
            f_gen = fathom_generate(a.fathom, out, n_gen)
            t_gen = torch_generate(model, c, n_gen)
            n_params = sum(p.numel() for p in model.parameters())
            kv = 2 * c["n_layer"] * c["n_embd"] * (n_gen / 2) * 4  # average KV bytes read per token
            bound = bw / (n_params * 4 + kv)
            emit(bench="gpt_generate", config=name, metric="tokens/s", fathom=round(f_gen, 1),
                 peer="torch eager KV loop", peer_value=round(t_gen, 1), ratio=round(f_gen / t_gen, 3),
                 bandwidth_bound=round(bound), fathom_of_bound=round(f_gen / bound, 3), threads=THREADS)


if __name__ == "__main__":
    sys.exit(main())
