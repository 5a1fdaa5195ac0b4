#!/usr/bin/env bash
# Crash safety of the outputs fathom writes besides training checkpoints (those:
# tests/cli_crash_safety.sh): compile and quantize (a graph directory replacing
# an earlier one), prune (a new directory; with --finetune, trained into it),
# export (an ONNX file replacing an earlier one; --hf, a new directory), distill
# (a student trained into a directory holding an earlier student) and run
# --output (an ONNX model's two outputs over an earlier run's three).
# FATHOM_FAULT makes the N-th write or rename kill the process or fail with EIO,
# for every N the command reaches. After each fault the output must be exactly
# the earlier one (absent where there was none) or exactly the complete new one,
# never a mixture; an EIO must name the output; and the next run, without a
# fault, must end with the reference output and no temporary left (the dead
# process's are swept). Graph directories also go through the fallback commit
# (FATHOM_TEST_NO_EXCHANGE=1: the old directory moved aside, then the new one
# renamed), where a kill between the two renames leaves no output until the
# next run puts the old one back.
# Usage: bash tests/cli_crash_outputs.sh <path-to-fathom-binary>
set -uo pipefail
bin=${1:?usage: cli_crash_outputs.sh FATHOM_BIN}
. "$(dirname "$0")/cli_lib.sh"
cli_begin fathom_crash_outputs
# on a tmpfs where there is one: fsync costs nothing there, and the test runs
# several hundred commands (it checks the order of the steps, not the disk)
if [[ -d /dev/shm && -w /dev/shm ]] && shm=$(mktemp -d /dev/shm/fathom_crash_outputs.XXXXXX); then
  rm -rf "$tmp"
  tmp=$shm
  trap "rm -rf '$tmp'" EXIT
fi

# ---- fixtures: two small classifiers, a teacher, a tiny GPT ----
cli_images "$tmp" 64 32
for k in a b; do
  cli_idx_data "$tmp" > "$tmp/$k.ini"
  printf '[model]\ninput = 1 8 8\nlayer = conv2d 4 3 padding=1\nlayer = relu\nlayer = flatten\nlayer = linear 8\nlayer = relu\nlayer = linear 4\n' >> "$tmp/$k.ini"
  printf '[train]\nepochs = 1\nbatch = 32\nseed = %s\n[optimizer]\nname = adam\nlr = 0.01\n' "$([[ $k == a ]] && echo 1 || echo 2)" >> "$tmp/$k.ini"
  "$bin" train "$tmp/$k.ini" --out "$tmp/model-$k" --quiet > /dev/null 2> "$tmp/train.err" || { echo "FAIL: training $k"; cat "$tmp/train.err"; exit 1; }
done
cli_idx_data "$tmp" > "$tmp/student.ini"
printf '[model]\ninput = 1 8 8\nlayer = flatten\nlayer = linear 8\nlayer = relu\nlayer = linear 4\n[train]\nepochs = 1\nbatch = 32\nseed = 3\n[optimizer]\nname = adam\nlr = 0.01\n' >> "$tmp/student.ini"
for i in $(seq 1 20); do echo "In the beginning God created the heaven and the earth $i."; done > "$tmp/corpus.txt"
printf '[model]\ntype = gpt\narch = gpt2\nn_layer = 1\nn_head = 2\nn_embd = 16\nffn_hidden = 32\nblock_size = 16\n[tokenizer]\nkind = byte\n[train]\nbatch_size = 2\nsteps = 1\nwarmup = 1\neval_every = 1\neval_batches = 1\nckpt_every = 1\nlog_every = 1\n' > "$tmp/gpt.ini"
"$bin" train "$tmp/gpt.ini" --corpus "$tmp/corpus.txt" --out "$tmp/gpt" --quiet > /dev/null 2> "$tmp/train.err" ||
  { echo "FAIL: training the GPT"; cat "$tmp/train.err"; exit 1; }

# ONNX runs (`fathom run --output`): Split into two outputs over an earlier run's three, whose third file must go
# with the rest (Debian's libonnx-testdata)
onnx_node=/usr/share/libonnx-testdata/data/node
have_onnx_cases=0
[[ -f $onnx_node/test_split_equal_parts_1d/model.onnx && -f $onnx_node/test_split_variable_parts_1d/model.onnx ]] && have_onnx_cases=1

# ---- the writers: W_NAME OUT writes the new output; P_NAME OUT the earlier one ----
W_compile() { "$bin" compile "$tmp/model-b" -o "$1"; }
P_compile() { "$bin" compile "$tmp/model-a" -o "$1"; }
W_quantize() { "$bin" quantize "$tmp/model-b" -o "$1" --int8 --dynamic --quiet; }
P_quantize() { "$bin" quantize "$tmp/model-a" -o "$1" --int8 --dynamic --quiet; }
W_prune() { "$bin" prune "$tmp/model-b" --sparsity 0.5 -o "$1"; }
P_prune() { :; } # prune writes only new directories
W_prune_finetune() { "$bin" prune "$tmp/model-b" --sparsity 0.5 --finetune 2 --quiet -o "$1"; }
P_prune_finetune() { :; }
W_export_onnx() { "$bin" export "$tmp/model-b" -o "$1"; }
P_export_onnx() { "$bin" export "$tmp/model-a" -o "$1"; }
W_export_hf() { "$bin" export "$tmp/gpt" --hf -o "$1"; }
P_export_hf() { :; }
# a student (2 steps, one checkpoint) into a directory holding another one (seed 9; --overwrite:
# without it that directory is refused)
W_distill() { "$bin" distill --teacher "$tmp/model-a" --student "$tmp/student.ini" --steps 2 --no-eval --quiet --overwrite --out "$1"; }
P_distill() { "$bin" distill --teacher "$tmp/model-a" --student "$tmp/student.ini" --steps 2 --seed 9 --no-eval --quiet --out "$1"; }

W_run() {
  local c=$onnx_node/test_split_variable_parts_1d
  "$bin" run "$c/model.onnx" --input "input=$c/test_data_set_0/input_0.pb" --input "split=$c/test_data_set_0/input_1.pb" --output "$1"
}
P_run() { "$bin" run "$onnx_node/test_split_equal_parts_1d/model.onnx" --input "$onnx_node/test_split_equal_parts_1d/test_data_set_0/input_0.pb" --output "$1"; }

# Each case starts from a copy of the earlier output (prev-NAME, where the writer has one).
# digest PATH: the bytes of a file or of every file in a directory ("absent" if none).
# For a training directory (distill) only what eval reads: model.safetensors.
digest() {
  if [[ ! -e $1 ]]; then echo absent
  elif [[ -f $1 ]]; then sha256sum < "$1" | cut -c1-16
  elif [[ -e $1/ckpt ]]; then sha256sum < "$1/model.safetensors" | cut -c1-16
  else (cd "$1" && find . -type f | LC_ALL=C sort | xargs -r sha256sum | sha256sum | cut -c1-16)
  fi
}
temps() { find "$1" -name '*.tmp.*' -o -name '*.old.*' | grep .; }

total=0
# crash_every NAME KIND ACTION [ENV]: every N; adds the points covered to total
crash_every() {
  local name=$1 kind=$2 action=$3 env=${4:-} n=1 rc d out got
  while :; do
    d=$tmp/case-$name-$kind-$action-$n
    mkdir -p "$d" && out=$d/out
    if [[ -e $tmp/prev-$name ]]; then cp -a "$tmp/prev-$name" "$out" || { bad "$name: copying the earlier output"; return; }; fi
    (export FATHOM_FAULT="$kind:$n:$action"; [[ -n $env ]] && export "${env?}"; "W_$name" "$out") > "$d/log" 2>&1
    rc=$?
    if [[ $rc -eq 0 ]]; then # fewer points than n: all covered; the run must still be right
      [[ $(digest "$out") == "$new" ]] || bad "$name: the unfaulted run's output differs"
      rm -rf "$d"
      break
    fi
    if ! grep -q "FATHOM_FAULT: $kind $n" "$d/log"; then bad "$name $kind:$n:$action: exit $rc without the fault: $(tail -3 "$d/log")"; break; fi
    [[ $action == kill && $rc -ne 137 ]] && bad "$name $kind:$n:kill: exit $rc, expected 137"
    if [[ $action == eio ]] && ! grep -q "Input/output error" "$d/log"; then bad "$name $kind:$n:eio: the error does not say what failed: $(tail -2 "$d/log")"; fi
    if [[ $action == eio ]] && ! grep -q "$d/out" "$d/log"; then bad "$name $kind:$n:eio: the error does not name $d/out: $(tail -2 "$d/log")"; fi
    got=$(digest "$out")
    if [[ $got != "$old" && $got != "$new" ]]; then
      if [[ $got == absent && -n $env ]] && compgen -G "$out.old.*" > /dev/null; then :; # the fallback's window: repaired below
      else bad "$name $kind:$n:$action: the output is neither the earlier one nor the new one ($got)"; fi
    fi
    # an EIO changes nothing, but one after a checkpoint's commit (a link in OUT/) leaves the new checkpoint
    if [[ $action == eio && $got != "$old" ]] && ! grep -q "is complete, but updating" "$d/log"; then
      bad "$name $kind:$n:eio: a failed write changed the output"
    fi
    [[ $action == eio ]] && temps "$d" > /dev/null && bad "$name $kind:$n:eio: temporary files left by a failed write: $(temps "$d")"
    # the next run: it sweeps what the dead process left; prune and --hf refuse a complete output
    [[ $got == "$new" && ($name == prune* || $name == export_hf) ]] && rm -rf "$out"
    if ! "W_$name" "$out" > "$d/next.log" 2>&1; then bad "$name $kind:$n:$action: the next run failed: $(tail -3 "$d/next.log")"
    elif [[ $(digest "$out") != "$new" ]]; then bad "$name $kind:$n:$action: the next run's output differs from the reference"
    elif temps "$d" > /dev/null; then bad "$name $kind:$n:$action: temporaries left after the next run: $(temps "$d")"
    fi
    rm -rf "$d"
    n=$((n + 1))
    ((n > 60)) && { bad "$name $kind: more than 60 points?"; break; }
  done
  echo "$name${env:+ ($env)}: $kind:N:$action covered $((n - 1)) points"
  total=$((total + n - 1))
}

writers="compile quantize prune prune_finetune export_onnx export_hf distill"
if ((have_onnx_cases)); then writers+=" run"; else echo "SKIP: run --output cases ($onnx_node missing: apt-get install libonnx-testdata)"; fi
for name in $writers; do
  "W_$name" "$tmp/ref-$name" > "$tmp/ref.log" 2>&1 || { bad "$name: the reference run failed: $(tail -3 "$tmp/ref.log")"; continue; }
  new=$(digest "$tmp/ref-$name")
  "P_$name" "$tmp/prev-$name" > /dev/null 2>&1 || bad "$name: the earlier output failed"
  old=$(digest "$tmp/prev-$name")
  [[ $old != "$new" ]] || bad "$name: the earlier and the new output are the same bytes; the test could not tell them apart"
  for kind in write rename; do
    for action in kill eio; do crash_every "$name" "$kind" "$action"; done
  done
done
# the fallback commit of a graph directory, where the file system cannot exchange
new=$(digest "$tmp/ref-compile") old=$(digest "$tmp/prev-compile")
crash_every compile rename kill FATHOM_TEST_NO_EXCHANGE=1
crash_every compile rename eio FATHOM_TEST_NO_EXCHANGE=1
echo "output crash points covered: $total"

# ---- the outputs are loadable ----
expect 0 "" "$bin" eval "$tmp/ref-compile" --quiet
expect 0 "" "$bin" eval "$tmp/ref-quantize" --quiet
expect 0 "" "$bin" eval "$tmp/ref-prune" --quiet
expect 0 "" "$bin" eval "$tmp/ref-prune_finetune" --quiet
expect 0 "" "$bin" eval "$tmp/ref-distill" --quiet
expect 0 "" "$bin" eval "$tmp/prev-distill" --quiet
expect 0 "graph nodes" "$bin" export "$tmp/ref-export_hf" -o "$tmp/hf.onnx"
expect 0 "" "$bin" import "$tmp/ref-export_onnx" -o "$tmp/imported"

# ---- stale temporaries of a dead process, next to a single-file output ----
touch "$tmp/ref-export_onnx.tmp.999999" "$tmp/ref-export_onnx.tmpx"
mkdir -p "$tmp/ref-compile.tmp.999999" && touch "$tmp/ref-compile.tmp.999999/graph.json"
expect 0 "" "$bin" export "$tmp/model-b" -o "$tmp/ref-export_onnx"
expect 0 "" "$bin" compile "$tmp/model-b" -o "$tmp/ref-compile"
[[ ! -e $tmp/ref-export_onnx.tmp.999999 && ! -e $tmp/ref-compile.tmp.999999 && -e $tmp/ref-export_onnx.tmpx ]] &&
  ok "a dead process's temporaries removed, other names kept" || bad "stale temporaries: $(ls "$tmp")"
# pids are reused: a temporary named after a live process that started after the temporary was last changed
# (here this test's shell, for a file dated an hour back) is stale too; one of the same live process changed since
# it started is kept
touch -d '1 hour ago' "$tmp/ref-export_onnx.tmp.$$"
touch "$tmp/ref-compile.tmp.$$"
expect 0 "" "$bin" export "$tmp/model-b" -o "$tmp/ref-export_onnx"
expect 0 "" "$bin" compile "$tmp/model-b" -o "$tmp/ref-compile"
[[ ! -e $tmp/ref-export_onnx.tmp.$$ && -e $tmp/ref-compile.tmp.$$ ]] &&
  ok "a temporary older than the live process that now has its pid removed, a newer one kept" ||
  bad "recycled pid: $(ls "$tmp")"
rm -f "$tmp/ref-compile.tmp.$$"
cli_end cli_crash_outputs
