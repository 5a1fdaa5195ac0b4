#!/usr/bin/env python3
"""Where a GPT training step's time goes, fathom vs PyTorch eager, op by op and GEMM by GEMM.

Runs `fathom train` on a bench config with --profile (fathom's op spans) and the same model in
PyTorch eager under torch.profiler (bench_gpt.py's model, fathom's windows and initial weights do
not matter for time, so PyTorch starts from its own). Both use 2 threads. Prints, per step:
  - time by op family (matmul, attention, norms, GELU, elementwise, reductions, copies, loss,
    optimizer, the rest: dispatch, allocation, autograd bookkeeping),
  - every GEMM shape (M x N x K with its count per step), with each side's ms and GFLOP/s,
  - the step time both ways.
The first `--skip` steps of each side are left out (allocator warm-up, torch's lazy init).

  .venv/bin/python bench/profile_gpt.py --fathom build/fathom [--config kjv-gpt] [--steps 20]
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_gpt as bg  # noqa: E402  (the bench's model, configs and recipe writer)

FAMILY = [  # (family, fathom op names, torch op names)
    ("matmul", {"matmul"}, {"aten::addmm", "aten::mm", "aten::bmm", "aten::matmul", "aten::linear"}),
    ("attention", {"scaled_dot_product_attention", "sdpa_backward"},
     {"aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}),
    ("layer norm (+ residual add)", {"layer_norm", "layer_norm_backward", "add_layer_norm", "add_layer_norm_backward"},
     {"aten::native_layer_norm", "aten::native_layer_norm_backward"}),
    ("GELU (+ bias)", {"gelu_tanh", "bias_gelu_tanh", "bias_gelu_tanh_backward", "unary_backward"},
     {"aten::gelu", "aten::gelu_backward"}),
    ("elementwise add/mul", {"add", "mul", "sub", "div"}, {"aten::add", "aten::add_", "aten::mul", "aten::mul_", "aten::div"}),
    ("reductions (bias grads)", {"sum"}, {"aten::sum"}),
    ("copies / head split+merge", {"copy", "qkv_split_heads", "qkv_split_heads_backward"},
     {"aten::copy_", "aten::clone", "aten::contiguous", "aten::_reshape_alias", "aten::cat", "aten::stack"}),
    ("embedding", {"embedding", "embedding_backward"}, {"aten::embedding", "aten::embedding_backward",
                                                       "aten::embedding_dense_backward"}),
    ("cross-entropy", {"cross_entropy", "cross_entropy_backward"},
     {"aten::_log_softmax", "aten::_log_softmax_backward_data", "aten::nll_loss_forward", "aten::nll_loss_backward"}),
]


def fathom_profile(fathom, c, steps, skip, d):
    recipe = bg.write_recipe(d, "prof", c, steps)
    trace = os.path.join(d, "t.json")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="2", FATHOM_NUM_THREADS="2")
    r = subprocess.run([fathom, "train", recipe, "--out", os.path.join(d, "run"), "--steps", str(steps), "--quiet",
                        "--profile", trace], capture_output=True, text=True, env=env)
    if r.returncode:
        raise RuntimeError(r.stderr[-2000:])
    ev = json.load(open(trace))
    ev = ev["traceEvents"] if isinstance(ev, dict) else ev
    spans = [e for e in ev if e.get("ph") == "X"]
    step_spans = sorted((e for e in spans if e.get("cat") == "step"), key=lambda e: e["ts"])[skip:]
    lo, hi = step_spans[0]["ts"], step_spans[-1]["ts"] + step_spans[-1]["dur"]
    n = len(step_spans)
    step_ms = sum(e["dur"] for e in step_spans) / n / 1e3
    by_op, gemm = collections.Counter(), collections.defaultdict(lambda: [0, 0.0, 0.0])
    opt = [(e["ts"], e["ts"] + e["dur"]) for e in spans if e.get("cat") == "optimizer" and lo <= e["ts"] < hi]
    opt_ms = sum(b - a for a, b in opt) / 1e3
    for e in spans:
        if not (lo <= e["ts"] < hi) or e.get("cat") not in ("forward", "backward"):
            continue
        if any(a <= e["ts"] < b for a, b in opt):
            continue  # counted as the optimizer's wall time
        by_op[e["name"]] += e["dur"] / 1e3
        if e["name"] == "matmul":
            a = e.get("args", {})
            out = [int(x) for x in a.get("out", "[]").strip("[]").split(",") if x.strip()]
            M, N = (out[-2], out[-1]) if len(out) >= 2 else (1, out[-1])
            K = round(a.get("flops", 0) / (2 * M * N)) if M * N else 0
            g = gemm[(M, N, K)]
            g[0] += 1
            g[1] += e["dur"] / 1e3
            g[2] += a.get("flops", 0)
    by_op["(optimizer)"] = opt_ms
    return step_ms, {k: v / n for k, v in by_op.items()}, {k: (v[0] / n, v[1] / n, v[2] / n) for k, v in gemm.items()}


def torch_profile(c, V, steps, skip):
    torch.manual_seed(0)
    model = bg.GPT(c, V)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    B, T = c["batch"], c["block"]
    g = torch.Generator().manual_seed(0)
    rf = torch.profiler.record_function

    def step():
        x = torch.randint(0, V, (B, T), generator=g)
        y = torch.randint(0, V, (B, T), generator=g)
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        with rf("optimizer"):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

    for _ in range(skip):
        step()
    n = steps - skip
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    step_ms = (time.perf_counter() - t0) / n * 1e3  # unprofiled
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(n):
            step()
    evs = list(prof.events())
    opt_ranges = [(e.time_range.start, e.time_range.end) for e in evs if e.name == "optimizer"]
    opt_ms = sum(b - a for a, b in opt_ranges) / 1e3
    by_op, gemm = collections.Counter(), collections.defaultdict(lambda: [0, 0.0, 0.0])
    for e in evs:
        if e.name == "optimizer" or any(a <= e.time_range.start < b for a, b in opt_ranges):
            continue  # counted as the optimizer's wall time
        ms = e.self_cpu_time_total / 1e3
        by_op[e.name] += ms
        if e.name in ("aten::addmm", "aten::mm"):
            sh = [s for s in (e.input_shapes or []) if s]
            if len(sh) >= 2 and len(sh[-2]) == 2 and len(sh[-1]) == 2:
                M, K, N = sh[-2][0], sh[-2][1], sh[-1][1]
                gg = gemm[(M, N, K)]
                gg[0] += 1
                gg[1] += ms
                gg[2] += 2.0 * M * N * K
    return step_ms, {k: v / n for k, v in by_op.items()}, {k: (v[0] / n, v[1] / n, v[2] / n) for k, v in gemm.items()}, opt_ms / n


def family_table(f_ops, t_ops):
    rows = []
    f_left, t_left = dict(f_ops), dict(t_ops)
    for fam, fn, tn in FAMILY:
        rows.append((fam, sum(f_left.pop(k, 0) for k in fn), sum(t_left.pop(k, 0) for k in tn)))
    return rows, f_left, t_left


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fathom", default=os.path.join(bg.ROOT, "build", "fathom"))
    ap.add_argument("--config", default="kjv-gpt", choices=sorted(bg.CONFIGS))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--skip", type=int, default=3)
    a = ap.parse_args()
    c = bg.CONFIGS[a.config]
    with tempfile.TemporaryDirectory() as d:
        f_step, f_ops, f_gemm = fathom_profile(a.fathom, c, a.steps, a.skip, d)
        ids, V = bg.load_tokens(os.path.join(d, "run", "tokens.bin"))
    t_step, t_ops, t_gemm, t_opt = torch_profile(c, V, a.steps, a.skip)
    print(f"config {a.config}: {c}, vocab {V}, 2 threads, {a.steps - a.skip} steps averaged; load {os.getloadavg()[0]:.1f}")
    print(f"step time: fathom {f_step:.1f} ms (profiled), torch eager {t_step:.1f} ms (unprofiled)\n")
    rows, f_left, t_left = family_table(f_ops, t_ops)
    rows.append(("optimizer (AdamW + clip)", f_left.pop("(optimizer)", 0), t_opt))
    print(f"{'ms per step':32s} {'fathom':>9s} {'torch':>9s}")
    for fam, f, t in rows:
        print(f"{fam:32s} {f:9.2f} {t:9.2f}")
    f_rest, t_rest = sum(f_left.values()), sum(t_left.values())
    print(f"{'other ops':32s} {f_rest:9.2f} {t_rest:9.2f}")
    f_sum = sum(r[1] for r in rows) + f_rest
    t_sum = sum(r[2] for r in rows) + t_rest
    print(f"{'sum of op time':32s} {f_sum:9.2f} {t_sum:9.2f}")
    print(f"{'outside ops (step - sum)':32s} {f_step - f_sum:9.2f} {'':>9s}")
    top_t = sorted(t_left.items(), key=lambda kv: -kv[1])[:8]
    print("torch's largest other ops: " + ", ".join(f"{k} {v:.2f}" for k, v in top_t))
    top_f = sorted(f_left.items(), key=lambda kv: -kv[1])[:8]
    print("fathom's other ops: " + ", ".join(f"{k} {v:.2f}" for k, v in top_f) + "\n")
    print(f"{'GEMM M x N x K':22s} {'per step':>8s} {'fathom ms':>10s} {'GFLOP/s':>8s} {'torch ms':>9s} {'GFLOP/s':>8s}")
    keys = sorted(set(f_gemm) | set(t_gemm), key=lambda k: -(f_gemm.get(k, (0, 0, 0))[1]))
    for k in keys:
        fc, fms, ffl = f_gemm.get(k, (0, 0, 0))
        tc, tms, tfl = t_gemm.get(k, (0, 0, 0))
        fg = ffl / fms / 1e6 if fms else 0
        tg = tfl / tms / 1e6 if tms else 0
        print(f"{'%d x %d x %d' % k:22s} {max(fc, tc):8.1f} {fms:10.2f} {fg:8.1f} {tms:9.2f} {tg:8.1f}")


if __name__ == "__main__":
    sys.exit(main())
