#!/usr/bin/env python3
"""ONNX Runtime on the GPT decode graphs that tests/test_onnx_gpt_export.c exported.

  onnx_gpt_ort_check.py DIR STEPS TAG [TAG ...]

For each TAG: onnx.checker.check_model(DIR/TAG.onnx, full_check=True), then the
prompt and decode steps (DIR/TAG_tokens_<s>.npy), each fed the previous step's
presents (ORT's own), with every step's logits within 1e-5 relative (of the
largest |logit|) of fathom's graph (DIR/TAG_logits_<s>.npy). Exit 77 when onnx
or onnxruntime is missing."""
import sys

try:
    import numpy as np
    import onnx
    import onnxruntime as ort
except ImportError as e:
    print(f"needs numpy, onnx and onnxruntime ({e.name} missing): pip install onnx==1.22.0 onnxruntime")
    sys.exit(77)


def check(d, steps, tag):
    path = f"{d}/{tag}.onnx"
    onnx.checker.check_model(onnx.load(path), full_check=True)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    ins = [i.name for i in sess.get_inputs()]
    outs = [o.name for o in sess.get_outputs()]
    past = {}
    for i in sess.get_inputs()[1:]:
        kv, dh = i.shape[1], i.shape[3]
        past[i.name] = np.zeros((1, kv, 0, dh), np.float32)
    worst = 0.0
    for s in range(steps):
        feed = {"tokens": np.load(f"{d}/{tag}_tokens_{s}.npy"), **past}
        res = dict(zip(outs, sess.run(None, feed)))
        ref = np.load(f"{d}/{tag}_logits_{s}.npy")
        got = res["logits"]
        if got.shape != ref.shape:
            sys.exit(f"{tag} step {s}: ORT logits {got.shape}, fathom {ref.shape}")
        worst = max(worst, float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-12)))
        past = {n: res[n.replace("past_", "present_")] for n in ins[1:]}
    print(f"{tag}: onnx.checker accepts it; ONNX Runtime {ort.__version__} vs fathom's graph over {steps} steps "
          f"(prompt + {steps - 1} decode): logits max relative difference {worst:.3g}")
    if not worst <= 1e-5:
        sys.exit(f"{tag}: ORT's logits differ from fathom's by {worst:.3g} (relative; 1e-5 allowed)")


def main():
    d, steps = sys.argv[1], int(sys.argv[2])
    for tag in sys.argv[3:]:
        check(d, steps, tag)


if __name__ == "__main__":
    main()
