#!/usr/bin/env python3
"""Side-by-side benchmark of scaled-dot-product attention: fathom vs PyTorch.

    .venv/bin/python bench/bench_attention.py build/bench_attention [B H T D reps [rounds]]

Runs the fathom binary (FATHOM_NUM_THREADS=2), then the same shapes through
torch.nn.functional.scaled_dot_product_attention with torch.set_num_threads(2),
alternating the two for `rounds` rounds (default 3) and keeping each side's best
median, so a burst of load from other processes does not decide the ratio.
Prints one JSON line per row plus a table. ratio = torch_ms / fathom_ms, so
higher is better and > 1 means fathom is faster.

FATHOM_BENCH_DTYPE=bf16: fathom's bf16-product attention on f32 tensors (what bf16
training runs) against torch's SDPA on bf16 tensors (its CPU flash kernel in bf16).
"""
import json
import os
import subprocess
import sys
import time
_clock = time.process_time if os.environ.get("FATHOM_BENCH_CLOCK") == "cpu" else time.perf_counter  # as bench_util.h

import torch
import torch.nn.functional as F

THREADS = int(os.environ.get("FATHOM_NUM_THREADS", "2"))  # 2 unless set


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def torch_ms(kind, causal, B, H, T, D, reps):
    g = torch.Generator().manual_seed(1)
    dt = torch.bfloat16 if os.environ.get("FATHOM_BENCH_DTYPE") == "bf16" else torch.float32
    q, k, v, dO = [torch.randn(B, H, T, D, generator=g).to(dt) for _ in range(4)]
    times = []
    if kind == "sdpa_fwd":
        with torch.no_grad():
            for i in range(reps + 1):
                t0 = _clock()
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                if i:
                    times.append((_clock() - t0) * 1e3)
    else:
        for t in (q, k, v):
            t.requires_grad_(True)
        for i in range(reps + 1):
            o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            t0 = _clock()
            torch.autograd.grad(o, (q, k, v), dO)
            if i:
                times.append((_clock() - t0) * 1e3)
    return median(times)


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    args = (sys.argv[2:7] + ["8", "8", "512", "64", "7"][len(sys.argv[2:7]):])
    rounds = int(sys.argv[7]) if len(sys.argv) > 7 else 3
    reps = int(args[4])
    env = dict(os.environ, FATHOM_NUM_THREADS=str(THREADS))
    torch.set_num_threads(THREADS)
    rows = {}
    for _ in range(rounds):
        res = subprocess.run([sys.argv[1]] + args, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            sys.stderr.write(res.stderr)
            sys.exit("bench_attention.py: %s failed with exit code %d" % (sys.argv[1], res.returncode))
        for line in res.stdout.splitlines():
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            key = (r["bench"], r["causal"])
            peer = torch_ms(r["bench"], r["causal"], r["B"], r["H"], r["T"], r["D"], reps)
            if key in rows:
                rows[key]["fathom"] = min(rows[key]["fathom"], r["fathom"])
                rows[key]["peer_value"] = min(rows[key]["peer_value"], peer)
            else:
                r["peer"] = "torch " + torch.__version__
                r["peer_value"] = peer
                rows[key] = r
    rows = list(rows.values())
    for r in rows:
        r["peer_value"] = round(r["peer_value"], 3)
        r["ratio"] = round(r["peer_value"] / r["fathom"], 3)
        r["ratio_is"] = "torch_ms/fathom_ms (higher is better)"
        r["rounds"] = rounds
        print(json.dumps(r))
    print()
    print("| bench | causal | shape (B,H,T,D) | threads | fathom ms | torch ms | ratio torch/fathom |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %s | %s | %d,%d,%d,%d | %d | %.2f | %.2f | %.2fx |" % (
            r["bench"], "yes" if r["causal"] else "no", r["B"], r["H"], r["T"], r["D"], r["threads"],
            r["fathom"], r["peer_value"], r["ratio"]))


if __name__ == "__main__":
    main()
