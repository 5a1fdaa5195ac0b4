#!/usr/bin/env python3
"""Writes the PyTorch golden fixtures that tests/test_golden.c checks fathom against.

Run from the repository root with the project's venv:
    .venv/bin/python tools/make_fixtures.py [out_dir]        (default: tests/fixtures)

Two composites, with fixed seeds so the files are reproducible:
  mlp:  x[8,16] -> Linear(16,32) -> LayerNorm(32) -> GELU(erf) -> Linear(32,10)
        -> cross_entropy(mean) against integer targets. Written in f32 and f64.
  attn: x[2,8,32] -> LayerNorm(32) -> fused QKV Linear(32,96) -> split in q,k,v
        (4 heads of 8) -> causal SDPA -> output Linear(32,32) -> + x -> sum(out^2).
        Written in f32.
Each file holds the inputs, parameters, outputs, the loss and the gradient of
the loss with respect to every parameter and float input ("grad.<name>").

File format (all little-endian), version 1:
    magic   4 bytes  b"FMFX"
    version u32      1
    count   u32      number of tensors
    count times:
        name_len u32, name (name_len bytes of UTF-8, no terminator)
        dtype    u32  fathom's fm_dtype numbering: 0 f32, 1 f64, 7 i64
        ndim     u32  0..8
        shape    ndim x i64
        data     prod(shape) x element size bytes, row-major
"""
import os
import struct
import sys

import torch
import torch.nn.functional as F

DTYPE_CODE = {torch.float32: 0, torch.float64: 1, torch.int64: 7}


def write_fixture(path, tensors):
    """tensors: list of (name, tensor). Written atomically (temp file + rename)."""
    parts = [b"FMFX", struct.pack("<II", 1, len(tensors))]
    for name, t in tensors:
        t = t.detach().contiguous().cpu()
        nb = name.encode()
        parts.append(struct.pack("<I", len(nb)) + nb)
        parts.append(struct.pack("<II", DTYPE_CODE[t.dtype], t.dim()))
        parts.append(struct.pack("<%dq" % t.dim(), *t.shape))
        parts.append(t.numpy().astype(t.numpy().dtype.newbyteorder("<"), copy=False).tobytes())
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"".join(parts))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    print("wrote %s (%d tensors, %d bytes)" % (path, len(tensors), os.path.getsize(path)))


def mlp_fixture(dtype):
    g = torch.Generator().manual_seed(1234)
    # Parameters are drawn in f64 and cast, so the f32 and f64 fixtures share values.
    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)
    p = {
        "x": randn(8, 16),
        "w1": randn(32, 16, scale=0.25),
        "b1": randn(32, scale=0.1),
        "ln_w": 1.0 + randn(32, scale=0.1),
        "ln_b": randn(32, scale=0.1),
        "w2": randn(10, 32, scale=0.2),
        "b2": randn(10, scale=0.1),
    }
    target = torch.randint(0, 10, (8,), generator=g, dtype=torch.int64)
    for t in p.values():
        t.requires_grad_(True)
    h = F.linear(p["x"], p["w1"], p["b1"])
    h = F.layer_norm(h, (32,), p["ln_w"], p["ln_b"], eps=1e-5)
    h = F.gelu(h)
    logits = F.linear(h, p["w2"], p["b2"])
    loss = F.cross_entropy(logits, target)
    loss.backward()
    out = [(k, v) for k, v in p.items()] + [("target", target), ("logits", logits), ("loss", loss)]
    out += [("grad." + k, v.grad) for k, v in p.items()]
    return out


def attn_fixture(dtype):
    g = torch.Generator().manual_seed(5678)
    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)
    B, T, C, NH = 2, 8, 32, 4
    p = {
        "x": randn(B, T, C),
        "ln_w": 1.0 + randn(C, scale=0.1),
        "ln_b": randn(C, scale=0.1),
        "w_qkv": randn(3 * C, C, scale=0.2),
        "b_qkv": randn(3 * C, scale=0.1),
        "w_o": randn(C, C, scale=0.2),
        "b_o": randn(C, scale=0.1),
    }
    for t in p.values():
        t.requires_grad_(True)
    h = F.layer_norm(p["x"], (C,), p["ln_w"], p["ln_b"], eps=1e-5)
    qkv = F.linear(h, p["w_qkv"], p["b_qkv"])
    q, k, v = qkv.split(C, dim=-1)
    q, k, v = [t.reshape(B, T, NH, C // NH).transpose(1, 2) for t in (q, k, v)]
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    y = y.transpose(1, 2).reshape(B, T, C)
    out = F.linear(y, p["w_o"], p["b_o"]) + p["x"]
    loss = (out * out).sum()
    loss.backward()
    res = [(k, v) for k, v in p.items()] + [("out", out), ("loss", loss)]
    res += [("grad." + k, v.grad) for k, v in p.items()]
    return res


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join("tests", "fixtures")
    os.makedirs(out_dir, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    write_fixture(os.path.join(out_dir, "mlp_f32.bin"), mlp_fixture(torch.float32))
    write_fixture(os.path.join(out_dir, "mlp_f64.bin"), mlp_fixture(torch.float64))
    write_fixture(os.path.join(out_dir, "attn_f32.bin"), attn_fixture(torch.float32))


if __name__ == "__main__":
    main()
