#!/usr/bin/env bash
# `fathom serve` end to end: trains a tiny model on synthetic 8x8 images, lays out
# a model repository and runs tests/serve/serve_test.py against the real server on
# free loopback ports (KServe v2 endpoints with plain HTTP and, where installed,
# tritonclient; batching, queue limits, timeouts, metrics, hot reload, explicit
# control and the API key, malformed requests, SIGTERM drain).
# Usage: bash tests/cli_serve.sh <path-to-fathom-binary>
set -uo pipefail
bin=${1:?usage: cli_serve.sh FATHOM_BIN}
. "$(dirname "$0")/cli_lib.sh"
cli_begin fathom_serve
command -v python3 > /dev/null || { echo "SKIP: python3 not found (the serve test client is Python)"; exit 77; }
cli_images "$tmp" 128 32
cli_idx_recipe "$tmp" 1 "conv2d 4 3 padding=1" relu "maxpool2d 2" flatten "linear 4" > "$tmp/syn.ini"
if ! "$bin" train "$tmp/syn.ini" --out "$tmp/model" --no-eval > "$tmp/train.log" 2>&1; then
  echo "FAIL: could not train the test model: $(cat "$tmp/train.log")"; exit 1
fi
# a tiny GPT for the text-generation endpoints
python3 -c "import sys; open(sys.argv[1], 'w').write('in the beginning god created the heaven and the earth\n' * 30)" "$tmp/corpus.txt"
cat > "$tmp/gpt.ini" <<INI
[model]
type = gpt
n_layer = 1
n_head = 2
n_embd = 16
ffn_hidden = 32
block_size = 32
[tokenizer]
kind = bpe
vocab_size = 280
[data]
corpus = $tmp/corpus.txt
[train]
batch_size = 2
steps = 20
eval_every = 20
eval_batches = 1
ckpt_every = 20
INI
if ! "$bin" train "$tmp/gpt.ini" --out "$tmp/gpt" --quiet > "$tmp/train_gpt.log" 2>&1; then
  echo "FAIL: could not train the test GPT: $(cat "$tmp/train_gpt.log")"; exit 1
fi
rm -rf "$tmp/gpt/ckpt"
# one of width 32 (int4's groups are 32 wide), compiled and quantized, for serving graphs as text models
sed -e 's/^n_embd = 16/n_embd = 32/' -e 's/^ffn_hidden = 32/ffn_hidden = 64/' "$tmp/gpt.ini" > "$tmp/gpt32.ini"
g32=$tmp/gpt32
if ! { "$bin" train "$tmp/gpt32.ini" --out "$g32" --quiet && rm -rf "$g32/ckpt" && "$bin" compile "$g32" -o "$g32.graph" &&
       "$bin" quantize "$g32" -o "$g32.q4" --int4 -q && "$bin" quantize "$g32" -o "$g32.q4m" --int4 --with-min -q &&
       "$bin" quantize "$g32" -o "$g32.q8" --int8 --dynamic -q; } > "$tmp/gpt32.log" 2>&1; then
  echo "FAIL: could not make the GPT graphs: $(cat "$tmp/gpt32.log")"; exit 1
fi
# the GPU run's serving smoke script (tools/gpu-check-serve.sh), here on the check device
if smoke=$(bash "$(dirname "$0")/../tools/gpu-check-serve.sh" "$bin" "$tmp/model" check "$tmp/gserve" 2>&1) &&
   [[ $(tail -1 <<<"$smoke") == "serve smoke: pass"* ]]; then
  echo "ok: tools/gpu-check-serve.sh on check: $(tail -1 <<<"$smoke")"
else
  echo "FAIL: tools/gpu-check-serve.sh on check: $smoke"; exit 1
fi
exec python3 "$(dirname "$0")/serve/serve_test.py" "$bin" "$tmp/model" "$tmp"
