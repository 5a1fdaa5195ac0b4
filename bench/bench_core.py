#!/usr/bin/env python3
"""Runs bench_core (fathom) and the same work in PyTorch, same threads, one invocation.

usage: .venv/bin/python bench/bench_core.py BUILD_DIR/bench_core [all|matmul|elementwise] [--rounds N] [--no-bf16-peer]
Prints one JSON line per row and a table. Ratios: for GEMM, fathom GFLOP/s against
independent ceilings measured in the same run: PyTorch's torch.mm and numpy's
bundled (current) OpenBLAS, each with the same threads; the OpenBLAS fathom itself
calls (bench_core's own reference) is reported too, with the kernels it runs. For
elementwise, PyTorch time / fathom time (higher is better: fathom's throughput
relative to PyTorch's). Each side's best median over --rounds alternating rounds
(default 2, as bench_ops_nn.py); the GEMM rows also list every round's GFLOP/s, so
the noise of a shared machine shows."""
import argparse, ctypes, json, os, statistics, subprocess, sys, time
_clock = time.process_time if os.environ.get("FATHOM_BENCH_CLOCK") == "cpu" else time.perf_counter  # as bench_util.h

threads = int(os.environ.get("FATHOM_NUM_THREADS", os.cpu_count()))
import numpy as np
import torch
torch.set_num_threads(threads)


def numpy_openblas():
    """numpy's bundled OpenBLAS (scipy-openblas), set to `threads`: (core, config) or None."""
    np.ones((2, 2), np.float32) @ np.ones((2, 2), np.float32)  # loads it
    path = None
    with open("/proc/self/maps") as f:
        for line in f:
            if "openblas" in line and line.rstrip().endswith(".so"):
                path = line.split()[-1]
                break
    if not path:
        return None
    lib = ctypes.CDLL(path)
    for prefix, suffix in (("scipy_openblas_", "64_"), ("openblas_", "")):
        try:
            corename = getattr(lib, prefix + "get_corename" + suffix)
            config = getattr(lib, prefix + "get_config" + suffix)
            getattr(lib, prefix + "set_num_threads" + suffix)(threads)
        except AttributeError:
            continue
        corename.restype = config.restype = ctypes.c_char_p
        return corename().decode(), config().decode()
    return None


def time_gemm(mm, M, N, K, reps):
    """median ms of mm() over reps after one warm-up"""
    mm()
    t = []
    for _ in range(reps):
        t0 = _clock()
        mm()
        t.append((_clock() - t0) * 1e3)
    return statistics.median(t)


def peer_gemm(M, N, K, reps):
    """GFLOP/s of torch.mm and numpy.matmul (f32, into a preallocated output)"""
    ta, tb, tc = torch.randn(M, K), torch.randn(K, N), torch.empty(M, N)
    na, nb, nc = ta.numpy(), tb.numpy(), np.empty((M, N), np.float32)
    flop = 2.0 * M * N * K
    t_torch = time_gemm(lambda: torch.mm(ta, tb, out=tc), M, N, K, reps)
    t_numpy = time_gemm(lambda: np.matmul(na, nb, out=nc), M, N, K, reps)
    return flop / t_torch / 1e6, flop / t_numpy / 1e6

def peer_gemm_bf16(M, N, K, reps):
    """GFLOP/s of torch.mm in bf16 (oneDNN inside PyTorch) and in f32"""
    ta, tb = torch.randn(M, K).bfloat16(), torch.randn(K, N).bfloat16()
    tc = torch.empty(M, N, dtype=torch.bfloat16)
    flop = 2.0 * M * N * K
    return flop / time_gemm(lambda: torch.mm(ta, tb, out=tc), M, N, K, reps) / 1e6

def torch_elementwise(name, n, reps=25):
    a = torch.randn(n, requires_grad=True)
    b = torch.randn(n, requires_grad=True)
    g = torch.randn(n)
    tf, tb = [], []
    for r in range(reps + 2):
        t0 = _clock()
        if name == "add":
            y = a + b
        else:
            y = torch.nn.functional.gelu(a, approximate="tanh" if name == "gelu_tanh" else "none")
        t1 = _clock()
        y.backward(g)
        t2 = _clock()
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
    ap.add_argument("--no-bf16-peer", action="store_true",
                    help="skip torch.mm in bf16 (on a CPU without bf16 hardware it runs at well under 1 GFLOP/s, "
                         "minutes per row); the bf16 rows then compare fathom's bf16 with its own f32 only")
    a = ap.parse_args()
    env = dict(os.environ, FATHOM_NUM_THREADS=str(threads))
    rows, best, gemm = [], {}, {}
    npblas = numpy_openblas()
    info = json.loads(subprocess.run([os.path.join(os.path.dirname(a.binary), "fathom"), "info", "--json"],
                                     capture_output=True, text=True, env=env).stdout or "{}")
    cpu = info.get("cpu", {})
    for rnd in range(max(1, a.rounds)):
        # every round alternates fathom and its peers, so a burst of load from other
        # processes does not land on one side only
        out = subprocess.run([a.binary, a.only], capture_output=True, text=True, check=True, env=env).stdout
        for line in out.splitlines():
            r = json.loads(line)
            if r["bench"] == "matmul_f32":
                M, N, K = r["shape"]
                tg, ng = peer_gemm(M, N, K, 7 if M * N * K > 2 ** 31 else 15)
                g = gemm.setdefault((M, N, K), dict(r, rounds=[]))
                g["rounds"].append({"fathom": r["fathom_gflops"], "fathom_openblas": r["openblas_gflops"],
                                    "torch": round(tg, 1), "numpy_openblas": round(ng, 1)})
                if len(g["rounds"]) == 1:
                    rows.append(g)
                continue
            if r["bench"] == "matmul_bf16":
                M, N, K = r["shape"]
                tb16 = None if a.no_bf16_peer else peer_gemm_bf16(M, N, K, 5 if M * N * K > 2 ** 31 else 15)
                key = ("bf16", M, N, K)
                if key not in gemm:
                    gemm[key] = dict(r, rounds=[])
                    rows.append(gemm[key])
                gemm[key]["rounds"].append({"fathom_bf16": r["fathom_bf16_gflops"], "fathom_f32": r["fathom_f32_gflops"],
                                            "torch_bf16": None if tb16 is None else round(tb16, 1)})
                continue
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
        if r["bench"] == "matmul_f32":
            rs = r["rounds"]
            for side in ("fathom", "fathom_openblas", "torch", "numpy_openblas"):
                r[side + "_gflops_best"] = max(x[side] for x in rs)
            r.update(vs_torch=round(r["fathom_gflops_best"] / r["torch_gflops_best"], 2),
                     vs_numpy_openblas=round(r["fathom_gflops_best"] / r["numpy_openblas_gflops_best"], 2),
                     cpu=cpu.get("model", "?"), isa=cpu.get("isa", "?"),
                     fathom_gemm=info.get("gemm", {}).get("core", "?"),
                     numpy_openblas_core=npblas[0] if npblas else "?", peer="torch " + torch.__version__)
            for k in ("fathom_ms", "openblas_ms", "fathom_gflops", "openblas_gflops", "fraction_of_openblas"):
                r.pop(k, None)
        if r["bench"] == "matmul_bf16":
            rs = r["rounds"]
            for side in ("fathom_bf16", "fathom_f32"):
                r[side + "_gflops_best"] = max(x[side] for x in rs)
            tb = [x["torch_bf16"] for x in rs if x["torch_bf16"] is not None]
            r["torch_bf16_gflops_best"] = max(tb) if tb else None
            r.update(vs_torch_bf16=round(r["fathom_bf16_gflops_best"] / max(tb), 2) if tb else None,
                     bf16_over_own_f32=round(r["fathom_bf16_gflops_best"] / r["fathom_f32_gflops_best"], 2),
                     cpu=cpu.get("model", "?"), isa=cpu.get("isa", "?"),
                     fathom_bf16=("fathom's AMX tiles" if info.get("gemm", {}).get("bf16", {}).get("amx_tiles")
                                  else info.get("gemm", {}).get("bf16", {}).get("kernel", "?") or "widened to f32"),
                     peer="torch " + torch.__version__)
            for k in ("fathom_bf16_gflops", "fathom_f32_gflops", "bf16_over_f32"):
                r.pop(k, None)
        if r["bench"] in best:
            r.update(torch_fwd_ms=round(r["torch_fwd_ms"], 3), torch_bwd_ms=round(r["torch_bwd_ms"], 3),
                     fwd_ratio=round(r["torch_fwd_ms"] / r["fathom_fwd_ms"], 2),
                     bwd_ratio=round(r["torch_bwd_ms"] / r["fathom_bwd_ms"], 2), peer="torch " + torch.__version__)
        print(json.dumps(r))
    print("\nCPU %s, fathom kernels at %s, fathom's OpenBLAS core %s, numpy's OpenBLAS %s, %d threads" % (
          cpu.get("model", "?"), cpu.get("isa", "?"), info.get("gemm", {}).get("core", "?"),
          "%s (%s)" % npblas if npblas else "?", threads))
    print("%-22s %-28s %s" % ("bench", "fathom", "vs peer"))
    for r in rows:
        if r["bench"] == "matmul_f32":
            print("%-22s %-28s %.2fx torch.mm (%.1f), %.2fx numpy's OpenBLAS %s (%.1f); own OpenBLAS %s %.1f" % (
                  "matmul %s" % "x".join(map(str, r["shape"])), "%.1f GFLOP/s" % r["fathom_gflops_best"],
                  r["vs_torch"], r["torch_gflops_best"], r["vs_numpy_openblas"], r["numpy_openblas_core"],
                  r["numpy_openblas_gflops_best"], r["fathom_gemm"], r["fathom_openblas_gflops_best"]))
            print("%-22s rounds (fathom/torch/numpy GFLOP/s): %s" % ("", "  ".join(
                  "%.0f/%.0f/%.0f" % (x["fathom"], x["torch"], x["numpy_openblas"]) for x in r["rounds"])))
        elif r["bench"] == "matmul_bf16":
            vs = ("%.2fx torch.mm bf16 (%.1f)" % (r["vs_torch_bf16"], r["torch_bf16_gflops_best"])
                  if r["vs_torch_bf16"] is not None else "torch.mm bf16 not run")
            print("%-22s %-28s %s; %.2fx fathom's own f32 (%.1f); %s" % (
                  "matmul bf16 %s" % "x".join(map(str, r["shape"])), "%.1f GFLOP/s" % r["fathom_bf16_gflops_best"],
                  vs, r["bf16_over_own_f32"], r["fathom_f32_gflops_best"], r["fathom_bf16"]))
        else:
            print("%-22s fwd %.2f ms, bwd %.2f ms      fwd %.2fx, bwd %.2fx torch throughput" % (
                r["bench"], r["fathom_fwd_ms"], r["fathom_bwd_ms"], r["fwd_ratio"], r["bwd_ratio"]))

main()
