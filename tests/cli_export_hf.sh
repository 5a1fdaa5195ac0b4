#!/usr/bin/env bash
# `fathom export` of a GPT trained here, both ways: --hf writes config.json +
# model.safetensors (refused into the model's own or a non-empty directory), and
# the plain export writes the KV-cache decode graph as ONNX. With transformers
# installed, GPT2LMHeadModel loaded from the --hf directory gives the logits that
# `fathom run` gives on the ONNX file (prompt of 6 tokens, empty cache) within
# 1e-4 relative; without it that part is skipped (77) with the reason.
set -uo pipefail
bin=$1
. "$(dirname "$0")/cli_lib.sh"
cli_begin fathom_cli_export_hf
cli_tiny_gpt "$tmp/m" 40 "In the beginning God created the heaven and the earth"

expect 2 "no output directory" "$bin" export "$tmp/m" --hf
expect 2 "model's own directory" "$bin" export "$tmp/m" --hf -o "$tmp/m"
mkdir -p "$tmp/full" && echo x > "$tmp/full/keep"
expect 1 "is not empty" "$bin" export "$tmp/m" --hf -o "$tmp/full"
[[ $(ls "$tmp/full") == keep ]] && ok "the non-empty directory is unchanged" || bad "the non-empty directory changed"
expect 1 "" "$bin" export "$tmp/nonexistent" --hf -o "$tmp/x"
expect 0 "GPT2LMHeadModel" "$bin" export "$tmp/m" --hf -o "$tmp/hf"
[[ -s $tmp/hf/config.json && -s $tmp/hf/model.safetensors ]] && ok "config.json and model.safetensors written" ||
  bad "the --hf directory lacks its files"
expect 0 "graph nodes" "$bin" export "$tmp/m" -o "$tmp/m.onnx"
expect 0 "graph nodes" "$bin" export "$tmp/hf" -o "$tmp/hf.onnx"

# A Llama exported the same way, given a tokenizer.json (Llama 2's pipeline: <s>
# template, "▁" spaces, byte fallback): `fathom generate` reads it from the directory
# and streams text after the prompt; one with more tokens than vocab_size is refused.
sed -e 's/^arch = gpt2/arch = llama\nn_kv_head = 1/' -e 's/^n_layer = 2/n_layer = 1/' "$tmp/tiny.ini" > "$tmp/llama.ini"
"$bin" train "$tmp/llama.ini" --corpus "$tmp/corpus.txt" --out "$tmp/ml" --quiet > /dev/null 2> "$tmp/train.err" ||
  { echo "FAIL: training the tiny Llama"; cat "$tmp/train.err"; exit 1; }
expect 0 "LlamaForCausalLM" "$bin" export "$tmp/ml" --hf -o "$tmp/hfl"
tokjson() { # $1: the id of "▁hi" (an id past vocab_size makes the tokenizer too large)
  printf '%s' '{"added_tokens": [{"id": 0, "content": "<unk>", "normalized": false}, {"id": 1, "content": "<s>",
 "normalized": false}, {"id": 2, "content": "</s>", "normalized": false}],
 "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
 {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}, "pre_tokenizer": null,
 "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}],
 "special_tokens": {"<s>": {"id": "<s>", "ids": [1]}}},
 "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
 {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
 "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true, "vocab": {"<unk>": 0,
 "<s>": 1, "</s>": 2, "▁": 3, "h": 4, "i": 5, "▁h": 6, '
  for b in $(seq 0 247); do printf '"<0x%02X>": %d, ' "$b" $((7 + b)); done
  printf '"▁hi": %d}, "merges": ["▁ h", "▁h i"]}}' "$1"
}
tokjson 255 > "$tmp/hfl/tokenizer.json"
expect 0 "" "$bin" generate "$tmp/hfl" --prompt "hi hi" --tokens 4 --temperature 0 --quiet
out=$("$bin" generate "$tmp/hfl" --prompt "hi hi" --tokens 4 --temperature 0 --quiet 2>&1)
[[ $out == "hi hi"* ]] && ok "generate on a Llama directory with tokenizer.json echoes the prompt and continues" ||
  bad "generate with tokenizer.json printed: $out"
cp -r "$tmp/hfl" "$tmp/hfl_big"
tokjson 255 | sed 's/"▁hi": 255/"▁hi": 255, "x": 256, "y": 257/' > "$tmp/hfl_big/tokenizer.json"
expect 1 "the tokenizer has 258 tokens but config.json's vocab_size is 256" \
  "$bin" generate "$tmp/hfl_big" --prompt "hi" --tokens 2
printf '{"model": {"type": "BPE", ' > "$tmp/hfl_big/tokenizer.json"
expect 1 "tokenizer.json: line 1" "$bin" generate "$tmp/hfl_big" --prompt "hi" --tokens 2

# The Llama directory compiled and quantized (int4) into graphs that carry its
# tokenizer.json; generate runs them; fathom serve serves the directory itself and both
# graphs for text (the compiled graph's completion is the directory's).
expect 0 "" "$bin" compile "$tmp/hfl" -o "$tmp/hfl.graph"
expect 0 "" "$bin" quantize "$tmp/hfl" -o "$tmp/hfl.q4" --int4 -q
[[ -s $tmp/hfl.graph/tokenizer.json && -s $tmp/hfl.q4/tokenizer.json ]] && ok "the graphs carry the model's tokenizer.json" ||
  bad "a graph lacks tokenizer.json: $(ls "$tmp/hfl.graph" "$tmp/hfl.q4")"
g0=$("$bin" generate "$tmp/hfl" --prompt "hi hi" --tokens 6 --temperature 0 --quiet 2>&1)
g1=$("$bin" generate "$tmp/hfl.graph" --prompt "hi hi" --tokens 6 --temperature 0 --quiet 2>&1)
g2=$("$bin" generate "$tmp/hfl.q4" --prompt "hi hi" --tokens 6 --temperature 0 --quiet 2>&1)
[[ $g0 == "$g1" && $g2 == "hi hi"* ]] && ok "generate: the compiled graph gives the directory's text, int4 continues the prompt" ||
  bad "generate: directory '$g0', compiled '$g1', int4 '$g2'"
mkdir -p "$tmp/repo"
for m in hfl hfl.graph hfl.q4; do mkdir -p "$tmp/repo/$m"; cp -r "$tmp/$m" "$tmp/repo/$m/1"; done
"$bin" serve --model-repository "$tmp/repo" --port 0 --metrics-port 0 > /dev/null 2> "$tmp/serve.log" &
spid=$!
python3 - "$tmp/serve.log" <<'PY' > "$tmp/serve.out" 2>&1 && ok "served for text: $(tail -1 "$tmp/serve.out")" || bad "serving the Llama: $(cat "$tmp/serve.out") $(cat "$tmp/serve.log")"
import http.client, json, sys
sys.path.insert(0, "tests/serve")
from serve_port import port_of
log = sys.argv[1]
port = port_of(log)
def call(method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request(method, path, json.dumps(body) if body is not None else None)
    r = c.getresponse()
    return r.status, json.loads(r.read())
out = {}
for m in ("hfl", "hfl.graph", "hfl.q4"):
    st, j = call("GET", "/v2/models/" + m)
    assert st == 200 and j["platform"] == "fathom_gpt", (m, st, j)
    st, j = call("POST", "/v1/completions", {"model": m, "prompt": "hi hi", "max_tokens": 6, "temperature": 0})
    assert st == 200 and j["usage"]["completion_tokens"] == 6, (m, st, j)
    out[m] = j["choices"][0]["text"]
assert out["hfl"] == out["hfl.graph"], out
print("platform fathom_gpt, 6 tokens each, the compiled graph's text is the directory's: %r" % out)
PY
kill -TERM $spid; wait $spid; rc=$?
[[ $rc == 0 ]] && ok "the server drains and exits 0" || bad "serve exit $rc"

# End of sequence: the Llama with generation_config.json's eos_token_id (2, "</s>"), its
# compiled graph (which carries that file), served: a token forced to the end id by
# logit_bias ends the text there (finish_reason stop, the id counted, not shown) unless
# ignore_eos; stop_token_ids ends it the same way. Then `fathom generate` stops at the
# end id the greedy text starts with (found through the server's token-id prompts).
cp -r "$tmp/hfl" "$tmp/hfe"
echo '{"eos_token_id": [2], "bos_token_id": 1}' > "$tmp/hfe/generation_config.json"
# and a chat template of its own (Jinja, in tokenizer_config.json with its special tokens):
# chat renders through it (checked below against jinja2's rendering sent to completions);
# a copy whose template uses what fathom does not run (a macro) refuses chat, naming it
cat > "$tmp/hfe/tokenizer_config.json" <<'JSON'
{"bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": false}, "chat_template":
 "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}[{{ m.content|trim }}]\n{% else %}<{{ m.role[0] }}>{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"}
JSON
expect 0 "" "$bin" compile "$tmp/hfe" -o "$tmp/hfe.graph"
[[ -s $tmp/hfe.graph/generation_config.json && -s $tmp/hfe.graph/tokenizer_config.json ]] &&
  ok "the compiled graph carries generation_config.json and tokenizer_config.json" ||
  bad "no generation_config.json or tokenizer_config.json in the graph: $(ls "$tmp/hfe.graph")"
rm -rf "$tmp/repo2" && mkdir -p "$tmp/repo2/hfe" "$tmp/repo2/hfe-graph" "$tmp/repo2/hfe-chat" "$tmp/repo2/hfe-macro"
cp -r "$tmp/hfe" "$tmp/repo2/hfe/1" && cp -r "$tmp/hfe.graph" "$tmp/repo2/hfe-graph/1" && cp -r "$tmp/hfe" "$tmp/repo2/hfe-chat/1"
cp -r "$tmp/hfe" "$tmp/repo2/hfe-macro/1"
echo '{"chat_template": "{% macro turn(m) %}{{ m.content }}{% endmacro %}{% for m in messages %}{{ turn(m) }}{% endfor %}"}' > "$tmp/repo2/hfe-macro/1/tokenizer_config.json"
echo '{"text_generation": {"chat_template": {"system": "<|system|>{content}</s>", "user": "<|user|>{content}</s>",
  "assistant": "<|assistant|>{content}</s>", "generation": "<|assistant|>", "stop": "<|user|>"}}}' > "$tmp/repo2/hfe-chat/config.json"
"$bin" serve --model-repository "$tmp/repo2" --port 0 --metrics-port 0 > /dev/null 2> "$tmp/serve2.log" &
spid=$!
python3 - "$tmp/serve2.log" "$bin" "$tmp" <<'PY' > "$tmp/serve2.out" 2>&1 && ok "end of sequence: $(tail -1 "$tmp/serve2.out")" || bad "end of sequence: $(cat "$tmp/serve2.out") $(cat "$tmp/serve2.log")"
import http.client, json, os, subprocess, sys
sys.path.insert(0, "tests/serve")
from serve_port import port_of
log, bin_, tmp = sys.argv[1:4]
port = port_of(log)
def call(body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/v1/completions", json.dumps(body))
    r = c.getresponse()
    return r.status, json.loads(r.read())
for m in ("hfe", "hfe-graph"):
    base = {"model": m, "prompt": "hi hi", "max_tokens": 6, "temperature": 0}
    st, j = call(dict(base, logit_bias={"2": 100}))
    ch = j["choices"][0]
    assert st == 200 and ch["finish_reason"] == "stop" and ch["text"] == "" and j["usage"]["completion_tokens"] == 1, (m, j)
    st, j = call(dict(base, logit_bias={"2": 100}, ignore_eos=True))
    assert st == 200 and j["choices"][0]["finish_reason"] == "length" and j["usage"]["completion_tokens"] == 6, (m, j)
    st, j = call(dict(base, logit_bias={"5": 100}, stop_token_ids=[5]))
    assert st == 200 and j["choices"][0]["finish_reason"] == "stop" and j["choices"][0]["text"] == "", (m, j)
    st, j = call(dict(base, stop_token_ids=[999]))
    assert st == 400 and "stop_token_ids" in j["error"]["message"], (m, j)
def chat(body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/v1/chat/completions", json.dumps(body))
    r = c.getresponse()
    return r.status, json.loads(r.read())
# the model's own template: the same prompt as jinja2 renders it (as transformers' apply_chat_template
# does; the tokenizer adds <s> itself, so the rendered one goes), sent to completions
msgs = [{"role": "system", "content": " b "}, {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "hi"}]}]
try:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    tc = json.load(open(os.path.join(tmp, "hfe", "tokenizer_config.json")))
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    flat = [dict(m, content="\n".join(p["text"] for p in m["content"]) if isinstance(m["content"], list) else m["content"]) for m in msgs]
    ref = env.from_string(tc["chat_template"]).render(messages=flat, add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
    assert ref.startswith("<s>"), ref
    ref = ref[3:]
except ImportError:
    ref = None
for m in ("hfe", "hfe-graph"):
    st, j = chat({"model": m, "messages": msgs, "max_tokens": 2, "temperature": 0, "ignore_eos": True})
    assert st == 200, (m, st, j)
    if ref is not None:
        st2, k = call({"model": m, "prompt": ref, "max_tokens": 2, "temperature": 0, "ignore_eos": True, "stop": ["</s>"]})
        assert st2 == 200 and k["usage"]["prompt_tokens"] == j["usage"]["prompt_tokens"] and \
            k["choices"][0]["text"] == j["choices"][0]["message"]["content"], (m, ref, j, k)
st, j = chat({"model": "hfe-macro", "messages": msgs})
assert st == 400 and "'macro'" in j["error"]["message"] and "tokenizer_config.json" in j["error"]["message"], j
st, j = chat({"model": "hfe-chat", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
assert st == 200 and j["usage"]["completion_tokens"] >= 1, j
text = open(log).read()
assert "chat through the model's own template (tokenizer_config.json)" in text and "'macro' statements" in text, text
# the id greedy decoding starts with: the token-id prompt whose echo is that text
st, j = call({"model": "hfe", "prompt": "hi hi", "max_tokens": 1, "temperature": 0, "logprobs": 0, "ignore_eos": True})
first = j["choices"][0]["logprobs"]["tokens"][0]
ids = [i for i in range(3, 256) if call({"model": "hfe", "prompt": [i], "max_tokens": 1, "echo": True, "ignore_eos": True,
                                          "logit_bias": {"2": -100}})[1]["choices"][0]["text"].startswith(first) and first]
assert ids, ("no id reads", first)
d = os.path.join(tmp, "hfe1")
subprocess.run(["cp", "-r", os.path.join(tmp, "hfe"), d], check=True)
results = []
for i in ids[:6]:
    json.dump({"eos_token_id": i}, open(os.path.join(d, "generation_config.json"), "w"))
    p = subprocess.run([bin_, "generate", d, "--prompt", "hi hi", "--tokens", "4", "--temperature", "0"], capture_output=True, text=True)
    results.append((i, p.returncode, p.stdout, p.stderr))
    if p.returncode == 0 and p.stdout == "hi hi\n" and "end-of-sequence id %d" % i in p.stderr:
        break
else:
    raise AssertionError(("generate did not stop at the end id", first, results))
p = subprocess.run([bin_, "generate", d, "--prompt", "hi hi", "--tokens", "4", "--temperature", "0", "--ignore-eos"],
                   capture_output=True, text=True)
assert p.returncode == 0 and len(p.stdout) > len("hi hi\n") and "end-of-sequence" not in p.stderr, p
print("forced end id: stop with no text, ignore_eos and stop_token_ids work (directory and graph); chat through the "
      "model's Jinja template gives what completions give on jinja2's rendering (%s); a macro is refused by name; "
      "generate stops at id %d" % ("compared" if ref is not None else "jinja2 missing: not compared", i))
PY
kill -TERM $spid; wait $spid

py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
"$py" - "$tmp" <<'PY' > "$tmp/py.out" 2>&1
import sys
try:
    import numpy as np, torch
    from transformers import AutoModelForCausalLM
except ImportError as e:
    print(f"SKIP: needs numpy, torch and transformers ({e.name} missing)"); sys.exit(77)
d = sys.argv[1]
m = AutoModelForCausalLM.from_pretrained(f"{d}/hf").eval()
ids = np.array([[5, 17, 3, 99, 42, 7]], np.int64)
np.save(f"{d}/tokens.npy", ids)
c = m.config
for i in range(c.n_layer):
    for k in ("key", "value"):
        np.save(f"{d}/past_{k}.{i}.npy", np.zeros((1, c.n_head, 0, c.n_embd // c.n_head), np.float32))
with torch.no_grad():
    np.save(f"{d}/ref.npy", m(torch.from_numpy(ids)).logits.numpy())
print(type(m).__name__, c.n_layer)
PY
rc=$?
if [[ $rc == 77 ]]; then cat "$tmp/py.out"; cli_end cli_export_hf; exit 77; fi
if [[ $rc != 0 ]]; then bad "transformers could not load the --hf directory: $(tail -3 "$tmp/py.out")"; cli_end cli_export_hf; fi
grep -q "GPT2LMHeadModel 2" "$tmp/py.out" && ok "transformers loads it as GPT2LMHeadModel" || bad "loaded as: $(cat "$tmp/py.out")"
args=(--input "tokens=$tmp/tokens.npy")
for i in 0 1; do for k in key value; do args+=(--input "past_$k.$i=$tmp/past_$k.$i.npy"); done; done
for f in m hf; do
  "$bin" run "$tmp/$f.onnx" "${args[@]}" --output "$tmp/out_$f" > /dev/null 2> "$tmp/run.err" || bad "fathom run $f.onnx: $(cat "$tmp/run.err")"
done
"$py" - "$tmp" <<'PY' && ok "transformers' logits match fathom run on both ONNX exports" || bad "logits differ"
import sys, numpy as np
d = sys.argv[1]
ref = np.load(f"{d}/ref.npy")
for f in ("m", "hf"):
    got = np.load(f"{d}/out_{f}/logits.npy")
    rel = float(np.abs(got - ref).max() / np.abs(ref).max())
    print(f"{f}.onnx: max relative difference {rel:.3g}")
    if got.shape != ref.shape or not rel <= 1e-4:
        sys.exit(1)
PY
cli_end cli_export_hf
