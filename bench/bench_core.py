#!/usr/bin/env python3
"""Runs bench_core (fathom) and the same work in PyTorch, same threads, one invocation.

usage: .venv/bin/python bench/bench_core.py BUILD_DIR/bench_core [all|matmul|elementwise]
Prints one JSON line per row and a table. Ratios: for GEMM, fathom GFLOP/s as a
fraction of OpenBLAS's own sgemm; for elementwise, PyTorch time / fathom time
(higher is better: fathom's throughput relative to PyTorch's)."""
import json, os, statistics, subprocess, sys, time

threads = int(os.environ.get("FATHOM_NUM_THREADS", os.cpu_count()))
import torch
torch.set_num_threads(threads)

def torch_elementwise(name, n, reps=25):
    a = torch.randn(n, requires_grad=True)
    b = torch.randn(n, requires_grad=True)
    g = torch.randn(n)
    tf, tb = [], []
    for r in range(reps + 2):
        t0 = time.perf_counter()
        if name == "add":
            y = a + b
        else:
            y = torch.nn.functional.gelu(a, approximate="tanh" if name == "gelu_tanh" else "none")
        t1 = time.perf_counter()
        y.backward(g)
        t2 = time.perf_counter()
        a.grad = None; b.grad = None
        if r >= 2:
            tf.append((t1 - t0) * 1e3); tb.append((t2 - t1) * 1e3)
    return statistics.median(tf), statistics.median(tb)

def main():
    exe = sys.argv[1]
    out = subprocess.run([exe] + sys.argv[2:3], capture_output=True, text=True, check=True,
                         env=dict(os.environ, FATHOM_NUM_THREADS=str(threads))).stdout
    rows = []
    for line in out.splitlines():
        r = json.loads(line)
        if r["bench"] in ("add", "gelu", "gelu_tanh"):
            pf, pb = torch_elementwise(r["bench"], r["n"])
            r.update(torch_fwd_ms=round(pf, 3), torch_bwd_ms=round(pb, 3),
                     fwd_ratio=round(pf / r["fathom_fwd_ms"], 2), bwd_ratio=round(pb / r["fathom_bwd_ms"], 2),
                     peer="torch " + torch.__version__)
        rows.append(r)
        print(json.dumps(r))
    print("\n%-22s %-28s %s" % ("bench", "fathom", "vs peer"))
    for r in rows:
        if r["bench"] == "matmul_f32":
            print("%-22s %-28s %.0f%% of OpenBLAS sgemm (%.1f GFLOP/s)" % ("matmul %s" % "x".join(map(str, r["shape"])),
                  "%.1f GFLOP/s" % r["fathom_gflops"], 100 * r["fraction_of_openblas"], r["openblas_gflops"]))
        else:
            print("%-22s fwd %.2f ms, bwd %.2f ms      fwd %.2fx, bwd %.2fx torch throughput" % (
                r["bench"], r["fathom_fwd_ms"], r["fathom_bwd_ms"], r["fwd_ratio"], r["bwd_ratio"]))

main()
