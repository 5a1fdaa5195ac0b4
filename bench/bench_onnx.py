#!/usr/bin/env python3
"""ONNX models: fathom vs ONNX Runtime (and PyTorch), same machine, same threads, one invocation.

Models are built in PyTorch with seeded random weights and written with torch.onnx.export
(opset 17, dynamic batch):
  mlp      784-512-256-10 with ReLU (the fashion-mlp shape)
  resnet   a ResNet-like CNN on 3x32x32: conv-bn-relu stem, four basic residual blocks
           (16, 32, 64, 64 channels, stride 2 in three), global average pool, linear
  lstm     a 2-layer LSTM (64 -> 128, batch_first) over 32 steps, its last step through a Linear
  gru      the same with a 2-layer GRU
Each is run at batch 1 and 32 on the same input by
  fathom: build/bench_onnx_run (the interpreter, as `fathom run`, and the compiled graph,
          as `fathom compile`), ONNX Runtime 1.x CPU (all graph optimizations, 2 intra-op
          threads), and PyTorch eager (no grad).
Outputs are checked against each other first (max |diff| / max |ref|). Each result is one
JSON line; ratio = peer time / fathom time (above 1: fathom is faster). Figures on a
shared, loaded machine are noisy: medians of alternating rounds, the best too.

  .venv/bin/python bench/bench_onnx.py --build build [--rounds 30]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

torch.set_num_threads(2)


def emit(d):
    print(json.dumps(d), flush=True)


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return torch.relu(y + (self.down(x) if self.down is not None else x))


def resnet():
    return nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
                         Block(16, 16, 1), Block(16, 32, 2), Block(32, 64, 2), Block(64, 64, 2),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def mlp():
    return nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))


class LSTMHead(nn.Module):
    """A sequence classifier: a 2-layer nn.LSTM (batch_first) over 32 steps of 64 features, its last
    step through a Linear; torch.onnx.export writes two ONNX LSTM nodes (no graph form: fathom runs it
    with the interpreter, as `fathom run` and `fathom serve` do)."""
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(64, 128, num_layers=2, batch_first=True)
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        return self.fc(self.rnn(x)[0][:, -1])


class GRUHead(LSTMHead):
    """LSTMHead with a 2-layer nn.GRU (64 -> 128) instead: two ONNX GRU nodes (linear_before_reset 1)."""
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(64, 128, num_layers=2, batch_first=True)


def randomize_bn(model):
    """Non-trivial running statistics, so batch norm is not the identity."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)


def export(model, shape, path):
    x = torch.randn(1, *shape)
    torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
                      opset_version=17, dynamo=False)


def timed(fn, rounds):
    fn()
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        ts.append(1e3 * (time.perf_counter() - t0))
    ts.sort()
    return float(np.median(ts)), ts[0]


def fathom_side(args, path, x, tmp):
    xp = os.path.join(tmp, "x.npy")
    np.save(xp, x)
    r = subprocess.run([f"{args.build}/bench_onnx_run", path, xp, str(args.rounds)], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"bench_onnx_run failed on {path}: {r.stderr.strip()}")
    # fathom's outputs, for the agreement check
    out = os.path.join(tmp, "out")
    r2 = subprocess.run([f"{args.build}/fathom", "run", path, "--input", f"x={xp}", "--output", out], capture_output=True, text=True)
    if r2.returncode:
        sys.exit(f"fathom run failed on {path}: {r2.stderr.strip()}")
    return json.loads(r.stdout), np.load(os.path.join(out, "y.npy"))


def bench_model(args, name, model, shape, ort, tmp):
    torch.manual_seed(0)
    model = model.eval()
    randomize_bn(model)
    path = os.path.join(tmp, f"{name}.onnx")
    export(model, shape, path)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    for b in (1, 32):
        x = np.random.default_rng(b).standard_normal((b, *shape)).astype(np.float32)
        f, fy = fathom_side(args, path, x, tmp)
        oy = sess.run(None, {"x": x})[0]
        with torch.no_grad():
            ty = model(torch.from_numpy(x)).numpy()
        scale = float(np.abs(ty).max())
        o_med, o_best = timed(lambda: sess.run(None, {"x": x}), args.rounds)

        def torch_run():
            with torch.no_grad():
                model(torch.from_numpy(x))
        t_med, t_best = timed(torch_run, args.rounds)
        row = {"bench": "onnx_run", "model": name, "batch": b, "fathom_interp_ms": f["interp_ms"],
               "fathom_graph_ms": f.get("graph_ms"), "onnxruntime_ms": round(o_med, 4), "pytorch_ms": round(t_med, 4),
               "fathom_best_ms": min(f["interp_best_ms"], f.get("graph_best_ms", 1e30)), "onnxruntime_best_ms": round(o_best, 4),
               "ratio_interp_vs_onnxruntime": round(o_med / f["interp_ms"], 3),
               "max_rel_diff_fathom_vs_torch": float(np.abs(fy - ty).max()) / scale,
               "max_rel_diff_onnxruntime_vs_torch": float(np.abs(oy - ty).max()) / scale}
        if "graph_ms" in f:
            row["ratio_graph_vs_onnxruntime"] = round(o_med / f["graph_ms"], 3)
            row["ratio_graph_vs_pytorch"] = round(t_med / f["graph_ms"], 3)
        else:
            row["graph"] = f.get("graph")
        emit(row)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--models", default="mlp,resnet,lstm,gru", help="comma-separated: mlp, resnet, lstm, gru")
    args = ap.parse_args()
    try:
        import onnxruntime as ort
        import onnx  # noqa: F401  (torch.onnx.export needs it)
    except ImportError:
        print("bench_onnx: needs onnx and onnxruntime (pip install onnx onnxruntime)", file=sys.stderr)
        return 77
    emit({"cpu": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(" :\t"), "threads": 2,
          "torch": torch.__version__, "onnxruntime": ort.__version__, "load_1min": os.getloadavg()[0]})
    with tempfile.TemporaryDirectory() as tmp:
        for name, make, shape in (("mlp", mlp, (784,)), ("resnet", resnet, (3, 32, 32)), ("lstm", LSTMHead, (32, 64)), ("gru", GRUHead, (32, 64))):
            if name in args.models.split(","):
                bench_model(args, name, make(), shape, ort, tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
