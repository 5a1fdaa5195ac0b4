#!/usr/bin/env python3
"""fathom vs PyTorch on the training workloads of issue 3, side by side, same threads.

Rows (one JSON line each; ratio = fathom / torch for times, lower is better):
  mlp_train_step   784-1024-1024-10 MLP, batch 128, SGD momentum 0.9
  cnn_train_step   the fashion-cnn model, batch 64, Adam
  cnn_recipe       (--full) the whole fashion-cnn recipe: wall time and test accuracy

Usage: .venv/bin/python bench/bench_train.py BUILD_DIR [--steps 30] [--rounds 3] [--threads 2] [--full]
                                             [--precision fp32|bf16|both]
Rounds alternate fathom and torch so that load from other processes hits both alike;
each row reports the median over rounds of the per-step mean.
--precision bf16 runs the forward under bf16 autocast on both sides (torch.autocast("cpu",
torch.bfloat16); bench_train_step --precision bf16); both: fp32 and bf16 alternated in
every round, then one row per model with each side's bf16 speed-up over its own fp32.
"""
import argparse
import gzip
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
_clock = time.process_time if os.environ.get("FATHOM_BENCH_CLOCK") == "cpu" else time.perf_counter  # as bench_util.h

import numpy as np
import torch
import torch.nn as nn


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                         nn.Linear(1024, 10))


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Dropout(0.25), nn.Linear(128, 10))


def torch_step_ms(which, steps, warmup, precision="fp32"):
    torch.manual_seed(0)
    is_mlp = which == "mlp"
    model = mlp() if is_mlp else cnn()
    opt = (torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if is_mlp
           else torch.optim.Adam(model.parameters(), lr=1e-3))
    B = 128 if is_mlp else 64
    x = torch.randn(B, 1, 28, 28)
    y = torch.arange(B) % 10
    lossf = nn.CrossEntropyLoss()
    total = 0.0
    for s in range(warmup + steps):
        t0 = _clock()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = lossf(model(x), y)
        loss.backward()
        opt.step()
        loss.item()
        dt = _clock() - t0
        if s >= warmup:
            total += dt
    return 1e3 * total / steps


def fathom_step_ms(build, which, steps, warmup, threads, precision="fp32"):
    out = subprocess.run([os.path.join(build, "bench_train_step"), which, "--steps", str(steps), "--warmup",
                          str(warmup), "--threads", str(threads), "--precision", precision], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["fathom"]


# ---- the whole fashion-cnn recipe in PyTorch (same model, optimizer, schedule, epochs, batch) ----
def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def torch_recipe(data_dir, epochs=3, batch=64, lr=0.002, wd=0.01, warmup=100, min_lr=2e-5, seed=1):
    torch.manual_seed(seed)
    t_start = time.perf_counter()
    xs = torch.from_numpy(read_idx(f"{data_dir}/train-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
    ys = torch.from_numpy(read_idx(f"{data_dir}/train-labels-idx1-ubyte.gz").astype(np.int64))
    xt = torch.from_numpy(read_idx(f"{data_dir}/t10k-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
    yt = torch.from_numpy(read_idx(f"{data_dir}/t10k-labels-idx1-ubyte.gz").astype(np.int64))
    xs = ((xs - 0.2860) / 0.3530).unsqueeze(1)
    xt = ((xt - 0.2860) / 0.3530).unsqueeze(1)
    model = cnn()
    decay = [p for p in model.parameters() if p.ndim > 1]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}], lr=lr)
    n = xs.shape[0]
    nb = (n + batch - 1) // batch
    total = nb * epochs

    def lr_at(step):
        if step < warmup:
            return lr * (step + 1) / warmup
        t = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * t))

    lossf = nn.CrossEntropyLoss()
    step = 0
    t0 = time.perf_counter()
    model.train()
    last = 0.0
    for _ in range(epochs):
        perm = torch.randperm(n)
        s = 0.0
        for b in range(nb):
            idx = perm[b * batch:(b + 1) * batch]
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            opt.zero_grad(set_to_none=True)
            loss = lossf(model(xs[idx]), ys[idx])
            loss.backward()
            opt.step()
            s += loss.item()
            step += 1
        last = s / nb
    train_s = time.perf_counter() - t0
    model.eval()
    correct = 0
    with torch.no_grad():
        for b in range(0, xt.shape[0], 1000):
            correct += (model(xt[b:b + 1000]).argmax(1) == yt[b:b + 1000]).sum().item()
    return {"wall_seconds": time.perf_counter() - t_start, "train_seconds": train_s,
            "test_accuracy": correct / xt.shape[0], "final_loss": last}


def fathom_recipe(build, threads):
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        out = subprocess.run([os.path.join(build, "fathom"), "train", "fashion-cnn", "--json", "--threads",
                              str(threads), "--out", d], check=True, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    r = json.loads(out.stdout)
    r["wall_seconds"] = wall
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", help="fathom build directory (holds fathom and bench_train_step)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--full", action="store_true", help="also run the whole fashion-cnn recipe in both")
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--precision", choices=["fp32", "bf16", "both"], default="fp32")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    peer = f"torch {torch.__version__.split('+')[0]}"
    precs = ["fp32", "bf16"] if a.precision == "both" else [a.precision]
    for which in ("mlp", "cnn"):
        fm = {p: [] for p in precs}
        pt = {p: [] for p in precs}
        for _ in range(a.rounds):
            for prec in precs:
                fm[prec].append(fathom_step_ms(a.build, which, a.steps, a.warmup, a.threads, prec))
                pt[prec].append(torch_step_ms(which, a.steps, a.warmup, prec))
        med = {}
        for prec in precs:
            f, p = statistics.median(fm[prec]), statistics.median(pt[prec])
            med[prec] = (f, p)
            print(json.dumps({"bench": f"{which}_train_step", "precision": prec, "metric": "ms", "fathom": round(f, 3),
                              "peer": peer, "peer_value": round(p, 3), "ratio": round(f / p, 3), "threads": a.threads,
                              "rounds_fathom": [round(x, 2) for x in fm[prec]],
                              "rounds_peer": [round(x, 2) for x in pt[prec]]}), flush=True)
        if len(precs) == 2:  # each side's bf16 speed-up over its own fp32 (> 1: bf16 faster)
            print(json.dumps({"bench": f"{which}_train_step", "metric": "bf16_speedup_over_fp32",
                              "fathom": round(med["fp32"][0] / med["bf16"][0], 3), "peer": peer,
                              "peer_value": round(med["fp32"][1] / med["bf16"][1], 3), "threads": a.threads}),
                  flush=True)
    if a.full:
        f = fathom_recipe(a.build, a.threads)
        p = torch_recipe(a.data)
        print(json.dumps({"bench": "cnn_recipe", "metric": "wall_seconds", "fathom": round(f["wall_seconds"], 2),
                          "peer": peer, "peer_value": round(p["wall_seconds"], 2),
                          "ratio": round(f["wall_seconds"] / p["wall_seconds"], 3), "threads": a.threads}), flush=True)
        print(json.dumps({"bench": "cnn_recipe", "metric": "test_accuracy", "fathom": f["test_accuracy"],
                          "peer": peer, "peer_value": p["test_accuracy"],
                          "diff_points": round(100 * (f["test_accuracy"] - p["test_accuracy"]), 2),
                          "threads": a.threads}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
