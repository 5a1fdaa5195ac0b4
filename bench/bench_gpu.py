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
    return 0


if __name__ == "__main__":
    sys.exit(main())
