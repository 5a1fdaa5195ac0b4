"""fathom's token sampler (bench_gpt_sample, C) against PyTorch's equivalent, in the
same invocation: Hugging Face's logits warpers as transformers applies them
(temperature, then top-k with torch.topk, or top-p with a full torch.sort and a
cumulative sum), softmax and torch.multinomial, one thread, on GPT-like logits
at GPT-2's vocabulary (50257). Times are this thread's CPU time per token
(median), since on a loaded machine wall-clock medians mostly measure the other
processes.

    python3 bench/bench_gpt_sample.py [--bin build/bench_gpt_sample] [--draws 400]
"""
import argparse
import re
import subprocess
import time

import torch

MODES = [("top_k 40", 0.8, 40, 1.0), ("top_k 40, top_p 0.95", 0.8, 40, 0.95), ("top_p 0.95", 0.8, 0, 0.95),
         ("top_p 0.9, T 1", 1.0, 0, 0.9), ("temperature 1 only", 1.0, 0, 1.0), ("top_k 1000", 1.0, 1000, 1.0)]


def torch_sample(logits, T, k, p, gen):
    x = logits / T
    if k > 0:
        v, _ = torch.topk(x, k)
        x = x.masked_fill(x < v[..., -1:], float("-inf"))
    if p < 1.0:
        s, idx = torch.sort(x, descending=False)
        cum = s.softmax(-1).cumsum(-1)
        remove = cum <= 1 - p
        x = x.masked_fill(remove.scatter(-1, idx, remove), float("-inf"))
    return torch.multinomial(x.softmax(-1), 1, generator=gen).item()


def logits_like(V, gen):
    x = torch.randn(1, V, generator=gen) * 2.5
    x[0, torch.randint(0, V, (6,), generator=gen)] += 8.0 + 4.0 * torch.rand(6, generator=gen)
    return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build/bench_gpt_sample")
    ap.add_argument("--draws", type=int, default=400)
    a = ap.parse_args()
    torch.set_num_threads(1)
    out = subprocess.run([a.bin, str(a.draws)], capture_output=True, text=True)
    print(out.stdout, end="")
    if out.returncode:
        print(out.stderr)
        raise SystemExit("bench_gpt_sample reported different tokens or failed")
    fathom = {}
    for line in out.stdout.splitlines():
        m = re.match(r"(.+?)\s+([\d.]+) \(\s*[\d.]+\)\s+([\d.]+) \(", line)
        if m:
            fathom[m.group(1).strip()] = float(m.group(3))
    gen = torch.Generator().manual_seed(0)
    print(f"\nPyTorch {torch.__version__} (CPU, one thread), vocab 50257, CPU time per token, median of {a.draws}")
    print(f"{'mode':22s} {'torch us':>9s} {'fathom us':>10s} {'torch/fathom':>13s}")
    for name, T, k, p in MODES:
        ts = []
        x = logits_like(50257, gen)
        for d in range(a.draws):
            if d % 8 == 0:
                x = logits_like(50257, gen)
            t0 = time.thread_time()
            torch_sample(x, T, k, p, gen)
            ts.append(time.thread_time() - t0)
        ts.sort()
        t = ts[len(ts) // 2] * 1e6
        f = fathom.get(name)
        print(f"{name:22s} {t:9.1f} {f:10.1f} {t / f:12.2f}x" if f else f"{name:22s} {t:9.1f}")


if __name__ == "__main__":
    main()
