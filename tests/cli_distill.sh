#!/usr/bin/env bash
# `fathom distill`: a CNN teacher trained here on synthetic images teaches an MLP
# student (--json reports its accuracy; the student directory evaluates as any
# model); usage errors exit 2 (no teacher or student, temperature <= 0, alpha
# outside [0, 1], unknown flag), a teacher that does not fit the student exits 1.
# Usage: bash tests/cli_distill.sh <path-to-fathom-binary>
set -uo pipefail
bin=${1:?usage: cli_distill.sh FATHOM_BIN}
. "$(dirname "$0")/cli_lib.sh"
cli_begin fathom_cli_distill

cli_images "$tmp" 128 64
for kind in teacher student wide; do
  cli_idx_data "$tmp" > "$tmp/$kind.ini"
  echo "[model]" >> "$tmp/$kind.ini"
  echo "input = 1 8 8" >> "$tmp/$kind.ini"
  case $kind in
    teacher) printf 'layer = conv2d 8 3 padding=1\nlayer = batchnorm2d\nlayer = relu\nlayer = maxpool2d 2\nlayer = flatten\nlayer = linear 4\n' ;;
    student) printf 'layer = flatten\nlayer = linear 8\nlayer = relu\nlayer = linear 4\n' ;;
    wide) printf 'layer = flatten\nlayer = linear 10\n' ;;
  esac >> "$tmp/$kind.ini"
  printf '[train]\nepochs = 2\nbatch = 32\nseed = 3\n[optimizer]\nname = adam\nlr = 0.01\n' >> "$tmp/$kind.ini"
done
"$bin" train "$tmp/teacher.ini" --out "$tmp/teacher" --quiet > /dev/null 2> "$tmp/train.err" || { echo "training the teacher failed"; cat "$tmp/train.err"; exit 1; }

expect 0 "usage: fathom distill" "$bin" distill --help
expect 2 "no --teacher" "$bin" distill --student "$tmp/student.ini"
expect 2 "no --student" "$bin" distill --teacher "$tmp/teacher"
expect 2 "--temperature must be positive" "$bin" distill --teacher "$tmp/teacher" --student "$tmp/student.ini" --temperature 0
expect 2 "--alpha must be in [0, 1]" "$bin" distill --teacher "$tmp/teacher" --student "$tmp/student.ini" --alpha 1.5
expect 2 "needs a number" "$bin" distill --teacher "$tmp/teacher" --student "$tmp/student.ini" --alpha x
expect 2 "unknown option" "$bin" distill --teacher "$tmp/teacher" --student "$tmp/student.ini" --temprature 2
expect 1 "predicts 4 classes but the student 10" "$bin" distill --teacher "$tmp/teacher" --student "$tmp/wide.ini" --out "$tmp/w" --quiet
expect 1 "no such model directory" "$bin" distill --teacher "$tmp/nothing" --student "$tmp/student.ini" --out "$tmp/w" --quiet
expect 1 "the teacher" "$bin" distill --teacher "$tmp/teacher" --student kjv-gpt --out "$tmp/w" --quiet
[[ ! -e $tmp/w ]] && ok "nothing written by the refused runs" || bad "$tmp/w was written"

out=$("$bin" distill --teacher "$tmp/teacher" --student "$tmp/student.ini" --steps 20 --out "$tmp/s" --json --quiet 2>&1) \
  && ok "distill ran" || bad "distill: $out"
python3 -c "import json,sys; j=json.loads(sys.argv[1]); assert j['steps']==20 and j['test_accuracy']>0.5 and j['alpha']==0.5 and j['temperature']==2, j" "$out" \
  && ok "json: steps, accuracy, temperature, alpha" || bad "json: $out"
expect 0 "test accuracy" "$bin" eval "$tmp/s" --quiet
# the same command again would replace that student: refused (nothing changes) unless --overwrite
sum_s=$(sha256sum "$tmp/s/model.safetensors")
expect 1 "distill: $tmp/s already holds a training run (" "$bin" distill --teacher "$tmp/teacher" --student "$tmp/student.ini" --steps 20 --out "$tmp/s" --quiet
[[ "$(sha256sum "$tmp/s/model.safetensors")" == "$sum_s" ]] && ok "the refused distill left the student as it was" || bad "the refused distill changed $tmp/s"
expect 0 "" "$bin" distill --teacher "$tmp/teacher" --student "$tmp/student.ini" --steps 10 --out "$tmp/s" --overwrite --quiet
[[ -d $tmp/s/ckpt/step-00000010 && ! -d $tmp/s/ckpt/step-00000020 ]] && ok "distill --overwrite replaced the earlier student" || bad "distill --overwrite: $(ls "$tmp/s/ckpt")"

# GPT students: per-token soft targets. A 2-layer teacher trained on a small corpus
# teaches a 1-layer student, which takes the teacher's tokenizer.
for i in $(seq 1 60); do echo "In the beginning the word was with the light, and the light shone $i times."; done > "$tmp/corpus.txt"
gpt_ini() { # name layers width block steps
  printf '[model]\ntype = gpt\narch = gpt2\nn_layer = %s\nn_head = 2\nn_embd = %s\nffn_hidden = %s\nblock_size = %s\n' \
    "$2" "$3" $(($3 * 4)) "$4"
  printf '[tokenizer]\nkind = char\n[data]\ncorpus = %s/corpus.txt\n[train]\nbatch_size = 4\nsteps = %s\n' "$tmp" "$5"
  printf 'lr = 3e-3\nwarmup = 2\neval_every = 10\neval_batches = 2\nckpt_every = 10\nlog_every = 10\nseed = 5\n'
}
gpt_ini t 2 32 32 60 > "$tmp/gt.ini"; gpt_ini s 1 16 32 12 > "$tmp/gs.ini"; gpt_ini l 1 16 64 12 > "$tmp/gl.ini"
"$bin" train "$tmp/gt.ini" --out "$tmp/gteacher" --quiet > /dev/null 2> "$tmp/gtrain.err" || { echo "training the GPT teacher failed"; cat "$tmp/gtrain.err"; exit 1; }
out=$("$bin" distill --teacher "$tmp/gteacher" --student "$tmp/gs.ini" --out "$tmp/gs" --alpha 0.7 --temperature 2 --json --quiet 2>&1) \
  && ok "GPT distill ran" || bad "GPT distill: $out"
python3 -c "import json,sys,math; j=json.loads(sys.argv[1]); assert j['steps']==12 and math.isfinite(j['val_loss']) and j['alpha']==0.7, j" "$out" \
  && ok "GPT json: steps, val_loss, alpha" || bad "GPT json: $out"
cmp -s "$tmp/gteacher/tokenizer.txt" "$tmp/gs/tokenizer.txt" && ok "the student took the teacher's tokenizer" || bad "tokenizers differ"
expect 0 "" "$bin" generate "$tmp/gs" --prompt "In the" --tokens 8 --seed 1
# alpha 0 is the hard labels alone: the same model, byte for byte, as fathom train
# (the char tokenizer of the same corpus is the teacher's)
"$bin" distill --teacher "$tmp/gteacher" --student "$tmp/gs.ini" --out "$tmp/g0" --alpha 0 --quiet > /dev/null 2>&1 &&
  "$bin" train "$tmp/gs.ini" --out "$tmp/gplain" --quiet > /dev/null 2>&1 &&
  cmp -s "$tmp/g0/model.safetensors" "$tmp/gplain/model.safetensors" \
  && ok "alpha 0: bitwise the plain GPT trainer's model" || bad "alpha 0 differs from fathom train"
# the soft targets change the student (so the teacher is really read)
cmp -s "$tmp/gs/model.safetensors" "$tmp/gplain/model.safetensors" && bad "alpha 0.7 equals plain training" || ok "alpha 0.7 differs from plain training"
expect 1 "reads at most 32 tokens (block_size)" "$bin" distill --teacher "$tmp/gteacher" --student "$tmp/gl.ini" --out "$tmp/gw" --quiet
mkdir -p "$tmp/gother" && cp "$tmp/gplain/tokens.bin" "$tmp/gother/" && echo junk > "$tmp/gother/tokenizer.txt"
expect 1 "is not the tokenizer" "$bin" distill --teacher "$tmp/gteacher" --student "$tmp/gs.ini" --out "$tmp/gother" --quiet
expect 1 "the teacher" "$bin" distill --teacher "$tmp/teacher" --student "$tmp/gs.ini" --out "$tmp/gw" --quiet
[[ ! -e $tmp/gw ]] && ok "nothing written by the refused GPT runs" || bad "$tmp/gw was written"
cli_end cli_distill
