#!/usr/bin/env python3
"""The f32 GEMM providers side by side with PyTorch's torch.mm (MKL), same threads, one invocation.

    python3 bench/bench_gemm_providers.py build/bench_gemm_providers [--threads 2] [--reps 9] [--rounds 2] [--only-fathom]

Each round runs bench_gemm_providers (fathom's fm_matmul, OpenBLAS's own threads, oneDNN f32 and
BLIS, see the .c file) and then torch.mm on the same shapes; the table gives each provider's best
round in GFLOP/s and its ratio to torch.mm (> 1: faster than PyTorch), with every round listed.
With FATHOM_BENCH_CLOCK=cpu both sides are timed in process CPU time (use --threads 1 then).
"""
import argparse, json, os, subprocess, sys, time

p = argparse.ArgumentParser()
p.add_argument("binary")
p.add_argument("--threads", type=int, default=2)
p.add_argument("--reps", type=int, default=9)
p.add_argument("--rounds", type=int, default=2)
p.add_argument("--only-fathom", action="store_true",
               help="time fathom alone in its process (no other library's threads spinning from the shape before)")
args = p.parse_args()
cpu_clock = os.environ.get("FATHOM_BENCH_CLOCK") == "cpu"
clock = time.process_time if cpu_clock else time.perf_counter

try:
    import torch
except ImportError:
    sys.exit("bench_gemm_providers.py: PyTorch is not installed (python3 -m pip install torch): no peer to compare with")
torch.set_num_threads(args.threads)


def torch_gflops(m, n, k):
    a, b = torch.randn(m, k), torch.randn(k, n)
    torch.mm(a, b)
    ts = []
    for _ in range(args.reps):
        t0 = clock()
        torch.mm(a, b)
        ts.append(clock() - t0)
    ts.sort()
    return 2.0 * m * n * k / ts[len(ts) // 2] / 1e9


env = dict(os.environ, FATHOM_NUM_THREADS=str(args.threads))
rounds = {}  # (provider, shape) -> [gflops...]
kernels = {}
for r in range(args.rounds):
    time.sleep(0.5)  # the previous round's torch threads spin for up to 200 ms after their last call
    out = subprocess.run([args.binary, str(args.reps)] + (["fathom"] if args.only_fathom else []), env=env, capture_output=True, text=True, check=True).stdout
    shapes = []
    for line in out.splitlines():
        d = json.loads(line)
        key = (d["provider"], tuple(d["shape"]))
        rounds.setdefault(key, []).append(d["gflops"])
        kernels[key] = d["kernel"]
        if tuple(d["shape"]) not in shapes:
            shapes.append(tuple(d["shape"]))
    for s in shapes:
        rounds.setdefault(("torch.mm", s), []).append(round(torch_gflops(*s), 1))
torch_kernel = "torch %s, MKL" % torch.__version__

import platform
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
print(f"CPU: {cpu}; {args.threads} threads; {'process CPU time' if cpu_clock else 'wall clock'}; best of {args.rounds} rounds "
      f"(median of {args.reps} repetitions each)")
print("| shape (MxNxK) | provider (kernel) | GFLOP/s best [rounds] | vs torch.mm |")
print("|---|---|---|---|")
shapes = []
for (prov, s) in rounds:
    if s not in shapes:
        shapes.append(s)
for s in shapes:
    t = max(rounds[("torch.mm", s)])
    for prov in ["fathom", "openblas_threads", "onednn", "blis", "torch.mm"]:
        if (prov, s) not in rounds:
            continue
        v = rounds[(prov, s)]
        print(f"| {s[0]}x{s[1]}x{s[2]} | {prov} ({kernels.get((prov, s), torch_kernel)}) | {max(v):.1f} {v} | {max(v) / t:.2f}x |")
