"""PyTorch's figures for the shapes of bench/bench_gpu.c, one JSON line each
(same bench names, key "peer"), run by tools/gpu-check.sh on the same GPU."""
import json
import sys
import time

import torch
import torch.nn.functional as F


def timed(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters


def emit(name, metric, value, **extra):
    print(json.dumps({"bench": name, "metric": metric, "peer": round(value, 3), "peer_name": "torch " + torch.__version__, **extra}))


def main():
    if not torch.cuda.is_available():
        print(json.dumps({"bench": "gpu", "skipped": "torch sees no CUDA device"}))
        return 0
    dev = "cuda"
    for n, iters in ((4096, 30), (8192, 10)):
        a = torch.rand(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.rand(n, n, device=dev, dtype=torch.bfloat16)
        t = timed(lambda: a @ b, iters)
        emit(f"matmul_bf16_{n}", "TFLOP/s", 2 * n ** 3 / t / 1e12)
    B, H, T, D = 8, 12, 1024, 64
    q, k, v = (torch.rand(B, H, T, D, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    t = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 20)
    emit("sdpa_fwd_bf16_causal_B8_H12_T1024_D64", "ms", t * 1e3)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    g = torch.rand_like(o)
    tb = timed(lambda: torch.autograd.grad(o, (q, k, v), g, retain_graph=True), 10)
    emit("sdpa_bwd_bf16_causal_B8_H12_T1024_D64", "ms", tb * 1e3)
    n = 1 << 26
    a = torch.rand(n, device=dev)
    b = torch.rand(n, device=dev)
    y = torch.empty_like(a)
    t = timed(lambda: torch.add(a, b, out=y), 50)
    emit("add_f32_64M", "GB/s", 12 * n / t / 1e9)
    ab = a.bfloat16()
    yb = torch.empty_like(ab)
    t = timed(lambda: torch.ops.aten.gelu.out(ab, out=yb), 50)
    emit("gelu_bf16_64M", "GB/s", 4 * n / t / 1e9)
    N, C = 8192, 50304
    x = torch.rand(N, C, device=dev, dtype=torch.bfloat16, requires_grad=True)
    tg = torch.zeros(N, device=dev, dtype=torch.long)
    t = timed(lambda: F.cross_entropy(x, tg), 10)
    emit("cross_entropy_fwd_bf16_8192x50304", "ms", t * 1e3)
    loss = F.cross_entropy(x, tg)
    t = timed(lambda: torch.autograd.grad(loss, x, retain_graph=True), 10)
    emit("cross_entropy_bwd_bf16_8192x50304", "ms", t * 1e3)
    N = 256
    for dt, name in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
        x = torch.rand(N, 32, 28, 28, device=dev, dtype=dt, requires_grad=True)
        w = torch.rand(64, 32, 3, 3, device=dev, dtype=dt, requires_grad=True)
        b = torch.rand(64, device=dev, dtype=dt, requires_grad=True)
        flops = 2.0 * N * 64 * 28 * 28 * 32 * 9
        t = timed(lambda: F.conv2d(x, w, b, padding=1), 10)
        emit(f"conv2d_fwd_{name}_N256_32to64_28x28_k3", "ms", t * 1e3, tflops=round(flops / t / 1e12, 1))
        y = F.conv2d(x, w, b, padding=1)
        g = torch.rand_like(y)
        t = timed(lambda: torch.autograd.grad(y, (x, w, b), g, retain_graph=True), 5)
        emit(f"conv2d_bwd_{name}_N256_32to64_28x28_k3", "ms", t * 1e3, tflops=round(2 * flops / t / 1e12, 1))
        if dt == torch.float32:
            yd = y.detach()
            rm, rv = torch.zeros(64, device=dev), torch.ones(64, device=dev)
            t = timed(lambda: F.batch_norm(yd, rm, rv, training=True, momentum=0.1, eps=1e-5), 10)
            emit("batch_norm_train_f32_N256_C64_28x28", "ms", t * 1e3)
            t = timed(lambda: F.max_pool2d(yd, 2, return_indices=True), 10)
            emit("max_pool2d_f32_N256_C64_28x28_k2", "ms", t * 1e3)
    n = 1 << 24
    pin = torch.zeros(n).pin_memory()
    pag = torch.zeros(n)
    t = timed(lambda: pin.to(dev, non_blocking=True), 10)
    emit("h2d_pinned_64MiB", "GB/s", 4 * n / t / 1e9)
    t = timed(lambda: pag.to(dev), 10)
    emit("h2d_pageable_64MiB", "GB/s", 4 * n / t / 1e9)
    return 0


if __name__ == "__main__":
    sys.exit(main())
