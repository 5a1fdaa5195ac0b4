"""Exports small Hugging Face models with the current PyTorch ONNX exporter
(torch.onnx.export, dynamo), as a user who brings an ONNX file from the
transformers ecosystem has one, for tests/cli_onnx_hf_export.sh:

  gpt2.onnx   GPT2LMHeadModel, logits of input_ids [batch, seq]
  llama.onnx  LlamaForCausalLM (grouped-query attention, RoPE, SwiGLU)
  qwen2.onnx  Qwen2ForCausalLM (q/k/v biases)
  bert.onnx   BertModel, last_hidden_state

each with batch and seq dynamic (torch.export.Dim), random weights from a fixed
seed, and opset 18. transformers 5 builds the causal mask from position tables
indexed with GatherND over the dynamic batch and sequence: the import must keep
both dims dynamic through it. For each model and each (batch, seq) in SHAPES,
OUT/<model>_ids_<i>.npy holds the token ids and OUT/<model>_ref_<i>.npy PyTorch's
own output on them (fp32, eager), the reference the test compares fathom with.

Exit 77 (skip) when torch, transformers or onnxscript (the exporter's) is missing.

usage: python3 onnx_hf_export.py OUT_DIR"""
import sys
import warnings

SHAPES = [(1, 1), (2, 7), (3, 13), (1, 40)]

try:
    import numpy as np
    import onnxscript  # noqa: F401  (torch.onnx's dynamo exporter needs it)
    import torch
    import transformers
except ImportError as e:
    print(f"SKIP: needs numpy, torch, transformers and onnxscript ({e.name} missing)")
    sys.exit(77)


def models():
    small = dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=64, intermediate_size=128, vocab_size=300,
                 max_position_embeddings=128)
    yield "gpt2", transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=2, n_head=4, n_embd=64, n_positions=128, vocab_size=300))
    yield "llama", transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=2, **small))
    yield "qwen2", transformers.Qwen2ForCausalLM(transformers.Qwen2Config(num_key_value_heads=2, **small))
    yield "bert", transformers.BertModel(transformers.BertConfig(**small))


class Wrap(torch.nn.Module):
    """input_ids -> the one output tensor (logits, or BERT's last hidden state)"""

    def __init__(self, m, causal):
        super().__init__()
        self.m, self.causal = m, causal

    def forward(self, ids):
        if self.causal:
            return self.m(input_ids=ids, use_cache=False).logits
        return self.m(input_ids=ids).last_hidden_state


def main():
    out = sys.argv[1]
    warnings.filterwarnings("ignore")
    torch.manual_seed(0)
    rng = np.random.default_rng(7)
    for name, m in models():
        w = Wrap(m.eval(), name != "bert")
        ids = torch.randint(0, 300, (2, 7))
        dims = {"ids": {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}}
        torch.onnx.export(w, (ids,), f"{out}/{name}.onnx", input_names=["input_ids"], output_names=["y"],
                          dynamic_shapes=dims, opset_version=18, dynamo=True, verbose=False)
        with torch.no_grad():
            for i, (b, s) in enumerate(SHAPES):
                x = rng.integers(0, 300, (b, s)).astype(np.int64)
                np.save(f"{out}/{name}_ids_{i}.npy", x)
                np.save(f"{out}/{name}_ref_{i}.npy", w(torch.from_numpy(x)).numpy())
    print(f"wrote 4 models, {len(SHAPES)} shapes each")


if __name__ == "__main__":
    main()
