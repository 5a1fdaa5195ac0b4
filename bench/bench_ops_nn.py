#!/usr/bin/env python3
"""Side-by-side benchmark: fathom's softmax / norm / loss kernels vs PyTorch.

Runs the C benchmark (path as argv[1]) and the same ops in PyTorch in one
invocation, same shape, dtype and thread count, median of the same number of
timed repetitions after warm-up. Backward rows time PyTorch's aten backward
kernels directly (as the C side times fathom's backward kernels), except
rms_norm and cross_entropy, which PyTorch computes as a composite: there the
autograd backward of the op is timed.

ratio = torch_ms / fathom_ms  (throughput ratio; > 1 means fathom is faster)

The two sides alternate for --rounds rounds (fathom, torch, fathom, torch...)
and each keeps its best median, so a burst of load from other processes on a
shared machine does not land on one side only.

usage: bench_ops_nn.py BUILD/bench_ops_nn [--reps N] [--threads T] [--rows M] [--cols N]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
_clock = time.process_time if os.environ.get("FATHOM_BENCH_CLOCK") == "cpu" else time.perf_counter  # as bench_util.h

import torch
import torch.nn.functional as F


def median_ms(fn, reps, warmup=3):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = _clock()
        fn()
        ts.append((_clock() - t0) * 1e3)
    return statistics.median(ts)


def torch_benches(M, N, reps):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(M, N, generator=g)
    dy = torch.randn(M, N, generator=g)
    w = torch.randn(N, generator=g)
    b = torch.randn(N, generator=g)
    target = (torch.arange(M) * 7919) % N
    y_sm = torch.softmax(x, -1)
    y_lsm = torch.log_softmax(x, -1)
    _, mean, rstd = torch.native_layer_norm(x, [N], w, b, 1e-5)
    xr = x.clone().requires_grad_(True)
    wr = w.clone().requires_grad_(True)
    y_rms = F.rms_norm(xr, [N], wr, 1e-6)
    xc = x.clone().requires_grad_(True)
    loss = F.cross_entropy(xc, target)
    out = {}
    with torch.no_grad():
        out["softmax_fwd"] = median_ms(lambda: torch.softmax(x, -1), reps)
        out["softmax_bwd"] = median_ms(lambda: torch._softmax_backward_data(dy, y_sm, -1, torch.float32), reps)
        out["log_softmax_fwd"] = median_ms(lambda: torch.log_softmax(x, -1), reps)
        out["log_softmax_bwd"] = median_ms(lambda: torch._log_softmax_backward_data(dy, y_lsm, -1, torch.float32), reps)
        out["layer_norm_fwd"] = median_ms(lambda: F.layer_norm(x, [N], w, b, 1e-5), reps)
        out["layer_norm_bwd"] = median_ms(
            lambda: torch.ops.aten.native_layer_norm_backward(dy, x, [N], mean, rstd, w, b, [True, True, True]), reps)
        out["rms_norm_fwd"] = median_ms(lambda: F.rms_norm(x, [N], w, 1e-6), reps)
        out["cross_entropy_fwd"] = median_ms(lambda: F.cross_entropy(x, target), reps)
    out["rms_norm_bwd"] = median_ms(lambda: torch.autograd.grad(y_rms, [xr, wr], dy, retain_graph=True), reps)
    out["cross_entropy_bwd"] = median_ms(lambda: torch.autograd.grad(loss, [xc], retain_graph=True), reps)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cmd = [a.binary, "--reps", str(a.reps), "--threads", str(a.threads), "--rows", str(a.rows), "--cols", str(a.cols)]
    fathom, tb = {}, {}
    for _ in range(max(1, a.rounds)):
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            sys.stderr.write(res.stderr)
            sys.exit(f"bench_ops_nn.py: {a.binary} failed with status {res.returncode}")
        for line in res.stdout.splitlines():
            if line.startswith("{"):
                rec = json.loads(line)
                k = rec["bench"]
                fathom[k] = min(fathom.get(k, float("inf")), rec["fathom_ms"])
        for k, v in torch_benches(a.rows, a.cols, a.reps).items():
            tb[k] = min(tb.get(k, float("inf")), v)
    print(f"# [{a.rows}, {a.cols}] f32, {a.threads} threads, best of {a.rounds} rounds of median-of-{a.reps}; torch {torch.__version__}")
    print(f"# ratio = torch_ms / fathom_ms (throughput ratio, > 1: fathom faster)")
    print(f"{'bench':<20} {'fathom_ms':>10} {'torch_ms':>10} {'ratio':>7}")
    for name, fms in fathom.items():
        tms = tb.get(name)
        ratio = tms / fms if tms and fms > 0 else float("nan")
        print(f"{name:<20} {fms:>10.3f} {tms:>10.3f} {ratio:>7.2f}")
    for name, fms in fathom.items():
        tms = tb.get(name)
        print(json.dumps({"bench": name, "shape": [a.rows, a.cols], "metric": "ms", "fathom": fms,
                          "peer": f"torch {torch.__version__}", "peer_value": tms,
                          "throughput_ratio_peer_over_fathom": (tms / fms) if tms and fms > 0 else None,
                          "threads": a.threads}))


if __name__ == "__main__":
    main()
