#!/usr/bin/env bash
# `fathom compile` and graph directories through predict, eval and generate: a
# tiny CNN trained here on synthetic images and a tiny GPT on a small corpus are
# compiled (the report names each pass and the memory plan); the graph gives the
# trained model's predictions, accuracy and greedy text; bad input (no -o, a
# directory that is no model, a corrupt graph.json, a graph of the wrong kind,
# an output path holding something else) is refused with its reason and leaves
# nothing behind.
# Usage: bash tests/cli_compile.sh <path-to-fathom-binary>
set -uo pipefail
bin=${1:?usage: cli_compile.sh FATHOM_BIN}
. "$(dirname "$0")/cli_lib.sh"
cli_begin fathom_cli_compile

cli_images "$tmp" 128 64
cli_idx_recipe "$tmp" 2 "conv2d 4 3 padding=1" batchnorm2d relu "maxpool2d 2" flatten "linear 4" > "$tmp/syn.ini"
"$bin" train "$tmp/syn.ini" --out "$tmp/cnn" > /dev/null 2> "$tmp/train.err" || { echo "training the CNN failed"; cat "$tmp/train.err"; exit 1; }

# ---- usage ----
expect 0 "usage: fathom compile" "$bin" compile --help
expect 2 "no output directory" "$bin" compile "$tmp/cnn"
expect 2 "no model directory" "$bin" compile -o "$tmp/x"
expect 2 "unknown or incomplete option" "$bin" compile "$tmp/cnn" -o "$tmp/x" --bogus

# ---- the CNN: compile with a report, then eval and predict run the graph ----
expect 0 "fuse-conv-bn" "$bin" compile "$tmp/cnn" -o "$tmp/cnn.graph" --report
out=$("$bin" compile "$tmp/cnn" -o "$tmp/cnn.graph2" --report 2>&1)
[[ $out == *"1 batch norms folded"* && $out == *"planned arena"* && $out == *"a CPU run: "*" block + "*" outputs"* && $out == *"max relative difference"* ]] \
  && ok "report" || bad "report: $out"
[[ -f $tmp/cnn.graph/graph.json && -f $tmp/cnn.graph/weights.safetensors ]] && ok "graph directory written" || bad "no graph files"
python3 -c "import json,sys; g=json.load(open(sys.argv[1])); assert g['format']=='fathom-graph' and g['inputs'][0]['shape'][0]=='batch'; assert not any(n['op']=='batch_norm' for n in g['nodes'])" \
  "$tmp/cnn.graph/graph.json" && ok "graph.json readable, batch dynamic, batch norm folded" || bad "graph.json content"
e1=$("$bin" eval "$tmp/cnn" --json --quiet 2>&1) && e2=$("$bin" eval "$tmp/cnn.graph" --json --quiet 2>&1) || bad "eval failed: $e1 $e2"
python3 -c "import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); assert a['test_accuracy']==b['test_accuracy'] and abs(a['test_loss']-b['test_loss'])<1e-4*(1+a['test_loss']), (a,b)" "$e1" "$e2" \
  && ok "eval: the graph gives the model's accuracy and loss" || bad "eval differs: $e1 / $e2"
p1=$("$bin" predict "$tmp/cnn" "$tmp/test-images" --json 2>&1) && p2=$("$bin" predict "$tmp/cnn.graph" "$tmp/test-images" --json 2>&1) || bad "predict failed: $p2"
python3 -c "import json,sys; a=json.loads(sys.argv[1])['predictions']; b=json.loads(sys.argv[2])['predictions']; assert len(a)==64 and [x['class'] for x in a]==[x['class'] for x in b]" "$p1" "$p2" \
  && ok "predict: the graph gives the model's classes" || bad "predict differs"
expect 0 "" "$bin" compile "$tmp/cnn.graph" -o "$tmp/cnn.graph" # a graph recompiles, in place
# --precision: eval and predict autocast a trained model's forward (bf16: the mixed products);
# a graph runs in the precision it was compiled in, so it is refused there
e3=$("$bin" eval "$tmp/cnn" --precision bf16 --json --quiet 2>&1) || bad "eval --precision bf16 failed: $e3"
python3 -c "import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); assert a['precision']=='fp32' and b['precision']=='bf16' and abs(a['test_accuracy']-b['test_accuracy'])<=2/64 and abs(a['test_loss']-b['test_loss'])<2e-2*(1+a['test_loss']), (a,b)" "$e1" "$e3" \
  && ok "eval --precision bf16: the model's accuracy and loss within bf16 rounding" || bad "eval bf16 differs: $e1 / $e3"
p3=$("$bin" predict "$tmp/cnn" "$tmp/test-images" --precision bf16 --json 2>&1) || bad "predict --precision bf16 failed: $p3"
python3 -c "import json,sys; a=json.loads(sys.argv[1])['predictions']; b=json.loads(sys.argv[2]); assert b['precision']=='bf16' and sum(x['class']==y['class'] for x,y in zip(a,b['predictions']))>=62, b" "$p1" "$p3" \
  && ok "predict --precision bf16: the model's classes" || bad "predict bf16 differs: $p3"
expect 2 "runs in the precision it was compiled or quantized in" "$bin" eval "$tmp/cnn.graph" --precision bf16
expect 2 "runs in the precision it was compiled or quantized in" "$bin" predict "$tmp/cnn.graph" "$tmp/one.png" --precision fp16
expect 0 "test accuracy" "$bin" eval "$tmp/cnn.graph" --precision fp32 --quiet
expect 2 "--precision fp8: expected fp32, bf16 or fp16" "$bin" eval "$tmp/cnn" --precision fp8
expect 2 "--precision (missing): expected fp32, bf16 or fp16" "$bin" predict "$tmp/cnn" "$tmp/one.png" --precision

# ---- the GPT: compile, then generate from the graph (greedy: the same text) ----
cli_tiny_gpt "$tmp/gpt" 40 "And the LORD spake unto Moses, saying, Speak unto the children of Israel"
expect 0 "fuse-add-layer-norm" "$bin" compile "$tmp/gpt" -o "$tmp/gpt.graph" --report
a=$("$bin" generate "$tmp/gpt" --prompt "And the" --tokens 10 --temperature 0 --quiet 2>&1)
b=$("$bin" generate "$tmp/gpt.graph" --prompt "And the" --tokens 10 --temperature 0 --quiet 2>&1)
[[ -n $a && $a == "$b" ]] && ok "generate: the graph gives the model's greedy text" || bad "generate differs: '$a' vs '$b'"
expect 1 "not a GPT graph" "$bin" generate "$tmp/cnn.graph" --prompt "x" --tokens 2
# an f16 KV cache (--kv-cache f16): the greedy text of this small model is the f32 cache's
c=$("$bin" generate "$tmp/gpt.graph" --prompt "And the" --tokens 10 --temperature 0 --quiet --kv-cache f16 2>&1)
[[ -n $c && $c == "$b" ]] && ok "generate --kv-cache f16: the f32 cache's greedy text" || bad "generate --kv-cache f16 differs: '$c' vs '$b'"
expect 0 "f16 KV cache" "$bin" generate "$tmp/gpt.graph" --prompt "And the" --tokens 3 --kv-cache f16
expect 2 "is for compiled graphs" "$bin" generate "$tmp/gpt" --prompt "x" --tokens 2 --kv-cache f16
expect 2 "--kv-cache takes f32 or f16, got 'q8'" "$bin" generate "$tmp/gpt.graph" --prompt "x" --tokens 2 --kv-cache q8
# eval: the graph gives the model's loss on a text; without one a graph has no token file
expect 1 "give a text to evaluate on with --text FILE" "$bin" eval "$tmp/gpt.graph"
l1=$("$bin" eval "$tmp/gpt" --text "$tmp/corpus.txt" --json --quiet 2>&1) && l2=$("$bin" eval "$tmp/gpt.graph" --text "$tmp/corpus.txt" --json --quiet 2>&1) \
  || bad "GPT eval failed: $l1 / $l2"
python3 -c "import json,sys,math; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); assert a['kind']=='gpt' and a['tokens']==b['tokens']>0 and abs(a['loss']-b['loss'])<1e-4*a['loss'] and abs(a['perplexity']-math.exp(a['loss']))<1e-9*a['perplexity'], (a,b)" "$l1" "$l2" \
  && ok "eval: the GPT graph gives the model's loss and perplexity" || bad "GPT eval differs: $l1 / $l2"
expect 0 "perplexity" "$bin" eval "$tmp/gpt" --quiet --val-fraction 0.5
l3=$("$bin" eval "$tmp/gpt" --text "$tmp/corpus.txt" --precision bf16 --json --quiet 2>&1) || bad "GPT eval bf16 failed: $l3"
python3 -c "import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); assert b['precision']=='bf16' and a['tokens']==b['tokens'] and abs(a['loss']-b['loss'])<1e-2*a['loss'], (a,b)" "$l1" "$l3" \
  && ok "eval --precision bf16: the GPT's loss within 1%" || bad "GPT eval bf16 differs: $l1 / $l3"
# the graph on its model's held-out tokens (--tokens): the model's own figure
l1=$("$bin" eval "$tmp/gpt" --json --quiet 2>&1) && l2=$("$bin" eval "$tmp/gpt.graph" --tokens "$tmp/gpt/tokens.bin" --json --quiet 2>&1) \
  || bad "GPT eval on tokens failed: $l1 / $l2"
python3 -c "import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); assert a['tokens']==b['tokens']>0 and abs(a['loss']-b['loss'])<1e-4*a['loss'], (a,b)" "$l1" "$l2" \
  && ok "eval --tokens: the graph on the model's held-out split gives the model's loss" || bad "eval --tokens differs: $l1 / $l2"
# the graph is read once: eval looked at its meta (a GPT?), then opened it again to run it
if command -v strace > /dev/null; then
  # LeakSanitizer cannot run under ptrace (an ASan build aborts at exit under strace): leaks are checked
  # by every other run of this test, so these two counting runs turn only it off
  asan_before=${ASAN_OPTIONS-}
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
  strace -f -e trace=openat -o "$tmp/strace.txt" "$bin" eval "$tmp/gpt.graph" --tokens "$tmp/gpt/tokens.bin" --quiet \
    > /dev/null 2>&1 || bad "eval of the GPT graph under strace"
  n=$(grep -c 'gpt\.graph/weights\.safetensors"' "$tmp/strace.txt")
  [ "$n" = 1 ] && ok "eval of a GPT graph opens its weights once" || bad "eval of a GPT graph opened its weights $n times"
  strace -f -e trace=openat -o "$tmp/strace.txt" "$bin" eval "$tmp/cnn.graph" --quiet > /dev/null 2>&1 ||
    bad "eval of the CNN graph under strace"
  n=$(grep -c 'cnn\.graph/weights\.safetensors"' "$tmp/strace.txt")
  [ "$n" = 1 ] && ok "eval of a classifier graph opens its weights once" || bad "eval of a classifier graph opened its weights $n times"
  export ASAN_OPTIONS="$asan_before"
else
  echo "SKIP: how often eval opens a graph (strace is not installed)"
fi
expect 2 "not both" "$bin" eval "$tmp/gpt" --text "$tmp/corpus.txt" --tokens "$tmp/gpt/tokens.bin"
expect 2 "--val-fraction needs a fraction in (0, 1)" "$bin" eval "$tmp/gpt" --val-fraction 1.5
expect 2 "--text is for GPT models" "$bin" eval "$tmp/cnn" --text "$tmp/corpus.txt"
printf 'tiny' > "$tmp/short.txt"
expect 1 "too few for one window" "$bin" eval "$tmp/gpt" --text "$tmp/short.txt"
expect 1 "cannot open the text" "$bin" eval "$tmp/gpt" --text "$tmp/nothing.txt"

# ---- bad input ----
mkdir -p "$tmp/empty"
expect 1 "not a model directory" "$bin" compile "$tmp/empty" -o "$tmp/y"
[[ ! -e $tmp/y ]] && ok "nothing written for a bad model" || bad "$tmp/y written"
expect 1 "not a graph directory" "$bin" compile "$tmp/cnn" -o "$tmp/gpt"
[[ -f $tmp/gpt/model.safetensors && ! -e $tmp/gpt/graph.json ]] && ok "a model directory is not overwritten" || bad "model directory changed"
cp -r "$tmp/cnn.graph" "$tmp/broken"
sed -i 's/"op": "linear[a-z_]*"/"op": "relu6"/' "$tmp/broken/graph.json" # an op name no graph knows
expect 1 "unknown op 'relu6'" "$bin" eval "$tmp/broken"
expect 1 "unknown op 'relu6'" "$bin" compile "$tmp/broken" -o "$tmp/z"
ls "$tmp" | grep -q '\.tmp\.' && bad "temporary directories left behind" || ok "no temporary directories left"

cli_end cli_compile
