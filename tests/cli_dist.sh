#!/usr/bin/env bash
# Distributed training at the process level (docs/DISTRIBUTED.md), under
# `mpirun --oversubscribe -np N`:
#  - a rank that arrives late at a collective makes the others fail within the
#    timeout with an error naming that rank, and the job ends (non-zero exit);
#  - mpirun -np 2 fathom train (a tiny GPT): one JSON line from rank 0 with the
#    world size and the communication figures, the model saved; --zero 1; fp16 with an
#    inf in rank 1's gradient only: skipped by every rank, as one process skips its own, and
#    with --zero 1 too (plain data parallel's loss and model file), whose checkpoint after a
#    skipped step resumes bit for bit;
#  - refused before training: ranks with different flags (naming the flag and the
#    rank), a batch that does not split over the ranks, --zero 1 on one process;
#  - a rank stopped mid-run (SIGSTOP): rank 0 names it within --dist-timeout, the
#    job ends, and the newest checkpoint resumes in one process.
# Skipped (77) when this fathom has no MPI or mpirun is missing.
# Usage: bash tests/cli_dist.sh <path-to-fathom-binary>
set -uo pipefail
bin=${1:?usage: cli_dist.sh FATHOM_BIN}
build=$(dirname "$bin")
. "$(dirname "$0")/cli_lib.sh" # ok, bad, $tmp (removed on exit), fails
cli_begin fathom_dist
. "$(dirname "$0")/mpi_lib.sh" # skips without MPI; OpenMPI settings; mpi()

# ---- a late rank: rank 1 sleeps 5 s before an all-reduce whose timeout is 1 s ----
t0=$SECONDS
mpi -np 2 "$build/test_dist" timeout >"$tmp/late.out" 2>&1; rc=$?
took=$((SECONDS - t0))
if [[ $rc -eq 0 ]]; then bad "late rank: exit 0"; fi
if grep -q "rank 0 of 2: all-reduce timed out after 1 s waiting for rank 1, which died or hangs" "$tmp/late.out"; then
  ok "late rank: rank 0 names rank 1 (exit $rc, ${took} s)"
else
  bad "late rank: no error naming rank 1: $(head -c 600 "$tmp/late.out")"
fi
((took < 30)) || bad "late rank: the job took ${took} s to end"

# ---- a late root: rank 0 sleeps 5 s before a broadcast that rank 1 waits 1 s for ----
mpi -np 2 "$build/test_dist" timeout-bcast >"$tmp/lateb.out" 2>&1; rc=$?
if [[ $rc -ne 0 ]] && grep -q "rank 1 of 2: broadcast from rank 0 timed out after 1 s: rank 0, or a rank relaying its data, died or hangs" "$tmp/lateb.out"; then
  ok "late root: rank 1 names rank 0 (exit $rc)"
else
  bad "late root: rc $rc, no error naming rank 0: $(head -c 600 "$tmp/lateb.out")"
fi

# ---- mpirun -np 2 fathom train: a tiny GPT recipe ----
for i in $(seq 1 40); do echo "And the word was $i, and the light was $((i * 7 % 11))."; done >"$tmp/corpus.txt"
printf '%s\n' '[model]' 'type = gpt' 'n_layer = 1' 'n_head = 2' 'n_embd = 16' 'ffn_hidden = 32' 'block_size = 8' \
  '[tokenizer]' 'kind = byte' '[data]' "corpus = $tmp/corpus.txt" '[train]' 'batch_size = 4' 'steps = 3' 'eval_every = 3' \
  'eval_batches = 2' 'log_every = 1' >"$tmp/tiny.ini"
flags=(--threads 1 --json)
mpi -np 2 "$bin" train "$tmp/tiny.ini" --out "$tmp/dp" "${flags[@]}" >"$tmp/dp.json" 2>"$tmp/dp.err"; rc=$?
if [[ $rc -eq 0 ]] && [[ $(wc -l <"$tmp/dp.json") -eq 1 ]] && grep -q '"world_size":2' "$tmp/dp.json" &&
   grep -q '"overlapped_fraction"' "$tmp/dp.json" && grep -q 'data parallel: 2 ranks' "$tmp/dp.err" &&
   [[ -f "$tmp/dp/model.safetensors" ]]; then
  ok "2 ranks: one JSON line (world_size 2, communication figures), the model saved by rank 0"
else
  bad "2 ranks (exit $rc): $(head -c 600 "$tmp/dp.json") $(tail -c 600 "$tmp/dp.err")"
fi
mpi -np 2 "$bin" train "$tmp/tiny.ini" --out "$tmp/dz" --zero 1 "${flags[@]}" >"$tmp/dz.json" 2>"$tmp/dz.err"; rc=$?
state() { grep -o '"optimizer_state_bytes_per_rank":[0-9]*' "$1" | cut -d: -f2; }
full=$(state "$tmp/dp.json"); half=$(state "$tmp/dz.json")
if [[ $rc -eq 0 ]] && grep -q '"zero":1' "$tmp/dz.json" && [[ -n $full && -n $half ]] && ((half * 2 >= full && half * 2 <= full + 64)); then
  ok "--zero 1 at 2 ranks: optimizer state per rank $half bytes, plain data parallel $full"
else
  bad "--zero 1 (exit $rc, state $half vs $full): $(tail -c 600 "$tmp/dz.err")"
fi
# fp16: the loss scaler's overflow check is summed over the ranks. An inf written into rank 1's
# averaged gradient at step 2 (FATHOM_TEST_INF_GRAD=2:1; an fp16 overflow on one rank only) is
# skipped by rank 0 too, which reports: 1 skip, the scale halved, and the losses of one process
# with the inf at step 2 in its own gradient (without the sum rank 0 would step alone)
FATHOM_TEST_INF_GRAD=2:1 mpi -np 2 "$bin" train "$tmp/tiny.ini" --out "$tmp/dpfi" --precision fp16 "${flags[@]}" \
  >"$tmp/dpfi.json" 2>"$tmp/dpfi.err"; rc=$?
FATHOM_TEST_INF_GRAD=2:0 "$bin" train "$tmp/tiny.ini" --out "$tmp/onefi" --precision fp16 "${flags[@]}" >"$tmp/onefi.json" \
  2>"$tmp/onefi.err" || bad "one process, fp16, inf at step 2: $(tail -c 400 "$tmp/onefi.err")"
fieldv() { grep -o "\"$2\":[-0-9.e]*" "$1" | head -1 | cut -d: -f2; }
if [[ $rc -eq 0 && $(fieldv "$tmp/dpfi.json" skipped_steps) == 1 && $(fieldv "$tmp/dpfi.json" loss_scale) == 32768.0 ]] &&
   grep -q "^step 2/3 .*loss scale 32768  skipped 1" "$tmp/dpfi.err" &&
   python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); sys.exit(not abs(a-b) <= 1e-6*abs(b))" \
     "$(fieldv "$tmp/dpfi.json" train_loss)" "$(fieldv "$tmp/onefi.json" train_loss)"; then
  ok "fp16 at 2 ranks, an inf in rank 1's gradient at step 2: rank 0 skipped it too (scale 32768), loss $(fieldv "$tmp/dpfi.json" train_loss) (one process with the inf: $(fieldv "$tmp/onefi.json" train_loss))"
else
  bad "fp16 at 2 ranks with an inf on rank 1 (exit $rc): $(head -c 600 "$tmp/dpfi.json") $(tail -c 600 "$tmp/dpfi.err")"
fi
# ... and with --zero 1 (rank 1's shard of the averaged gradient gets the inf): the same skip,
# the same loss and model file as plain data parallel's with the inf, bit for bit
FATHOM_TEST_INF_GRAD=2:1 mpi -np 2 "$bin" train "$tmp/tiny.ini" --out "$tmp/dzfi" --precision fp16 --zero 1 "${flags[@]}" \
  >"$tmp/dzfi.json" 2>"$tmp/dzfi.err"; rc=$?
if [[ $rc -eq 0 && $(fieldv "$tmp/dzfi.json" skipped_steps) == 1 && $(fieldv "$tmp/dzfi.json" loss_scale) == 32768.0 ]] &&
   grep -q '"zero":1' "$tmp/dzfi.json" && [[ $(fieldv "$tmp/dzfi.json" train_loss) == "$(fieldv "$tmp/dpfi.json" train_loss)" ]] &&
   cmp -s "$tmp/dzfi/model.safetensors" "$tmp/dpfi/model.safetensors"; then
  ok "fp16 with --zero 1 at 2 ranks, an inf in rank 1's shard at step 2: skipped by both (scale 32768), loss and model file those of plain data parallel"
else
  bad "fp16 --zero 1 with an inf on rank 1 (exit $rc): $(head -c 600 "$tmp/dzfi.json") $(tail -c 600 "$tmp/dzfi.err")"
fi
# fp16 --zero 1 checkpoints: an inf at step 1 (the scale halves, AdamW's step count stays one
# behind), 2 steps, then resumed on 2 ranks: the uninterrupted run's loss, scale and model file
export FATHOM_TEST_INF_GRAD=1:1
mpi -np 2 "$bin" train "$tmp/tiny.ini" --out "$tmp/zfu" --precision fp16 --zero 1 "${flags[@]}" >"$tmp/zfu.json" 2>"$tmp/zfu.err"
mpi -np 2 "$bin" train "$tmp/tiny.ini" --out "$tmp/zfr" --precision fp16 --zero 1 --stop-after 2 "${flags[@]}" >/dev/null 2>&1
mpi -np 2 "$bin" train "$tmp/tiny.ini" --out "$tmp/zfr" --precision fp16 --zero 1 --resume "${flags[@]}" >"$tmp/zfr.json" 2>"$tmp/zfr.err"; rc=$?
unset FATHOM_TEST_INF_GRAD
if [[ $rc -eq 0 && -n $(fieldv "$tmp/zfu.json" train_loss) ]] && grep -q "resumed from .*step-00000002 at step 2" "$tmp/zfr.err" &&
   [[ $(fieldv "$tmp/zfr.json" train_loss) == "$(fieldv "$tmp/zfu.json" train_loss)" && $(fieldv "$tmp/zfr.json" loss_scale) == 32768.0 &&
      $(fieldv "$tmp/zfu.json" loss_scale) == 32768.0 ]] && cmp -s "$tmp/zfr/model.safetensors" "$tmp/zfu/model.safetensors"; then
  ok "fp16 --zero 1, a skip at step 1, stopped after 2 and resumed: loss, scale 32768 and model file of the uninterrupted run"
else
  bad "fp16 --zero 1 resume (exit $rc): $(head -c 400 "$tmp/zfr.json") vs $(head -c 400 "$tmp/zfu.json") $(tail -c 400 "$tmp/zfr.err")"
fi
# ranks started with different flags: refused before any work, naming the flag and the rank
mpi -np 1 "$bin" train "$tmp/tiny.ini" --out "$tmp/mm" --lr 0.01 : -np 1 "$bin" train "$tmp/tiny.ini" --out "$tmp/mm" --lr 0.02 \
  >"$tmp/mm.out" 2>&1; rc=$?
if [[ $rc -ne 0 ]] && grep -q -- "--lr differs between ranks: rank 1 does not match rank 0" "$tmp/mm.out" && [[ ! -e "$tmp/mm/ckpt" ]]; then
  ok "mismatched --lr: refused, naming --lr and rank 1 (exit $rc)"
else
  bad "mismatched --lr (exit $rc): $(head -c 600 "$tmp/mm.out")"
fi
mpi -np 2 "$bin" train "$tmp/tiny.ini" --out "$tmp/odd" --batch 5 >"$tmp/odd.out" 2>&1; rc=$?
if [[ $rc -ne 0 ]] && grep -q "the batch (5) does not split evenly over 2 ranks" "$tmp/odd.out"; then
  ok "--batch 5 over 2 ranks: refused (exit $rc)"
else
  bad "--batch 5 over 2 ranks (exit $rc): $(head -c 600 "$tmp/odd.out")"
fi
"$bin" train "$tmp/tiny.ini" --out "$tmp/z1" --zero 1 >"$tmp/z1.out" 2>&1; rc=$?
if [[ $rc -eq 2 ]] && grep -q "zero 1 shards the optimizer state across MPI ranks" "$tmp/z1.out"; then
  ok "--zero 1 on one process: usage error"
else
  bad "--zero 1 on one process (exit $rc): $(head -c 400 "$tmp/z1.out")"
fi

# ---- a rank that hangs mid-run (SIGSTOP): rank 0 names it within --dist-timeout (8 s), the job
#      ends, and the newest checkpoint resumes in one process ----
sed -e 's/^steps = 3$/steps = 1000000/' -e 's/^eval_every = 3$/eval_every = 0/' "$tmp/tiny.ini" >"$tmp/long.ini"
echo 'ckpt_every = 5' >>"$tmp/long.ini"
descendants() { local c; for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do echo "$c"; descendants "$c"; done; }
mpi -np 2 "$bin" train "$tmp/long.ini" --out "$tmp/kill" --threads 1 --dist-timeout 8 --quiet >"$tmp/kill.out" 2>&1 &
job=$!
r1=""
for _ in $(seq 1 120); do
  sleep 0.5
  if [[ -z $r1 ]]; then
    for p in $(descendants "$job"); do
      if tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx 'OMPI_COMM_WORLD_RANK=1' &&
         tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -q "$tmp/kill"; then r1=$p; fi
    done
  fi
  [[ -n $r1 ]] && compgen -G "$tmp/kill/ckpt/step-*/MANIFEST" >/dev/null && break
done
if [[ -z $r1 ]]; then
  bad "hung rank: rank 1's process not found"; kill "$job" 2>/dev/null
else
  kill -STOP "$r1"; t1=$SECONDS
  wait "$job"; rc=$?
  took=$((SECONDS - t1))
  kill -KILL "$r1" 2>/dev/null
  if [[ $rc -ne 0 ]] && grep -q "timed out after 8 s waiting for rank 1, which died or hangs" "$tmp/kill.out" && ((took < 40)); then
    ok "hung rank 1: rank 0 names it, the job ends (exit $rc, ${took} s after the stop)"
  else
    bad "hung rank 1 (exit $rc, ${took} s): $(head -c 800 "$tmp/kill.out")"
  fi
  last=$(ls -d "$tmp"/kill/ckpt/step-* | sed 's/.*step-//' | sort -n | tail -1)
  last=$((10#$last))
  "$bin" train "$tmp/long.ini" --out "$tmp/kill" --resume --stop-after $((last + 1)) --threads 1 >"$tmp/res.out" 2>&1; rc=$?
  if [[ $rc -eq 0 ]] && grep -q "resumed from .*step-0*$last at step $last" "$tmp/res.out"; then
    ok "the newest checkpoint (step $last) is intact: one process resumes from it"
  else
    bad "resume after the hung rank (exit $rc): $(tail -c 600 "$tmp/res.out")"
  fi
fi

((fails == 0)) || { echo "$fails failure(s)"; exit 1; }
echo "all ok"
