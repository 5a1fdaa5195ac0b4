#!/usr/bin/env bash
# Data-parallel training with the parameters on a device (docs/DISTRIBUTED.md):
# `mpirun -np 2 fathom train --device check` against the same job on the CPU: the
# gradient buckets of the check device's parameters go through the backend's copies
# (src/dist/ddp.c) around the same MPI exchanges, so every logged loss and the saved
# model must be the CPU job's bit for bit (a classifier with batch norm, a tiny GPT).
# The same under ZeRO-1 (`--zero 1`: the step's flat buffers are check tensors, the
# reduce-scatter and all-gather go through host copies), with gradient clipping, and its
# sharded checkpoints: a check job stopped after 2 steps and resumed on check, and a cpu
# job's shards resumed on check, end on the uninterrupted cpu job's bits. Tensor
# parallelism likewise: TP=2 and TP=2 x DP=2 with ZeRO-1 (4 ranks) on check equal the
# cpu, and their checkpoints written and resumed on check end on the cpu job's bits.
# Also tools/gpu-check-sharded.sh and tools/gpu-check-nccl.sh run on the check device (one rank under mpirun against
# the plain run), so the script the GPU run uses for its NCCL smoke test works.
# Skipped (77) when this fathom has no MPI or mpirun is missing.
# Usage: bash tests/cli_dist_device.sh <path-to-fathom-binary>
set -uo pipefail
bin=${1:?usage: cli_dist_device.sh FATHOM_BIN}
. "$(dirname "$0")/cli_lib.sh"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$(dirname "$0")/mpi_lib.sh" # skips without MPI; OpenMPI settings; mpi()
cli_begin cli_dist_device
MPI_TIMEOUT=300

# NAME RECIPE FLAGS...: NP (default 2) ranks on cpu and on check; losses (the log lines) and the model bytes
same_on_check() {
  local name=$1 recipe=$2 d np=${NP:-2}; shift 2
  for d in cpu check; do
    if ! mpi -np "$np" "$bin" train "$recipe" "$@" --threads 1 --device "$d" --out "$tmp/$name-$d" \
         >"$tmp/$name-$d.out" 2>"$tmp/$name-$d.err"; then
      bad "$name on $d over $np ranks: $(tail -c 600 "$tmp/$name-$d.err")"; return
    fi
  done
  grep -o 'loss [0-9.e+-]*' "$tmp/$name-cpu.err" >"$tmp/$name-cpu.loss"
  grep -o 'loss [0-9.e+-]*' "$tmp/$name-check.err" >"$tmp/$name-check.loss"
  if [[ ! -s $tmp/$name-cpu.loss ]]; then bad "$name: no loss lines: $(tail -c 400 "$tmp/$name-cpu.err")"; return; fi
  if ! cmp -s "$tmp/$name-cpu.loss" "$tmp/$name-check.loss"; then
    bad "$name: losses on check differ: $(paste -d' ' "$tmp/$name-cpu.loss" "$tmp/$name-check.loss" | head -5)"; return
  fi
  if ! cmp -s "$tmp/$name-cpu/model.safetensors" "$tmp/$name-check/model.safetensors"; then
    bad "$name: the model saved from check differs from the cpu's"; return
  fi
  ok "$name, $np ranks: $(wc -l <"$tmp/$name-cpu.loss") losses and the model on check equal the cpu's bit for bit"
}

mkdir -p "$tmp/img"
cli_images "$tmp/img" 128 32
cli_idx_recipe "$tmp/img" 1 "conv2d 4 3 padding=1" batchnorm2d relu "maxpool2d 2" flatten "linear 4" >"$tmp/cnn.ini"
same_on_check cnn "$tmp/cnn.ini" --steps 4
for i in $(seq 1 40); do echo "And the word was $i, and the light was $((i * 7 % 11))."; done >"$tmp/corpus.txt"
printf '%s\n' '[model]' 'type = gpt' 'n_layer = 1' 'n_head = 2' 'n_embd = 16' 'ffn_hidden = 32' 'block_size = 8' \
  '[tokenizer]' 'kind = byte' '[data]' "corpus = $tmp/corpus.txt" '[train]' 'batch_size = 4' 'steps = 3' 'eval_every = 3' \
  'eval_batches = 2' 'log_every = 1' >"$tmp/tiny.ini"
same_on_check gpt "$tmp/tiny.ini"

# ZeRO-1 on check: the optimizer's views and the flat buffers on the device
same_on_check cnn-zero "$tmp/cnn.ini" --steps 4 --zero 1
sed 's/^steps = 3$/steps = 4/' "$tmp/tiny.ini" >"$tmp/zero.ini"
printf '%s\n' 'grad_clip = 0.05' 'ckpt_every = 1' 'keep_checkpoints = 4' >>"$tmp/zero.ini"
same_on_check gpt-zero "$tmp/zero.ini" --zero 1
same_on_check gpt-zero-fp16 "$tmp/zero.ini" --zero 1 --precision fp16 # the loss scaler on the views' gradients
# sharded checkpoints written and read on check
# NAME FIRST-DEVICE REF NP FLAGS...: 2 steps on FIRST-DEVICE, resumed on check; REF: the uninterrupted cpu job
resume_on_check() {
  local name=$1 first=$2 ref=$3 np=$4
  shift 4
  if ! mpi -np "$np" "$bin" train "$tmp/zero.ini" "$@" --threads 1 --device "$first" --stop-after 2 \
       --out "$tmp/$name" >"$tmp/$name-a.out" 2>"$tmp/$name-a.err" || [[ ! -d $tmp/$name/ckpt/step-00000002 ]]; then
    bad "$name: 2 steps on $first with $*: $(tail -c 600 "$tmp/$name-a.err")"; return
  fi
  if ! mpi -np "$np" "$bin" train "$tmp/zero.ini" "$@" --threads 1 --device check --resume --out "$tmp/$name" \
       >"$tmp/$name-b.out" 2>"$tmp/$name-b.err"; then
    bad "$name: resume on check: $(tail -c 600 "$tmp/$name-b.err")"; return
  fi
  grep -o 'loss [0-9.e+-]*' "$tmp/$name-b.err" >"$tmp/$name.loss"
  if ! grep -q "at step 2" "$tmp/$name-b.err" || [[ ! -s $tmp/$name.loss ]] ||
     ! tail -n "$(wc -l <"$tmp/$name.loss")" "$tmp/$ref-cpu.loss" | cmp -s - "$tmp/$name.loss"; then
    bad "$name: the resumed losses are not the uninterrupted cpu job's: $(tail -c 600 "$tmp/$name-b.err")"; return
  fi
  if ! cmp -s "$tmp/$name/model.safetensors" "$tmp/$ref-cpu/model.safetensors"; then
    bad "$name: the resumed model differs from the uninterrupted cpu job's"; return
  fi
  ok "$name ($np ranks, $*): checkpoint written on $first after 2 steps, resumed on check: losses and model the cpu job's bits"
}
resume_on_check zero-check check gpt-zero 2 --zero 1
resume_on_check zero-cpu cpu gpt-zero 2 --zero 1

# tensor parallelism on check: the tp_copy/tp_reduce sums are all-reduces of check tensors; the
# vocabulary-parallel loss, the clipping norm's replicated part and the checkpoints' shards go
# through host copies
same_on_check gpt-tp "$tmp/zero.ini" --tensor-parallel 2
same_on_check gpt-tp-bf16 "$tmp/zero.ini" --tensor-parallel 2 --precision bf16
NP=4 same_on_check gpt-tp-dp-zero "$tmp/zero.ini" --tensor-parallel 2 --zero 1
resume_on_check tp-check check gpt-tp 2 --tensor-parallel 2
resume_on_check tp-zero-check check gpt-tp-dp-zero 4 --tensor-parallel 2 --zero 1

# the GPU run's NCCL smoke script, here on the check device
if out=$(GPU_CHECK_NCCL_RECIPE="$tmp/tiny.ini" GPU_CHECK_NCCL_FLAGS="--threads 1" \
         bash "$ROOT/tools/gpu-check-nccl.sh" "$bin" check "$tmp/nccl" 2>&1); then
  ok "tools/gpu-check-nccl.sh on check: $(echo "$out" | tail -1)"
else
  bad "tools/gpu-check-nccl.sh on check: $out"
fi
# the GPU run's ZeRO-1 / tensor-parallel script (ranks sharing one GPU), here on check
if out=$(bash "$ROOT/tools/gpu-check-sharded.sh" "$bin" check "$tmp/sharded" 2>&1); then
  ok "tools/gpu-check-sharded.sh on check: $(echo "$out" | tail -1)"
else
  bad "tools/gpu-check-sharded.sh on check: $out"
fi
cli_end cli_dist_device
