#!/usr/bin/env python3
"""Runs bench_core (fathom) and the same work in PyTorch, same threads, one invocation.

usage: .venv/bin/python bench/bench_core.py BUILD_DIR/bench_core [all|matmul|elementwise] [--rounds N]
Prints one JSON line per row and a table. Ratios: for GEMM, fathom GFLOP/s as a
fraction of OpenBLAS's own sgemm; for elementwise, PyTorch time / fathom time
(higher is better: fathom's throughput relative to PyTorch's), each side's best
median over --rounds alternating rounds (default 2, as bench_ops_nn.py)."""
import argparse, json, os, statistics, subprocess, sys, time

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
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("only", nargs="?", default="all", choices=["all", "matmul", "elementwise"])
    ap.add_argument("--rounds", type=int, default=2,
                    help="elementwise rows: alternate fathom and torch this many times, keep each side's best median")
    a = ap.parse_args()
    env = dict(os.environ, FATHOM_NUM_THREADS=str(threads))
    rows, best = [], {}
    for rnd in range(max(1, a.rounds)):
        # matmul rows once; the elementwise rows alternate with torch so a burst of load from
        # other processes does not land on one side only
        only = a.only if rnd == 0 else "elementwise"
        if only == "matmul" and rnd > 0:
            break
        out = subprocess.run([a.binary, only], capture_output=True, text=True, check=True, env=env).stdout
        for line in out.splitlines():
            r = json.loads(line)
            if r["bench"] not in ("add", "gelu", "gelu_tanh"):
                rows.append(r)
                continue
            pf, pb = torch_elementwise(r["bench"], r["n"])
            k = r["bench"]
            if k not in best:
                best[k] = r
                rows.append(r)
                r.update(torch_fwd_ms=pf, torch_bwd_ms=pb, rounds=1)
            else:
                b0 = best[k]
                for f in ("fathom_fwd_ms", "fathom_bwd_ms", "fathom_fwd_min_ms", "fathom_bwd_min_ms"):
                    b0[f] = min(b0[f], r[f])
                b0["torch_fwd_ms"] = min(b0["torch_fwd_ms"], pf)
                b0["torch_bwd_ms"] = min(b0["torch_bwd_ms"], pb)
                b0["rounds"] += 1
    for r in rows:
        if r["bench"] in best:
            r.update(torch_fwd_ms=round(r["torch_fwd_ms"], 3), torch_bwd_ms=round(r["torch_bwd_ms"], 3),
                     fwd_ratio=round(r["torch_fwd_ms"] / r["fathom_fwd_ms"], 2),
                     bwd_ratio=round(r["torch_bwd_ms"] / r["fathom_bwd_ms"], 2), peer="torch " + torch.__version__)
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
