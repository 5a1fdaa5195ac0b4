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
expect 1 "is a GPT recipe" "$bin" distill --teacher "$tmp/teacher" --student kjv-gpt --out "$tmp/w" --quiet
[[ ! -e $tmp/w ]] && ok "nothing written by the refused runs" || bad "$tmp/w was written"

out=$("$bin" distill --teacher "$tmp/teacher" --student "$tmp/student.ini" --steps 20 --out "$tmp/s" --json --quiet 2>&1) \
  && ok "distill ran" || bad "distill: $out"
python3 -c "import json,sys; j=json.loads(sys.argv[1]); assert j['steps']==20 and j['test_accuracy']>0.5 and j['alpha']==0.5 and j['temperature']==2, j" "$out" \
  && ok "json: steps, accuracy, temperature, alpha" || bad "json: $out"
expect 0 "test accuracy" "$bin" eval "$tmp/s" --quiet
cli_end cli_distill
