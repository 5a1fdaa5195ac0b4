#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz/fuzz_*.c) with clang + ASan + UBSan
# and runs each for SECONDS (default 10) on a seed corpus made from the test
# fixtures and from a tiny run of the fuzz build's own `fathom` (its tokenizer,
# token file, config, MANIFEST, trace and TensorBoard file). A crash, leak or
# UB report fails the script; the input that caused it is left in BUILD_DIR.
# Usage: bash tools/fuzz.sh [SECONDS] [TARGET...]   (CC=clang-14, BUILD_DIR=build-fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
shift || true
cc=${CC:-clang-14}
command -v "$cc" > /dev/null || { echo "fuzz: $cc not found (apt-get install -y clang-14 libclang-rt-14-dev)"; exit 1; }
b=${BUILD_DIR:-build-fuzz}
targets=${*:-$(cd tests/fuzz && ls fuzz_*.c | sed 's/\.c$//' | tr '\n' ' ')}
CC=$cc cmake -S . -B "$b" -DCMAKE_BUILD_TYPE=Debug -DFATHOM_FUZZ=ON -DFATHOM_WERROR=OFF -DFATHOM_CUDA=OFF > /dev/null
# shellcheck disable=SC2086
if ! cmake --build "$b" -j"$(nproc)" --target fathom_cli $targets > "$b/build.log" 2>&1; then
  # a failed build must not fuzz the binaries an earlier one left behind
  grep -E "error" "$b/build.log" | head -20
  echo "fuzz: the build failed (log: $b/build.log)"
  exit 1
fi
grep -E "warning: unused" "$b/build.log" || true
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

# ---- seeds ----
seeds=$b/seeds
rm -rf "$seeds" && mkdir -p "$seeds"/{jinja,safetensors,npy,npz,idx,csv,recipe,tokenizer,token_file,gpt_config,trace,tensorboard,manifest,graph,infer_request,hf_tokenizer,hf_config,chat,plan_db,plan_config,completion_request,model_config,model_config_pbtxt,embed_request}
cp tests/fixtures/gpt/*.safetensors "$seeds/safetensors/" 2> /dev/null || true
cp tests/data/*.npy "$seeds/npy/"
cp tests/data/*.npz "$seeds/npz/"
cp data/recipes/*.ini "$seeds/recipe/"
cp tests/data/graph/*.json "$seeds/graph/"
# the planner's GPU databases and config.json files (fuzz_plan_db, fuzz_plan_config)
cp data/gpus.json tests/data/plan_gpus_test.json "$seeds/plan_db/"
for c in tests/data/plan_configs/*/config.json; do cp "$c" "$seeds/plan_config/$(basename "$(dirname "$c")").json"; done
# ONNX: the smaller models and tensors of Debian's libonnx-testdata node suite, when installed
mkdir -p "$seeds/onnx"
for m in /usr/share/libonnx-testdata/data/node/test_{abs,add_bcast,conv_with_strides_padding,gemm_default_single_elem_vector_bias,maxpool_2d_pads,reshape_negative_dim,slice,softmax_axis_0,layer_normalization_2d_axis0,gather_0,split_equal_parts_1d,transpose_default,batchnorm_example,concat_2d_axis_0,clip,expand_dim_changed,reduce_sum_keepdims_example,where_example,cast_FLOAT_to_DOUBLE,pad,scatternd,scatter_elements_with_negative_indices,maxpool_2d_ceil,einsum_batch_matmul,einsum_batch_diagonal,top_k,gathernd_example_int32_batch_dim1,onehot_with_axis,depthtospace_crd_mode_example,lrn,quantizelinear_axis,qlinearmatmul_2D,nllloss_NCd1d2_with_weight_reduction_mean,sce_mean_weight_ii,gridsample,roialign_aligned_true,lstm_with_peepholes,gru_seq_length,nonmaxsuppression_suppress_by_IOU,unique_sorted_with_axis,dft,stft,reduce_prod_default_axes_keepdims_example,convinteger_with_padding,dynamicquantizelinear,if,loop11,scan9_sum,scan_sum,range_float_type_positive_delta_expanded,loop13_seq,sequence_map_add_2_sequences,optional_get_element_sequence,sequence_insert_at_back,reversesequence_batch,maxunpool_export_with_output_shape,det_nd}; do
  [ -f "$m/model.onnx" ] && cp "$m/model.onnx" "$seeds/onnx/$(basename "$m").onnx" && cp "$m/test_data_set_0/input_0.pb" "$seeds/onnx/$(basename "$m").pb"
done
# Attention and RotaryEmbedding (opset 23) from the onnx package's newer node suite, when installed
nd=$(python3 -c 'import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node"))' 2>/dev/null)
for m in "$nd"/test_{attention_4d_gqa_with_past_and_present,attention_3d_attn_mask,attention_4d_causal,rotary_embedding_interleaved,affine_grid_2d_expanded,linear_attention_gated_delta_gqa,causal_conv_with_state_silu,flexattention_score_mod,deform_conv_with_mask_bias,tensorscatter_circular,bitcast_float32_to_int32,col2im_pads,lppool_2d_dilations,center_crop_pad_crop_and_pad,group_normalization_example}; do
  [ -f "$m/model.onnx" ] && cp "$m/model.onnx" "$seeds/onnx/$(basename "$m").onnx"
done
# and what torch.onnx.export writes for a BERT and for torchvision's image models (the graph
# import's patterns, scatters), when python3 has onnx
python3 tests/onnx_import_patterns.py "$seeds/onnx" > /dev/null 2>&1 || true
python3 tests/onnx_vision_patterns.py "$seeds/onnx" > /dev/null 2>&1 || true
rm -f "$seeds/onnx"/*.npy
printf 'a,b,label\n1,2,0\n3.5,-4e2,1\n' > "$seeds/csv/small.csv"
python3 - "$seeds" <<'PY'
import os, struct, sys, zlib
d = sys.argv[1]
open(f"{d}/idx/images", "wb").write(struct.pack(">BBBBIII", 0, 0, 8, 3, 2, 2, 2) + bytes(range(8)))
open(f"{d}/idx/labels", "wb").write(struct.pack(">BBBBI", 0, 0, 8, 1, 3) + bytes([0, 1, 2]))
def png(w, h, ctype, depth, rows):  # a minimal PNG: IHDR, one IDAT, IEND
    def chunk(t, b):
        return struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b))
    raw = b"".join(b"\0" + r for r in rows)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
os.makedirs(f"{d}/png", exist_ok=True)
open(f"{d}/png/grey.png", "wb").write(png(4, 3, 0, 8, [bytes(range(i * 4, i * 4 + 4)) for i in range(3)]))
open(f"{d}/png/rgb.png", "wb").write(png(2, 2, 2, 8, [bytes(range(6)), bytes(range(6, 12))]))
open(f"{d}/png/grey16.png", "wb").write(png(2, 1, 0, 16, [bytes(4)]))
# inference requests: 4 bytes of Inference-Header-Content-Length (ff: absent), then the body
js = b'{"id":"a","inputs":[{"name":"x","datatype":"FP32","shape":[1,2,2],"data":[[1,2],[3,4]]},' \
     b'{"name":"ids","datatype":"INT64","shape":[1,3],"data":[1,2,3]}],"outputs":[{"name":"x"}]}'
open(f"{d}/infer_request/json", "wb").write(b"\xff" * 4 + js)
jb = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,2,1],"parameters":{"binary_data_size":8}},' \
     b'{"name":"ids","datatype":"INT64","shape":[1,3],"parameters":{"binary_data_size":24}}],' \
     b'"parameters":{"binary_data_output":true}}'
open(f"{d}/infer_request/binary", "wb").write(struct.pack("<I", len(jb)) + jb + struct.pack("<2f3q", 1, 2, 7, 8, 9))
jc = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[2,2,2],"data":[1,5,3,4,9,0,2,2]},' \
     b'{"name":"ids","datatype":"INT64","shape":[2,3],"data":[1,2,3,4,5,6]}],' \
     b'"outputs":[{"name":"x","parameters":{"classification":3}},{"name":"ids","parameters":{"classification":2,"binary_data":true}}]}'
open(f"{d}/infer_request/classification", "wb").write(b"\xff" * 4 + jc)
js = b'{"inputs":[{"name":"x","datatype":"FP32","shape":[1,2,2],"parameters":{"shared_memory_region":"r","shared_memory_byte_size":16,"shared_memory_offset":4}},' \
     b'{"name":"ids","datatype":"INT64","shape":[1,3],"data":[1,2,3]}],"outputs":[{"name":"x","parameters":{"shared_memory_region":"o","shared_memory_byte_size":16}}]}'
open(f"{d}/infer_request/shm", "wb").write(b"\xff" * 4 + js)
# Hugging Face tokenizer files (fuzz_hf_tokenizer: 'w' + vocab.txt, 'j' + tokenizer.json, or 'g' + vocab.json
# NUL merges.txt)
alpha = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or b >= 174]
cps = {b: b for b in alpha}
cps.update({b: 256 + i for i, b in enumerate(b for b in range(256) if b not in alpha)})
import json
vocab = {chr(cps[b]): b for b in range(256)}
for w in ["in", "th", "the", "\u0120the", "\u0120", "be"]:
    vocab.setdefault(w, len(vocab))
merges = "#version: 0.2\ni n\nt h\nth e\n\u0120 the\nb e\n"
open(f"{d}/hf_tokenizer/gpt2", "wb").write(b"g" + json.dumps(vocab).encode() + b"\0" + merges.encode())
open(f"{d}/hf_tokenizer/wordpiece", "wb").write(b"w[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n##s\n,\n!\nnaive\n")
# tokenizer.json ('j'): Llama 2's pipeline (Prepend + Replace, <s> template, Strip) and the
# Metaspace forms (prepend_scheme first; always + split with ignore_merges)
sp = "\u2581"
lv = {"<unk>": 0, "<s>": 1, "</s>": 2}
for b in range(256):
    lv[f"<0x{b:02X}>"] = len(lv)
for w in [sp, "h", "e", "l", "o", "a", "i", "n", sp + "h", sp + "he", "ll", sp + "hell", sp + "hello", "in", sp + "a"]:
    lv.setdefault(w, len(lv))
lm = [[sp, "h"], [sp + "h", "e"], ["l", "l"], [sp + "he", "ll"], [sp + "hell", "o"], ["i", "n"], [sp, "a"]]
added = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
          "special": True} for c, i in (("<unk>", 0), ("<s>", 1), ("</s>", 2))]
strip_dec = {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": sp}, "content": " "},
             {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
bos = {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
       {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
model = {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
         "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False, "vocab": lv}
forms = {
    "llama_legacy": dict(normalizer={"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": sp},
                         {"type": "Replace", "pattern": {"String": " "}, "content": sp}]}, pre_tokenizer=None,
                         post_processor=bos, decoder=strip_dec, model=dict(model, merges=[" ".join(m) for m in lm])),
    "llama_first": dict(normalizer=None, pre_tokenizer={"type": "Metaspace", "replacement": sp, "prepend_scheme": "first",
                        "split": False}, post_processor=bos, decoder=strip_dec, model=dict(model, merges=lm)),
    "llama_split": dict(normalizer=None, pre_tokenizer={"type": "Metaspace", "replacement": sp, "prepend_scheme": "always",
                        "split": True}, post_processor=None, decoder={"type": "Metaspace", "replacement": sp,
                        "prepend_scheme": "always", "split": True}, model=dict(model, merges=lm, ignore_merges=True)),
}
# byte-level tokenizer.json: Llama 3's (Split on its pattern + ByteLevel, ignore_merges, special
# tokens after the vocabulary, BOS template in a Sequence) and GPT-2's (ByteLevel both ways)
bv = {chr(cps[b]): b for b in range(256)}
for w in ["\u0120h", "\u0120hi", "12", "123", "in", "\u010a\u010a"]:
    bv.setdefault(w, len(bv))
bm = [["\u0120", "h"], ["\u0120h", "i"], ["1", "2"], ["12", "3"], ["i", "n"], ["\u010a", "\u010a"]]
l3 = [{"id": len(bv) + i, "content": c, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
       "special": True} for i, c in enumerate(["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"])]
l3re = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
        r"\s*[\r\n]+|\s+(?!\S)|\s+")
bl_model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": bv}
bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
forms["llama3"] = dict(added_tokens=l3, normalizer=None, pre_tokenizer={"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": l3re}, "behavior": "Isolated", "invert": False}, dict(bl, use_regex=False)]},
    post_processor={"type": "Sequence", "processors": [dict(bl, trim_offsets=False), dict(bos, special_tokens={
        "<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [len(bv)], "tokens": ["<|begin_of_text|>"]}},
        single=[{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}])]},
    decoder=bl, model=dict(bl_model, merges=[" ".join(m) for m in bm], ignore_merges=True))
# Qwen2's: Llama 3's with an NFC normalizer and single digits
forms["qwen2"] = dict(forms["llama3"], normalizer={"type": "NFC"}, pre_tokenizer={"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": l3re.replace(r"\p{N}{1,3}", r"\p{N}")}, "behavior": "Isolated", "invert": False},
    dict(bl, use_regex=False)]})
forms["bytelevel_gpt2"] = dict(added_tokens=[dict(l3[0], content="<|endoftext|>")], normalizer=None, pre_tokenizer=bl,
                               post_processor=bl, decoder=bl, model=dict(bl_model, merges=bm, ignore_merges=False))
for name, f in forms.items():
    f = dict(dict(added_tokens=added), **f)
    open(f"{d}/hf_tokenizer/{name}", "wb").write(b"j" + json.dumps(dict(version="1.0", truncation=None, padding=None,
                                                                       **f)).encode())
# Hugging Face config.json (fuzz_hf_config)
cfgs = {
    "gpt2": {"model_type": "gpt2", "vocab_size": 50, "n_positions": 16, "n_embd": 8, "n_layer": 1, "n_head": 2,
             "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
             "tie_word_embeddings": False, "resid_pdrop": 0.1},
    "llama": {"model_type": "llama", "vocab_size": 50, "hidden_size": 16, "intermediate_size": 24,
              "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 32, "rope_parameters": {"rope_theta": 5e5, "rope_type": "llama3",
              "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 16}, "head_dim": 4},
    "llama4": {"model_type": "llama", "vocab_size": 50, "hidden_size": 16, "intermediate_size": 24,
               "num_hidden_layers": 1, "num_attention_heads": 4, "max_position_embeddings": 32,
               "rope_theta": 1e4, "rope_scaling": {"type": "linear", "factor": 2.0}},
    "qwen2": {"model_type": "qwen2", "vocab_size": 50, "hidden_size": 16, "intermediate_size": 24,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 32, "rope_theta": 1e6, "tie_word_embeddings": True,
              "use_sliding_window": True, "sliding_window": 32, "max_window_layers": 1,
              "layer_types": ["full_attention", "sliding_attention"], "attention_dropout": 0.0},
    "bert": {"model_type": "bert", "vocab_size": 30, "hidden_size": 8, "num_hidden_layers": 1,
             "num_attention_heads": 2, "intermediate_size": 16, "max_position_embeddings": 16,
             "hidden_act": "gelu", "layer_norm_eps": 1e-12, "type_vocab_size": 2},
}
for k, v in cfgs.items():
    open(f"{d}/hf_config/{k}.json", "w").write(json.dumps(v))
open(f"{d}/corpus.txt", "w").write("in the beginning god created the heaven and the earth\n" * 30)
PY
run=$b/seedrun
rm -rf "$run"
cat > "$seeds/gpt.ini" <<EOF
[model]
type = gpt
n_layer = 1
n_head = 2
n_embd = 16
ffn_hidden = 32
block_size = 16
[tokenizer]
kind = bpe
vocab_size = 280
[data]
corpus = $seeds/corpus.txt
[train]
batch_size = 2
steps = 2
eval_every = 2
eval_batches = 1
ckpt_every = 2
EOF
"$b/fathom" train "$seeds/gpt.ini" --out "$run" --quiet --profile "$run.trace.json" --logdir "$run.logs" > /dev/null
cp "$seeds/gpt.ini" "$seeds/recipe/"
cp "$run/tokenizer.txt" "$seeds/tokenizer/"
cp "$run/tokens.bin" "$seeds/token_file/"
cp "$run/config.json" "$seeds/gpt_config/"
cp "$run/config.json" "$seeds/plan_config/fathom-gpt.json"
cp "$run"/ckpt/step-*/MANIFEST "$seeds/manifest/"
cp "$run.trace.json" "$seeds/trace/"
# regressions the fuzzer found: a thread id beyond int64's range (UBSan: float-to-integer overflow)
printf '[{"name":"a","cat":"forward","ph":"X","ts":0,"dur":1,"pid":1,"tid":2.4e28}]' > "$seeds/trace/tid_overflow.json"
cp "$run.logs"/* "$seeds/tensorboard/"
cp "$run/model.safetensors" "$seeds/safetensors/run.safetensors"

# chat messages ('m' + a request body) and chat templates (a config's chat_template object) (fuzz_chat)
printf 'm{"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}, {"role": "assistant", "content": "yo"}]}' > "$seeds/chat/messages"
printf 'm{"messages": [{"role": "tool", "content": "x"}]}' > "$seeds/chat/badrole"
printf 't{"system": "<s>{content}\\n", "user": "U: {content}\\n", "assistant": "A: {content}\\n", "generation": "A:", "stop": "U:"}' > "$seeds/chat/template"

# served models' config.json files (fuzz_model_config): Triton's fields, the batcher, text generation
printf '{"name": "fuzz", "max_batch_size": 16, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1, 28, 28]}], "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [10]}], "dynamic_batching": {"preferred_batch_size": [4, 8], "max_queue_delay_microseconds": 500, "max_queue_size": 64, "default_timeout_microseconds": "100000"}, "instance_group": [{"count": 2, "kind": "KIND_CPU"}], "version_policy": {"specific": {"versions": [1, 3]}}}' > "$seeds/model_config/kserve"
printf '{"max_batch_size": 8, "platform": "fathom_gpt", "version_policy": {"latest": {"num_versions": 2}}, "text_generation": {"kv_cache_blocks": 128, "kv_block_tokens": 16, "prefill_chunk_tokens": 256, "stream_interval_tokens": 4, "kv_cache_dtype": "f16", "chat_template": {"user": "Q: {content}\\n", "generation": "A:", "stop": "\\nQ:"}}}' > "$seeds/model_config/textgen"
printf '{"backend": "onnxruntime", "default_model_filename": "m.onnx", "version_policy": {"all": {}}}' > "$seeds/model_config/onnx"
# the same in protobuf text (fuzz_model_config_pbtxt), as Triton's config.pbtxt files are written
cat > "$seeds/model_config_pbtxt/kserve" <<'PBTXT'
# a comment
name: "fuzz"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ { name: "x" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 1, 28, 28 ] } ]
output { name: 'y', data_type: TYPE_FP32; dims: 10 }
dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 0x1f4
  default_queue_policy { max_queue_size: 64 default_timeout_microseconds: 100000 } }
instance_group [ { count: 2 kind: KIND_CPU } ]
version_policy: { specific: { versions: [1, 3] } }
parameters { key: "k" value: { string_value: "v\t\x41\101\u00e9" "joined" } }
optimization < execution_accelerators { cpu_execution_accelerator: [ { name: "openvino" } ] } >
x: -1.5e3 y: 2.5f z: -inf w: true
PBTXT
cat > "$seeds/model_config_pbtxt/densenet" <<'PBTXT'
name: "fuzz"
platform: "onnxruntime_onnx"
max_batch_size : 0
input [ { name: "data_0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, 224, 224 ] reshape { shape: [ 1, 3, 224, 224 ] } } ]
output [ { name: "fc6_1" data_type: TYPE_FP32 dims: [ 1000 ] reshape { shape: [ 1, 1000, 1, 1 ] } label_filename: "labels.txt" } ]
PBTXT
printf 'max_batch_size: 8\nplatform: "fathom_gpt"\nversion_policy { latest { num_versions: 2 } }\ntext_generation { kv_cache_blocks: 128 kv_cache_dtype: "f16" chat_template { user: "Q: {content}\\n" generation: "A:" } }\n' > "$seeds/model_config_pbtxt/textgen"

# completion requests (fuzz_completion_request): a flag byte (1: chat, 2: configured template, 4: final
# text), the body, NUL, then "generated" bytes (also read as float logits for the sampler)
python3 - "$seeds/completion_request" <<'PY'
import json, struct, sys
d = sys.argv[1]
def seed(name, flag, body, raw=b""):
    open(f"{d}/{name}", "wb").write(bytes([flag]) + json.dumps(body).encode() + b"\0" + raw)
logits = struct.pack("<8f", 1.5, -2.0, 0.25, float("nan"), 3.0, float("-inf"), 3.0, -0.0)
seed("stream_usage", 0, {"model": "kjv", "prompt": "In the beginning", "max_tokens": 32, "temperature": 0.8,
                         "top_p": 0.95, "top_k": 40, "stop": ["\n", "Amen"], "seed": 1, "stream": True,
                         "stream_options": {"include_usage": True}}, "caf\u00e9 \u2603".encode() + b"\xe2\x82")
seed("whole", 4, {"model": "kjv", "prompt": "x", "stop": "and", "n": 1, "stream": False}, b"ok \xff\xfe bad" + logits)
seed("sampler", 0, {"model": "m", "prompt": "p", "temperature": 1.0, "top_p": 0.5}, logits * 4)
seed("sampler_topk", 0, {"model": "m", "prompt": "p", "temperature": 0.7, "top_k": 3}, logits * 2)
seed("chat", 1, {"model": "kjv", "max_completion_tokens": 8, "max_tokens": 4, "stream": True,
                 "stream_options": {"include_usage": False},
                 "messages": [{"role": "system", "content": "be brief"},
                              {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                              {"role": "assistant", "content": "yo"}]}, "h\u00e9llo".encode())
seed("chat_template", 3, {"model": "kjv", "messages": [{"role": "user", "content": "who?"}], "stop": ["a", "b", "c"]})
seed("usage_without_stream", 0, {"model": "kjv", "prompt": "x", "stream_options": {"include_usage": True}})
seed("bad_option", 0, {"model": "kjv", "prompt": "x", "stream": True, "stream_options": {"include_usag": True}})
seed("prompts_n", 0, {"model": "kjv", "prompt": ["a", "bb"], "n": 3, "best_of": 3, "echo": True, "seed": 9,
                      "presence_penalty": 0.5, "frequency_penalty": -1.5, "repetition_penalty": 1.2,
                      "logit_bias": {"5": -100, "17": 2.5}}, logits)
seed("token_prompts", 0, {"model": "kjv", "prompt": [[1, 2, 3], [4]], "top_k": -1, "max_tokens": None})
seed("token_prompt", 4, {"model": "kjv", "prompt": [7, 8, 2147483647], "logprobs": None, "suffix": ""})
seed("vllm", 0, {"model": "kjv", "prompt": "x", "min_p": 0.05, "ignore_eos": True, "stop_token_ids": [2, 50256],
                 "top_k": 40, "repetition_penalty": 1.1})
seed("unknown_field", 1, {"model": "kjv", "messages": [{"role": "user", "content": "x"}], "min_tokens": 3,
                          "modalities": ["text"], "store": False, "metadata": {"a": "b"}})
seed("logprobs", 0, {"model": "kjv", "prompt": "x", "logprobs": 5, "stream": True}, "caf\u00e9 \u2603".encode() + b"\xe2\x82")
seed("chat_logprobs", 1, {"model": "kjv", "messages": [{"role": "user", "content": "x"}], "logprobs": True,
                          "top_logprobs": 20}, b"\xf0\x9f\x98\x80ab" + logits)
seed("chat_tools_none", 1, {"model": "kjv", "messages": [{"role": "user", "content": "x"}], "tools": [],
                            "tool_choice": "none", "response_format": {"type": "text"}, "n": 2})
seed("chat_tools", 1, {"model": "kjv", "messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 3,
                       "tools": [{"type": "function", "function": {"name": "f"}}]})
PY

# chat templates (fuzz_jinja): every template and feature case tests/test_jinja.c compares with jinja2
python3 - "$seeds/jinja" <<'PY' || true
import os, sys
sys.argv = sys.argv[:2]
src = open("tests/serve/jinja_ref.py").read().split("\ncases = []")[0]
ns = {}
try:
    exec(src, ns)
except SystemExit:
    ns = {}
for i, (name, t, v) in enumerate(ns.get("FEATURES", [])):
    open(os.path.join(sys.argv[1], "f%02d" % i), "w").write(t)
for name in ("CHATML", "LLAMA3", "MISTRAL", "ZEPHYR", "GEMMA", "PHI3", "NS_TEMPLATE"):
    if name in ns:
        open(os.path.join(sys.argv[1], name.lower()), "w").write(ns[name])
PY
printf '{%% for m in messages %%}{{ m.role }}: {{ m.content }}\n{%% endfor %%}' > "$seeds/jinja/plain"

# OpenAI embeddings requests (fuzz_embed_request)
printf '{"model": "minilm", "input": ["A man is eating food.", "caf\\u00e9"], "encoding_format": "base64", "dimensions": 384, "user": "u"}' > "$seeds/embed_request/batch"
printf '{"model": "m", "input": "one text", "encoding_format": "float"}' > "$seeds/embed_request/one"
printf '{"model": "m", "input": [101, 2158, 102]}' > "$seeds/embed_request/ids"

# ---- runs ----
scratch=$(mktemp -d "$( [ -w /dev/shm ] && echo /dev/shm || echo /tmp )/fathom_fuzz.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export FATHOM_FUZZ_DIR=$scratch
fails=0
for t in $targets; do
  corpus=$b/corpus/$t
  mkdir -p "$corpus"
  cp -n "$seeds/${t#fuzz_}"/* "$corpus/" 2> /dev/null || true
  log=$b/$t.log
  if (cd "$b" && "./$t" -max_total_time="$secs" -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 "corpus/$t") > "$log" 2>&1; then
    echo "$t: $(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$') executions in ${secs} s, no crash"
  else
    echo "$t: FAILED (log: $log)"; tail -30 "$log"; fails=$((fails + 1))
  fi
done
((fails == 0)) || { echo "fuzz: $fails target(s) failed"; exit 1; }
