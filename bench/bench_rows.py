#!/usr/bin/env python3
"""Repeats the side-by-side benches (fathom vs PyTorch, 2 threads each) in rotation and
summarizes every row as median [min, max] over the repeats.

    .venv/bin/python bench/bench_rows.py BUILD_DIR --repeat 5 --out runs.jsonl [--suites gemm,elementwise,...]
    .venv/bin/python bench/bench_rows.py --summarize runs.jsonl

Each repeat runs every suite once, in an order rotated by one per repeat, so that a
burst of load from other processes does not always land on the same suite; each suite
alternates fathom and PyTorch inside itself (see its own script). Every suite run is
appended to --out as one JSON line (suite, repeat, UTC start, load average before and
after, the free-core check before and after, wall seconds, the suite's JSON rows), so a summary can be recomputed and the raw
runs kept. The summary gives, per row, the ratio in the suite's own orientation
(said per row: "torch/fathom" and "fathom/torch" for throughputs, so > 1 is fathom
faster; "fathom/torch ms" for times, so < 1 is fathom faster), the median of each side and
every run's ratio.

--threads N (default 2) sets FATHOM_NUM_THREADS and each script's thread count, on
both sides. With FATHOM_BENCH_CLOCK=cpu in the environment every side times in
process CPU time instead of the wall clock (bench_util.h and the scripts read it):
with --threads 1 that is the time the work ran, whatever else holds the machine.

Suites (the commands docs/PERFORMANCE.md quotes; B = BUILD_DIR, T = --threads):
  gemm         bench_core.py B/bench_core matmul --rounds 1 --no-bf16-peer
  elementwise  bench_core.py B/bench_core elementwise --rounds 2
  ops_nn       bench_ops_nn.py B/bench_ops_nn --reps 15 --rounds 2 --threads T
  attention    bench_attention.py B/bench_attention 8 8 512 64 5 2
  train        bench_train.py B --steps 10 --rounds 2 --threads T
  gpt          bench_gpt.py --fathom B/fathom --steps 30 --configs kjv-gpt --no-compile --gen-tokens 20
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def suites(b, t):
    py = sys.executable
    t = str(t)
    return {
        "gemm": [py, f"{HERE}/bench_core.py", f"{b}/bench_core", "matmul", "--rounds", "1", "--no-bf16-peer"],
        "elementwise": [py, f"{HERE}/bench_core.py", f"{b}/bench_core", "elementwise", "--rounds", "2"],
        "ops_nn": [py, f"{HERE}/bench_ops_nn.py", f"{b}/bench_ops_nn", "--reps", "15", "--rounds", "2", "--threads", t],
        "attention": [py, f"{HERE}/bench_attention.py", f"{b}/bench_attention", "8", "8", "512", "64", "5", "2"],
        "train": [py, f"{HERE}/bench_train.py", b, "--steps", "10", "--rounds", "2", "--threads", t],
        "gpt": [py, f"{HERE}/bench_gpt.py", "--fathom", f"{b}/fathom", "--steps", "30", "--configs", "kjv-gpt",
                "--no-compile", "--gen-tokens", "20"],
    }


def _spin(q, secs):
    t0, c0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < secs:
        pass
    q.put((time.process_time() - c0) / (time.perf_counter() - t0))


def free_cores(secs=0.4):
    """the smaller share of a core that each of two spinning processes got over secs (1.0: both cores free)"""
    import multiprocessing as mp
    q = mp.Queue()
    ps = [mp.Process(target=_spin, args=(q, secs)) for _ in range(2)]
    for p in ps:
        p.start()
    got = [q.get() for _ in ps]
    for p in ps:
        p.join()
    return round(min(got), 2)


def loadavg():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def ratios(suite, rows):
    """(row name, orientation, fathom value, torch value, ratio) for each row of one suite run"""
    out = []
    for r in rows:
        b = r.get("bench")
        if suite == "gemm" and b == "matmul_f32":
            out.append(("matmul f32 %s GFLOP/s" % "x".join(map(str, r["shape"])), "fathom/torch",
                        r["fathom_gflops_best"], r["torch_gflops_best"], r["vs_torch"]))
            out.append(("matmul f32 %s vs numpy OpenBLAS" % "x".join(map(str, r["shape"])), "fathom/numpy",
                        r["fathom_gflops_best"], r["numpy_openblas_gflops_best"], r["vs_numpy_openblas"]))
        elif suite == "gemm" and b == "matmul_bf16":
            out.append(("matmul bf16 %s GFLOP/s (vs own f32)" % "x".join(map(str, r["shape"])), "bf16/f32",
                        r["fathom_bf16_gflops_best"], r["fathom_f32_gflops_best"], r["bf16_over_own_f32"]))
        elif suite == "elementwise":
            for d in ("fwd", "bwd"):
                out.append(("%s %s ms" % (b, d), "torch/fathom", r["fathom_%s_ms" % d], r["torch_%s_ms" % d],
                            r["%s_ratio" % d]))
        elif suite == "ops_nn":
            out.append(("%s ms" % b, "torch/fathom", r["fathom"], r["peer_value"], r["throughput_ratio_peer_over_fathom"]))
        elif suite == "attention":
            out.append(("%s%s ms" % (b, " causal" if r["causal"] else ""), "torch/fathom", r["fathom"],
                        r["peer_value"], r["ratio"]))
        elif suite == "train":
            out.append(("%s ms" % b, "fathom/torch ms", r["fathom"], r["peer_value"], r["ratio"]))
        elif suite == "gpt" and b == "gpt_train":
            out.append(("kjv-gpt train tokens/s (best window)", "fathom/torch", r["fathom"], r["peer_value"], r["ratio"]))
            out.append(("kjv-gpt train tokens/s (mean)", "fathom/torch", r["mean_fathom"], r["mean_peer"],
                        r["mean_ratio"]))
        elif suite == "gpt" and b == "gpt_convergence":
            out.append(("kjv-gpt val loss after %d steps" % r["steps"], "fathom-torch", r["fathom_val_loss"],
                        r["torch_val_loss"], r["diff"]))
    return out


def summarize(path, quiet_only=False):
    runs = [json.loads(l) for l in open(path) if l.strip()]
    table, order = {}, []
    for run in runs:
        if run.get("rc", 0) != 0:
            continue
        for name, orient, f, p, q in ratios(run["suite"], run["rows"]):
            if name not in table:
                table[name] = dict(orient=orient, f=[], p=[], q=[])
                order.append(name)
            t = table[name]
            t["f"].append(f); t["p"].append(p); t["q"].append(q)
    if quiet_only:
        runs = [r for r in runs if min(r.get("free_before", 0), r.get("free_after", 0)) >= 0.9]
        if not runs:
            print("no run had both cores free before and after")
            return
    loads = [x for run in runs for x in (run["load_before"], run["load_after"])]
    when = sorted(run["utc"] for run in runs)
    kinds = sorted({"%s threads, %s clock" % (r.get("threads", 2), r.get("clock", "wall")) for r in runs})
    print("%d suite runs, %s .. %s UTC, load average %.1f-%.1f, %s" % (len(runs), when[0], when[-1], min(loads),
                                                                       max(loads), "; ".join(kinds)))
    failed = [r["suite"] for r in runs if r.get("rc", 0) != 0]
    if failed:
        print("failed runs (left out):", failed)
    print("| row | n | fathom (median) | torch (median) | ratio | median [min, max] | runs |")
    print("|---|---|---|---|---|---|---|")
    for name in order:
        t = table[name]
        g = lambda v: "%.4g" % statistics.median(v)
        print("| %s | %d | %s | %s | %s | %.2f [%.2f, %.2f] | %s |" % (
            name, len(t["q"]), g(t["f"]), g(t["p"]), t["orient"], statistics.median(t["q"]), min(t["q"]),
            max(t["q"]), " ".join("%.2f" % x for x in t["q"])))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", nargs="?")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="threads of each side (default 2)")
    ap.add_argument("--suites", default="gemm,elementwise,ops_nn,attention,train,gpt")
    ap.add_argument("--out", default="bench_rows.jsonl")
    ap.add_argument("--summarize", metavar="JSONL")
    ap.add_argument("--quiet-only", action="store_true",
                    help="--summarize only the runs whose free-core check gave >= 0.9 before and after")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                    help="before each suite, wait up to SECONDS for two spinning processes to both get >= 90%% of a "
                         "core (checked every 5 s); the run records what it got either way")
    a = ap.parse_args()
    if a.summarize:
        return summarize(a.summarize, a.quiet_only)
    if not a.build:
        ap.error("BUILD_DIR is required (or --summarize JSONL)")
    cmds = suites(os.path.abspath(a.build), a.threads)
    clock = "cpu" if os.environ.get("FATHOM_BENCH_CLOCK") == "cpu" else "wall"
    names = a.suites.split(",")
    for n in names:
        if n not in cmds:
            ap.error("unknown suite %r (the suites: %s)" % (n, ",".join(cmds)))
    if clock == "cpu" and "gpt" in names:
        ap.error("FATHOM_BENCH_CLOCK=cpu: the gpt suite times fathom's training by its wall-clock log lines; "
                 "leave it out (--suites)")
    if clock == "cpu" and a.threads != 1:
        print("note: FATHOM_BENCH_CLOCK=cpu with %d threads sums the threads' CPU time" % a.threads, file=sys.stderr)
    env = dict(os.environ, FATHOM_NUM_THREADS=str(a.threads))
    for rep in range(a.repeat):
        k = rep % len(names)
        for n in names[k:] + names[:k]:
            w0 = time.time()
            fc = free_cores()
            while fc < 0.9 and time.time() - w0 < a.wait_quiet:
                time.sleep(5)
                fc = free_cores()
            l0, t0 = loadavg(), time.time()
            utc = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
            res = subprocess.run(cmds[n], capture_output=True, text=True, env=env)
            rows = []
            for line in res.stdout.splitlines():
                if line.startswith("{"):
                    rows.append(json.loads(line))
            rec = dict(suite=n, repeat=rep, utc=utc, threads=a.threads, clock=clock, load_before=l0, load_after=loadavg(), free_before=fc,
                       free_after=free_cores(),
                       wall_s=round(time.time() - t0, 1), rc=res.returncode, rows=rows)
            if res.returncode:
                rec["stderr"] = res.stderr[-2000:]
            with open(a.out, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print("%s repeat %d: rc %d, %.0f s, load %.1f -> %.1f, free cores %.2f -> %.2f" % (
                n, rep, res.returncode, rec["wall_s"], l0, rec["load_after"], fc, rec["free_after"]), flush=True)
    summarize(a.out)


if __name__ == "__main__":
    sys.exit(main())
