#!/usr/bin/env bash
# ZeRO-1 and tensor parallelism with the parameters on DEVICE, on one GPU (tools/gpu-check.sh;
# docs/DISTRIBUTED.md): NCCL refuses two ranks on one GPU, so the ranks share it with
# FATHOM_DIST_NCCL=0 (their collectives go through host copies and MPI) and every device path
# of src/dist/zero.c and src/dist/tensor_parallel.c runs on the GPU but NCCL's own calls.
# A tiny GPT (generated corpus, gradient clipping) trains 6 steps on the CPU and on DEVICE:
#   2 ranks --zero 1; 2 ranks --tensor-parallel 2; 4 ranks --tensor-parallel 2 --zero 1;
# every logged loss of DEVICE within SHARDED_TOL (default 1e-4) relative of the CPU's.
# On check (tests/cli_dist_device.sh runs it so) the bound is 0: the CPU's bits.
#   usage: tools/gpu-check-sharded.sh FATHOM_BIN DEVICE OUT_DIR
# Last line: "sharded smoke: pass ..." or a FAIL.
set -uo pipefail
bin=${1:?usage: gpu-check-sharded.sh FATHOM_BIN DEVICE OUT_DIR}
dev=${2:?device}
out=${3:?out dir}
mkdir -p "$out"
tol=${SHARDED_TOL:-1e-4}
[[ $dev == check* ]] && tol=0
if ! command -v mpirun >/dev/null 2>&1; then echo "sharded smoke: FAIL (mpirun not found)"; exit 1; fi
if ! "$bin" info --json | grep -q '"mpi_built": true'; then echo "sharded smoke: FAIL (this fathom was built without MPI)"; exit 1; fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 FATHOM_DIST_NCCL=0
# a session directory of its own: another user's or test's mpirun sharing /tmp/ompi.HOST.UID can remove it as this one starts
mkdir -p "$out/ompi" && export OMPI_MCA_orte_tmpdir_base=$out/ompi
for i in $(seq 1 60); do echo "And the word was $i, and the light was $((i * 7 % 11)) in the house of $((i % 5))."; done >"$out/corpus.txt"
printf '%s\n' '[model]' 'type = gpt' 'arch = llama' 'n_layer = 2' 'n_head = 4' 'n_kv_head = 2' 'n_embd = 32' \
  'ffn_hidden = 64' 'block_size = 16' '[tokenizer]' 'kind = byte' '[data]' "corpus = $out/corpus.txt" '[train]' \
  'batch_size = 8' 'steps = 6' 'eval_every = 6' 'eval_batches = 2' 'log_every = 1' 'grad_clip = 0.5' >"$out/r.ini"
t0=$SECONDS
worst_all=0
run() { # NAME NP FLAGS...: the same job on cpu and on dev; losses compared
  local name=$1 np=$2 d
  shift 2
  for d in cpu "$dev"; do
    if ! timeout 300 mpirun --oversubscribe -x FATHOM_DIST_NCCL -np "$np" "$bin" train "$out/r.ini" "$@" --threads 1 \
         --device "$d" --out "$out/$name-${d%%:*}" >"$out/$name-${d%%:*}.out" 2>"$out/$name-${d%%:*}.err"; then
      echo "sharded smoke: FAIL ($name on $d: $(grep -m1 'error' "$out/$name-${d%%:*}.err" || tail -c 300 "$out/$name-${d%%:*}.err"))"
      return 1
    fi
    grep -o 'loss [0-9.e+-]*' "$out/$name-${d%%:*}.err" | cut -d' ' -f2 >"$out/$name-${d%%:*}.loss"
  done
  local a=$out/$name-cpu.loss b=$out/$name-${dev%%:*}.loss n
  n=$(wc -l <"$a")
  if ((n == 0)) || [[ $n -ne $(wc -l <"$b") ]]; then echo "sharded smoke: FAIL ($name: $n losses on cpu, $(wc -l <"$b") on $dev)"; return 1; fi
  local w
  w=$(paste "$a" "$b" | awk '{d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1; r = a > 0 ? d / a : d; if (r > w) w = r}
    END {printf "%.3g", w + 0}')
  if ! awk -v w="$w" -v t="$tol" 'BEGIN {exit !(w <= t)}'; then
    echo "sharded smoke: FAIL ($name: largest relative loss difference $w over $n losses, bound $tol)"; return 1
  fi
  worst_all=$(awk -v a="$worst_all" -v b="$w" 'BEGIN {print (b > a ? b : a)}')
}
run zero 2 --zero 1 || exit 1
run tp 2 --tensor-parallel 2 || exit 1
run tpzero 4 --tensor-parallel 2 --zero 1 || exit 1
echo "sharded smoke: pass (ZeRO-1, TP=2, TP=2 x DP=2 x ZeRO-1 on $dev against the cpu: largest relative loss difference $worst_all, bound $tol; $((SECONDS - t0)) s)"
