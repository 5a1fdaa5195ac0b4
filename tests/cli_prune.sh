#!/usr/bin/env bash
# `fathom prune`: a small CNN trained here on synthetic images is pruned
# unstructured (masks written, exact zero count) and by channels (a smaller
# model whose recipe names the new sizes); the results run through eval,
# predict and compile (the compiled graph gives the pruned model's accuracy),
# fine-tuning keeps the masks and a later `train --resume` too; bad input
# (sparsity outside [0, 1), -o over the input or over files, a broken GPT
# directory, heads of a classifier, no -o) is refused with its reason, exit 2 for
# usage, and nothing is written. GPT directories (GPT-2 and a Llama with grouped-
# query attention) lose half their heads or MLP neurons: the smaller model
# generates, compiles to a graph that generates the same greedy text, fine-tunes
# with the GPT trainer and resumes; what a GPT cannot take is refused.
# Usage: bash tests/cli_prune.sh <path-to-fathom-binary>
set -uo pipefail
bin=${1:?usage: cli_prune.sh FATHOM_BIN}
. "$(dirname "$0")/cli_lib.sh"
cli_begin fathom_cli_prune
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python

cli_images "$tmp" 128 64
# two convs: the second one's inputs shrink with the first
cli_idx_recipe "$tmp" 2 "conv2d 8 3 padding=1" batchnorm2d relu "maxpool2d 2" "conv2d 8 3 padding=1" batchnorm2d relu flatten "linear 16" relu "linear 4" > "$tmp/syn.ini"
"$bin" train "$tmp/syn.ini" --out "$tmp/cnn" > /dev/null 2> "$tmp/train.err" || { echo "training the CNN failed"; cat "$tmp/train.err"; exit 1; }

# ---- usage and bad input: nothing written ----
expect 0 "usage: fathom prune" "$bin" prune --help
expect 2 "no output directory" "$bin" prune "$tmp/cnn" --sparsity 0.5
expect 2 "--sparsity S is required" "$bin" prune "$tmp/cnn" -o "$tmp/x"
for s in 1 1.0 -0.1 nan abc 2; do
  expect 2 "fraction in [0, 1)" "$bin" prune "$tmp/cnn" --sparsity "$s" -o "$tmp/x"
done
expect 1 "prunes the attention heads of a GPT" "$bin" prune "$tmp/cnn" --sparsity 0.5 --structured heads -o "$tmp/x"
expect 2 "takes 'channels'" "$bin" prune "$tmp/cnn" --sparsity 0.5 --structured rows -o "$tmp/x"
expect 2 "unknown option" "$bin" prune "$tmp/cnn" --sparsity 0.5 -o "$tmp/x" --sparsty 3
expect 1 "is the input model" "$bin" prune "$tmp/cnn" --sparsity 0.5 -o "$tmp/cnn"
expect 1 "not an empty directory" "$bin" prune "$tmp/cnn" --sparsity 0.5 -o "$tmp/cnn/ckpt"
expect 1 "no such model directory" "$bin" prune "$tmp/nothing" --sparsity 0.5 -o "$tmp/x"
mkdir -p "$tmp/gpt" && echo '{}' > "$tmp/gpt/config.json"
expect 1 "GPT model" "$bin" prune "$tmp/gpt" --sparsity 0.5 -o "$tmp/x"
[[ ! -e $tmp/x ]] && ok "nothing written by the refused runs" || bad "$tmp/x was written"
ls "$tmp" | grep -q '\.tmp\.' && bad "a temporary directory was left: $(ls "$tmp")" || ok "no temporary directory left"

# ---- unstructured: masks and exact zeros ----
out=$("$bin" prune "$tmp/cnn" --sparsity 0.5 -o "$tmp/sparse" 2>&1) && ok "unstructured prune" || bad "unstructured: $out"
[[ -f $tmp/sparse/model.safetensors && -f $tmp/sparse/prune_masks.safetensors && -f $tmp/sparse/recipe.ini ]] \
  && ok "sparse directory: model, masks, recipe" || bad "sparse files: $(ls "$tmp/sparse")"
$py - "$tmp/sparse" <<'PY' 2>/dev/null; rc=$?
import sys
from safetensors.numpy import load_file
d = sys.argv[1]
w = load_file(f"{d}/model.safetensors"); m = load_file(f"{d}/prune_masks.safetensors")
assert sorted(m) == ["0.weight", "10.weight", "4.weight", "8.weight"], sorted(m)
n = sum(m[k].size for k in m); z = sum(int((m[k] == 0).sum()) for k in m)
assert z == round(0.5 * n), (z, n)
for k in m: assert ((w[k] == 0) | (m[k] == 1)).all()
PY
case $rc in 0) ok "masks: half of all weights, each masked weight zero";; *) if $py -c "import safetensors" 2>/dev/null; then bad "mask check"; else echo "skip: no safetensors module"; fi;; esac

# ---- channels: a smaller model; eval, predict and compile take it ----
out=$("$bin" prune "$tmp/cnn" --sparsity 0.5 --structured channels -o "$tmp/small" 2>&1) && ok "channel prune" || bad "channels: $out"
[[ $out == *"parameters: "* && $out == *"channels"* ]] && ok "report printed" || bad "report: $out"
grep -q "layer = conv2d 4 3 padding=1.*pruned: was conv2d 8 3 padding=1" "$tmp/small/recipe.ini" && ok "recipe names the new sizes" \
  || bad "recipe: $(cat "$tmp/small/recipe.ini")"
[[ ! -e $tmp/small/prune_masks.safetensors ]] && ok "no masks for channels" || bad "channels wrote masks"
e1=$("$bin" eval "$tmp/small" --json --quiet 2>&1) || bad "eval of the pruned model: $e1"
expect 0 "" "$bin" compile "$tmp/small" -o "$tmp/small.graph"
e2=$("$bin" eval "$tmp/small.graph" --json --quiet 2>&1) || bad "eval of the compiled pruned model: $e2"
python3 -c "import json,sys; a=json.loads(sys.argv[1]); b=json.loads(sys.argv[2]); assert a['test_accuracy']==b['test_accuracy'] and abs(a['test_loss']-b['test_loss'])<1e-4*(1+a['test_loss']), (a,b)" "$e1" "$e2" \
  && ok "the compiled pruned model gives its accuracy and loss" || bad "eval differs: $e1 / $e2"
expect 0 "class" "$bin" predict "$tmp/small" "$tmp/test-images" --json
expect 1 "unstructured masks" "$bin" prune "$tmp/sparse" --sparsity 0.5 --structured channels -o "$tmp/y"

# ---- fine-tuning keeps the masks, and so does a later resume ----
out=$("$bin" prune "$tmp/cnn" --sparsity 0.7 --finetune 6 --quiet -o "$tmp/ft" 2>&1) && ok "prune --finetune" || bad "finetune: $out"
[[ $out == *"fine-tuned 6 steps: test accuracy"* ]] && ok "fine-tuning reports accuracy" || bad "finetune output: $out"
expect 0 "" "$bin" train "$tmp/ft/recipe.ini" --resume "$tmp/ft" --steps 10 --quiet
$py - "$tmp/ft" "$tmp/cnn" <<'PY' 2>/dev/null; rc=$?
import sys
from safetensors.numpy import load_file
ft, base = sys.argv[1:]
w = load_file(f"{ft}/model.safetensors"); m = load_file(f"{ft}/prune_masks.safetensors"); w0 = load_file(f"{base}/model.safetensors")
for k in m:
    assert (w[k][m[k] == 0] == 0).all(), k
    assert (w[k][m[k] == 1] != w0[k][m[k] == 1]).mean() > 0.5, k
PY
case $rc in 0) ok "after fine-tuning and resume: masked weights zero, the rest trained";; *) if $py -c "import safetensors" 2>/dev/null; then bad "masks after resume"; else echo "skip: no safetensors module"; fi;; esac

# ---- GPT: heads and MLP neurons ----
cli_tiny_gpt "$tmp/gpt2" 60 "And the LORD spake unto Moses, saying, Speak unto the children of Israel"
sed -e 's/n_head = 2/n_head = 4/' -e 's/arch = gpt2/arch = llama\nn_kv_head = 2/' -e "s|^steps = 3|steps = 3|" "$tmp/tiny.ini" > "$tmp/llama.ini"
"$bin" train "$tmp/llama.ini" --out "$tmp/llama" --quiet > /dev/null 2> "$tmp/ltrain.err" || { echo "training the Llama failed"; cat "$tmp/ltrain.err"; exit 1; }
for m in gpt2 llama; do
  out=$("$bin" prune "$tmp/$m" --sparsity 0.5 --structured heads -o "$tmp/$m-h" 2>&1) && ok "$m: heads pruned" || bad "$m heads: $out"
  [[ $out == *"attention heads"* && $out == *"parameters: "* ]] && ok "$m: head report" || bad "$m head report: $out"
  want=$([[ $m == gpt2 ]] && echo '1 1 16' || echo '2 1 8')
  got=$(python3 -c "import json,sys; c=json.load(open(sys.argv[1])); print(c['n_head'], c['n_kv_head'], c['head_dim'])" "$tmp/$m-h/config.json")
  [[ $got == "$want" ]] && ok "$m: config n_head n_kv_head head_dim = $got" || bad "$m: config $got, want $want"
  expect 0 "" "$bin" prune "$tmp/$m" --sparsity 0.5 --structured channels -o "$tmp/$m-c"
  python3 -c "import json,sys; assert json.load(open(sys.argv[1]))['ffn_hidden']==32" "$tmp/$m-c/config.json" \
    && ok "$m: ffn_hidden 64 -> 32" || bad "$m: ffn_hidden"
  cmp -s "$tmp/$m/tokenizer.txt" "$tmp/$m-h/tokenizer.txt" && ok "$m: tokenizer kept" || bad "$m: tokenizer"
  for v in h c; do
    expect 0 "" "$bin" compile "$tmp/$m-$v" -o "$tmp/$m-$v.graph"
    a=$("$bin" generate "$tmp/$m-$v" --prompt "And the" --tokens 10 --temperature 0 --quiet 2>&1)
    b=$("$bin" generate "$tmp/$m-$v.graph" --prompt "And the" --tokens 10 --temperature 0 --quiet 2>&1)
    [[ -n $a && $a == "$b" ]] && ok "$m-$v: the compiled pruned GPT gives its greedy text" || bad "$m-$v generate: '$a' vs '$b'"
  done
done
out=$("$bin" prune "$tmp/gpt2" --sparsity 0.5 --structured heads --finetune 4 --batch 2 --seed 3 --quiet -o "$tmp/gpt2-ft" 2>&1) \
  && ok "GPT prune --finetune" || bad "GPT finetune: $out"
[[ $out == *"fine-tuned 4 steps: validation loss"* ]] && ok "GPT fine-tuning reports its validation loss" || bad "GPT finetune output: $out"
! cmp -s "$tmp/gpt2-h/model.safetensors" "$tmp/gpt2-ft/model.safetensors" && ok "fine-tuning changed the pruned weights" || bad "fine-tuning changed nothing"
# resuming takes a recipe of the pruned shape (head_dim is a recipe key); the original's is refused
expect 1 "has shape" "$bin" train "$tmp/tiny.ini" --resume "$tmp/gpt2-ft" --steps 6 --quiet
sed -e 's/n_head = 2/n_head = 1\nhead_dim = 16/' "$tmp/tiny.ini" > "$tmp/tiny-h.ini"
expect 0 "" "$bin" train "$tmp/tiny-h.ini" --resume "$tmp/gpt2-ft" --steps 6 --seed 3 --batch 2 --quiet
rm "$tmp/gpt2-h/tokens.bin"
expect 1 "--finetune needs" "$bin" prune "$tmp/gpt2-h" --sparsity 0.5 --structured heads --finetune 2 -o "$tmp/g"
expect 1 "unstructured pruning of GPT models is not built" "$bin" prune "$tmp/gpt2" --sparsity 0.5 -o "$tmp/g"
expect 1 "--global is not possible for a GPT" "$bin" prune "$tmp/gpt2" --sparsity 0.5 --structured heads --global -o "$tmp/g"
[[ ! -e $tmp/g ]] && ok "nothing written by the refused GPT prunes" || bad "$tmp/g was written"

cli_end cli_prune
