#!/usr/bin/env bash
# ZeRO-1 sharded checkpoints (docs/DISTRIBUTED.md), under `mpirun --oversubscribe -np N
# fathom train RECIPE --zero 1`:
#  - each rank writes its own optimizer shard into the checkpoint unit (no gather):
#    zero-shard-R-of-N.safetensors, named with their checksums in its MANIFEST;
#    train_state.safetensors holds metadata only (zero_world_size);
#  - 2 steps, then a resume on the same 2 ranks: the losses and the saved model are the
#    uninterrupted run's, bit for bit;
#  - resumed on 1 process and on 4 ranks (resharded): the uninterrupted losses within 1e-6;
#  - a corrupt shard makes its checkpoint incomplete: resume names the file and takes the
#    previous checkpoint (and still ends on the same bits);
#  - a shard of another rank (files swapped, MANIFEST rewritten to match) and a missing
#    shard are errors on every rank before any step;
#  - --memory-limit: a limit between `fathom plan --ranks 2 --zero 1`'s per-rank figure and
#    `fathom plan --ranks 2`'s trains with --zero 1 (its check before training counts the
#    shard, as the planner does) and is refused before training without it;
#  - the classifier trainer with --zero 1 writes the same units (a shard per rank, train_state
#    with metadata only): resumed on 2 ranks bit for bit, on one process, on 4 ranks and on 2
#    without --zero within 1e-6 of the uninterrupted run; its --memory-limit check counts the shard
#    only (15.5 bytes a parameter: --zero 1 trains at 2 ranks, plain data parallel is refused).
# Skipped (77) when this fathom has no MPI or mpirun is missing.
# Usage: bash tests/cli_dist_zero_ckpt.sh <path-to-fathom-binary>
set -uo pipefail
bin=${1:?usage: cli_dist_zero_ckpt.sh FATHOM_BIN}
. "$(dirname "$0")/cli_lib.sh" # ok, bad, $tmp (removed on exit), fails
cli_begin fathom_dist_zero
. "$(dirname "$0")/mpi_lib.sh" # skips without MPI; OpenMPI settings; mpi()
near() { python3 -c "import sys; a,b=map(float,sys.argv[1:3]); sys.exit(not abs(a-b) <= 1e-6*abs(b))" "$1" "$2"; }

for i in $(seq 1 40); do echo "And the word was $i, and the light was $((i * 7 % 11))."; done >"$tmp/corpus.txt"
printf '%s\n' '[model]' 'type = gpt' 'arch = llama' 'n_layer = 2' 'n_head = 4' 'n_kv_head = 2' 'n_embd = 16' \
  'ffn_hidden = 32' 'block_size = 8' '[tokenizer]' 'kind = byte' '[data]' "corpus = $tmp/corpus.txt" '[train]' \
  'batch_size = 4' 'steps = 4' 'eval_every = 4' 'eval_batches = 2' 'log_every = 1' 'grad_clip = 0.1' 'ckpt_every = 1' \
  'keep_checkpoints = 3' >"$tmp/r.ini"
train() { # out np extra...
  local out=$1 np=$2
  shift 2
  if [[ $np -gt 1 ]]; then mpi -np "$np" "$bin" train "$tmp/r.ini" --out "$tmp/$out" --threads 1 "$@"
  else "$bin" train "$tmp/r.ini" --out "$tmp/$out" --threads 1 "$@"; fi
}

# ---- the reference: 4 steps on 2 ranks, uninterrupted ----
train full 2 --zero 1 --json >"$tmp/full.json" 2>"$tmp/full.err" || bad "uninterrupted run: $(tail -c 400 "$tmp/full.err")"
ref=$(field "$tmp/full.json" train_loss); refv=$(field "$tmp/full.json" val_loss)

# ---- 2 steps: the unit holds the two shards, named in its MANIFEST ----
train part 2 --zero 1 --stop-after 2 >"$tmp/part.out" 2>&1; rc=$?
u="$tmp/part/ckpt/step-00000002"
if [[ $rc -eq 0 && -f $u/zero-shard-00000-of-00002.safetensors && -f $u/zero-shard-00001-of-00002.safetensors ]] &&
   grep -q "^file zero-shard-00001-of-00002.safetensors " "$u/MANIFEST" &&
   python3 - "$u/train_state.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], 'rb').read()
h = json.loads(b[8:8 + struct.unpack('<Q', b[:8])[0]])
meta = h.pop('__metadata__', {})
sys.exit(0 if not h and meta.get('zero_world_size') == '2' and meta.get('step') == '2' else 1)
PY
then
  ok "2 steps on 2 ranks: the unit holds zero-shard-0000{0,1}-of-00002 (in its MANIFEST); train_state has metadata only"
else
  bad "sharded checkpoint (exit $rc): $(ls "$u" 2>&1 | tr '\n' ' ') $(tail -c 400 "$tmp/part.out")"
fi
for d in same one four bad swap miss; do cp -r "$tmp/part" "$tmp/$d"; done

# ---- resume on the same 2 ranks: the same bits ----
train same 2 --zero 1 --resume --json >"$tmp/same.json" 2>"$tmp/same.err"; rc=$?
if [[ $rc -eq 0 ]] && grep -q "resumed from .*step-00000002 at step 2" "$tmp/same.err" &&
   [[ $(field "$tmp/same.json" train_loss) == "$ref" && $(field "$tmp/same.json" val_loss) == "$refv" ]] &&
   cmp -s "$tmp/same/model.safetensors" "$tmp/full/model.safetensors" &&
   cmp -s "$tmp/same/ckpt/step-00000004/zero-shard-00001-of-00002.safetensors" \
     "$tmp/full/ckpt/step-00000004/zero-shard-00001-of-00002.safetensors"; then
  ok "resumed on 2 ranks from its shards: loss $ref, the model and the last shards bit for bit the uninterrupted run's"
else
  bad "resume on 2 ranks (exit $rc): loss $(field "$tmp/same.json" train_loss) vs $ref: $(tail -c 600 "$tmp/same.err")"
fi

# ---- resharded: one process, and 4 ranks ----
train one 1 --resume --json >"$tmp/one.json" 2>"$tmp/one.err"; rc=$?
if [[ $rc -eq 0 ]] && grep -q "at step 2" "$tmp/one.err" && near "$(field "$tmp/one.json" train_loss)" "$ref"; then
  ok "resumed in one process from 2 shards: loss $(field "$tmp/one.json" train_loss) (2 ranks: $ref)"
else
  bad "resume in one process (exit $rc): $(field "$tmp/one.json" train_loss) vs $ref: $(tail -c 600 "$tmp/one.err")"
fi
train four 4 --zero 1 --resume --json >"$tmp/four.json" 2>"$tmp/four.err"; rc=$?
if [[ $rc -eq 0 ]] && grep -q "at step 2" "$tmp/four.err" && near "$(field "$tmp/four.json" train_loss)" "$ref" &&
   [[ -f $tmp/four/ckpt/step-00000004/zero-shard-00003-of-00004.safetensors ]]; then
  ok "resumed on 4 ranks (--zero 1) from 2 shards: loss $(field "$tmp/four.json" train_loss); its checkpoints hold 4 shards"
else
  bad "resume on 4 ranks (exit $rc): $(field "$tmp/four.json" train_loss) vs $ref: $(tail -c 600 "$tmp/four.err")"
fi

# ---- a corrupt shard: its checkpoint is incomplete, the previous one resumes ----
python3 -c "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[-3]^=0x40; open(p,'wb').write(bytes(b))" \
  "$tmp/bad/ckpt/step-00000002/zero-shard-00001-of-00002.safetensors"
train bad 2 --zero 1 --resume --json >"$tmp/bad.json" 2>"$tmp/bad.err"; rc=$?
if [[ $rc -eq 0 ]] && grep -q "ignoring the incomplete checkpoint .*step-00000002: zero-shard-00001-of-00002.safetensors fails its checksum" "$tmp/bad.err" &&
   grep -q "resumed from .*step-00000001 at step 1" "$tmp/bad.err" && [[ $(field "$tmp/bad.json" train_loss) == "$ref" ]]; then
  ok "a corrupt shard: named, its checkpoint skipped, step 1 resumed, the same final loss"
else
  bad "corrupt shard (exit $rc): $(tail -c 800 "$tmp/bad.err")"
fi

# ---- another rank's shard, the MANIFEST rewritten to match: an error on every rank before any step ----
s="$tmp/swap/ckpt/step-00000002"
mv "$s/zero-shard-00000-of-00002.safetensors" "$s/x" && mv "$s/zero-shard-00001-of-00002.safetensors" "$s/zero-shard-00000-of-00002.safetensors" &&
  mv "$s/x" "$s/zero-shard-00001-of-00002.safetensors" && remanifest "$s"
train swap 2 --zero 1 --resume >"$tmp/swap.out" 2>&1; rc=$?
if [[ $rc -ne 0 ]] && grep -q "zero-shard-00000-of-00002.safetensors holds the optimizer shard of rank 1 of 2, not of rank 0 of 2" "$tmp/swap.out" &&
   ! grep -q "^step 3" "$tmp/swap.out"; then
  ok "a shard of another rank: exit $rc before any step, naming the file and both ranks"
else
  bad "swapped shards (exit $rc): $(tail -c 800 "$tmp/swap.out")"
fi
m="$tmp/miss/ckpt/step-00000002"
rm "$m/zero-shard-00001-of-00002.safetensors" && remanifest "$m"
train miss 2 --zero 1 --resume >"$tmp/miss.out" 2>&1; rc=$?
# (rank 1 says it before the ranks agree; rank 0's "1 of the 2 ranks could not resume" may be cut
# short by rank 1's MPI_Abort, so it is not required)
if [[ $rc -ne 0 ]] && grep -q "rank 1 of 2: resuming from .*zero-shard-00001-of-00002.safetensors" "$tmp/miss.out" &&
   ! grep -q "^step 3" "$tmp/miss.out"; then
  ok "a missing shard: exit $rc before any step, rank 1 naming the file"
else
  bad "missing shard (exit $rc): $(tail -c 800 "$tmp/miss.out")"
fi

# ---- --memory-limit: the planner's figures and the trainer's check agree ----
# (a GPT whose parameters dominate: 232,320 of them, one 8-token window per rank)
printf '%s\n' '[model]' 'type = gpt' 'n_layer = 1' 'n_head = 2' 'n_embd = 128' 'ffn_hidden = 512' 'block_size = 8' \
  '[tokenizer]' 'kind = byte' '[data]' "corpus = $tmp/corpus.txt" '[train]' 'batch_size = 2' 'steps = 2' >"$tmp/big.ini"
planned() { "$bin" plan --model "$tmp/big.ini" --ranks 2 --json "$@" |
  python3 -c "import json,sys; print(json.load(sys.stdin)['memory']['allocated'])"; }
pz=$(planned --zero 1); p0=$(planned)
lim=$(( (${pz:-0} + ${p0:-0}) / 2 ))
mpi -np 2 "$bin" train "$tmp/big.ini" --out "$tmp/lz" --threads 1 --no-eval --zero 1 --memory-limit "$lim" --json \
  >"$tmp/lz.json" 2>"$tmp/lz.err"; rc=$?
mpi -np 2 "$bin" train "$tmp/big.ini" --out "$tmp/l0" --threads 1 --no-eval --memory-limit "$lim" >"$tmp/l0.out" 2>&1; rc0=$?
peak=$(field "$tmp/lz.json" peak_allocated)
if [[ -n $pz && -n $p0 && $pz -lt $p0 && $rc -eq 0 && -n $peak && ${peak%.*} -le $lim && $rc0 -eq 1 ]] &&
   grep -q "cannot hold the model before training starts" "$tmp/l0.out" && ! grep -q "^step " "$tmp/l0.out" &&
   [[ -f $tmp/lz/ckpt/step-00000002/zero-shard-00001-of-00002.safetensors ]]; then
  ok "--memory-limit $lim (planned per rank: $pz with --zero 1, $p0 without): --zero 1 trains (peak $peak), plain data parallel refused before training"
else
  bad "--memory-limit $lim (planned $pz / $p0): --zero 1 exit $rc peak '$peak' ($(tail -c 300 "$tmp/lz.err")); without: exit $rc0 ($(tail -c 300 "$tmp/l0.out"))"
fi

# ---- the classifier trainer: the same sharded units (src/dist/dist_ckpt.c) ----
# an MLP on 128 8x8 images, batches of 32 (4 steps an epoch), 2 epochs, Adam at lr 0.01,
# a checkpoint every 2 steps; stopped after step 4 and resumed on 2 ranks (bit for bit), on one
# process, on 4 ranks with --zero 1 and on 2 without it (resharded: within 1e-6)
mkdir -p "$tmp/img"
cli_images "$tmp/img" 128 32
cli_idx_recipe "$tmp/img" 2 flatten "linear 16" relu "linear 4" |
  sed '/^\[train\]$/a checkpoint_every = 2\nkeep_checkpoints = 3' >"$tmp/c.ini"
ctrain() { # out np extra...
  local out=$1 np=$2
  shift 2
  if [[ $np -gt 1 ]]; then mpi -np "$np" "$bin" train "$tmp/c.ini" --out "$tmp/$out" --threads 1 "$@"
  else "$bin" train "$tmp/c.ini" --out "$tmp/$out" --threads 1 "$@"; fi
}
ctrain cfull 2 --zero 1 --json >"$tmp/cfull.json" 2>"$tmp/cfull.err" || bad "classifier, uninterrupted: $(tail -c 400 "$tmp/cfull.err")"
cref=$(field "$tmp/cfull.json" train_loss); ctref=$(field "$tmp/cfull.json" test_loss)
ctrain cpart 2 --zero 1 --stop-after 4 >"$tmp/cpart.out" 2>&1; rc=$?
u="$tmp/cpart/ckpt/step-00000004"
if [[ $rc -eq 0 && -n $cref && -f $u/zero-shard-00000-of-00002.safetensors && -f $u/zero-shard-00001-of-00002.safetensors ]] &&
   grep -q "^file zero-shard-00001-of-00002.safetensors " "$u/MANIFEST" && grep -q "^file recipe.ini " "$u/MANIFEST" &&
   python3 - "$u/train_state.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], 'rb').read()
h = json.loads(b[8:8 + struct.unpack('<Q', b[:8])[0]])
meta = h.pop('__metadata__', {})
sys.exit(0 if not h and meta.get('zero_world_size') == '2' and meta.get('step') == '4' else 1)
PY
then
  ok "classifier, 4 steps on 2 ranks with --zero 1: the unit holds zero-shard-0000{0,1}-of-00002 (in its MANIFEST); train_state has metadata only"
else
  bad "classifier sharded checkpoint (exit $rc): $(ls "$u" 2>&1 | tr '\n' ' ') $(tail -c 400 "$tmp/cpart.out")"
fi
for d in csame cone cfour cdp cmiss; do cp -r "$tmp/cpart" "$tmp/$d"; done
ctrain csame 2 --zero 1 --resume --json >"$tmp/csame.json" 2>"$tmp/csame.err"; rc=$?
if [[ $rc -eq 0 ]] && grep -q "resuming from .*step-00000004" "$tmp/csame.err" &&
   [[ $(field "$tmp/csame.json" train_loss) == "$cref" && $(field "$tmp/csame.json" test_loss) == "$ctref" ]] &&
   cmp -s "$tmp/csame/model.safetensors" "$tmp/cfull/model.safetensors" &&
   cmp -s "$tmp/csame/ckpt/step-00000008/zero-shard-00001-of-00002.safetensors" \
     "$tmp/cfull/ckpt/step-00000008/zero-shard-00001-of-00002.safetensors"; then
  ok "classifier resumed on 2 ranks from its shards: loss $cref, the model and the last shards bit for bit the uninterrupted run's"
else
  bad "classifier resume on 2 ranks (exit $rc): $(field "$tmp/csame.json" train_loss) vs $cref: $(tail -c 600 "$tmp/csame.err")"
fi
cresharded() { # label out np extra...
  local label=$1 out=$2 np=$3
  shift 3
  ctrain "$out" "$np" "$@" --resume --json >"$tmp/$out.json" 2>"$tmp/$out.err"
  local rc=$?
  if [[ $rc -eq 0 ]] && grep -q "resuming from .*step-00000004" "$tmp/$out.err" &&
     near "$(field "$tmp/$out.json" train_loss)" "$cref" && near "$(field "$tmp/$out.json" test_loss)" "$ctref"; then
    ok "classifier resumed $label from 2 shards: loss $(field "$tmp/$out.json" train_loss) (uninterrupted: $cref)"
  else
    bad "classifier resumed $label (exit $rc): $(field "$tmp/$out.json" train_loss) vs $cref: $(tail -c 600 "$tmp/$out.err")"
  fi
}
cresharded "in one process" cone 1
cresharded "on 4 ranks with --zero 1" cfour 4 --zero 1
cresharded "on 2 ranks without --zero" cdp 2
[[ -f $tmp/cfour/ckpt/step-00000008/zero-shard-00003-of-00004.safetensors ]] ||
  bad "classifier on 4 ranks: no zero-shard-00003-of-00004 in its last unit: $(ls "$tmp/cfour/ckpt/step-00000008" 2>&1 | tr '\n' ' ')"
# a missing shard (MANIFEST rewritten to match): rank 1 names the file, and no rank trains a step
# (the ranks agree that every rank resumed before the first step)
m="$tmp/cmiss/ckpt/step-00000004"
rm "$m/zero-shard-00001-of-00002.safetensors" && remanifest "$m"
ctrain cmiss 2 --zero 1 --resume >"$tmp/cmiss.out" 2>&1; rc=$?
if [[ $rc -ne 0 ]] && grep -q "rank 1 of 2: .*zero-shard-00001-of-00002.safetensors" "$tmp/cmiss.out" &&
   ! grep -q "^epoch \|ETA" "$tmp/cmiss.out" && [[ ! -d $tmp/cmiss/ckpt/step-00000006 ]]; then
  ok "classifier, a missing shard: exit $rc before any step, rank 1 naming the file"
else
  bad "classifier, missing shard (exit $rc): $(tail -c 800 "$tmp/cmiss.out")"
fi
# --memory-limit: the classifier's check before training counts this rank's shard of the Adam
# moments and no gathered state (its checkpoints write the shard as it is): 8 + 4 x 2 / N bytes a
# parameter, against 16 without ZeRO-1 (and 16 at 2 ranks when its checkpoints gathered the state).
# A model whose 35,332 parameters dominate, under 15.5 bytes a parameter at 2 ranks: --zero 1 trains
# an epoch and writes its shards, plain data parallel is refused before training
cli_idx_recipe "$tmp/img" 1 flatten "linear 512" relu "linear 4" >"$tmp/cbig.ini"
n=$((64 * 512 + 512 + 512 * 4 + 4)); lim=$((n * 31 / 2))
mpi -np 2 "$bin" train "$tmp/cbig.ini" --out "$tmp/cbz" --threads 1 --no-eval --zero 1 --memory-limit "$lim" --json \
  >"$tmp/cbz.json" 2>"$tmp/cbz.err"; rc=$?
mpi -np 2 "$bin" train "$tmp/cbig.ini" --out "$tmp/cb0" --threads 1 --no-eval --memory-limit "$lim" >"$tmp/cb0.out" 2>&1; rc0=$?
peak=$(field "$tmp/cbz.json" peak_allocated)
if [[ $rc -eq 0 && -n $peak && ${peak%.*} -le $lim && $rc0 -eq 1 ]] && grep -q "cannot hold the model before training starts" "$tmp/cb0.out" &&
   ! grep -q "^epoch " "$tmp/cb0.out" && [[ -f $tmp/cbz/ckpt/step-00000004/zero-shard-00001-of-00002.safetensors ]]; then
  ok "classifier --memory-limit $lim (15.5 bytes x $n parameters): --zero 1 trains (peak $peak) and writes its shards, plain data parallel refused before training"
else
  bad "classifier --memory-limit $lim: --zero 1 exit $rc peak '$peak' ($(tail -c 300 "$tmp/cbz.err")); without: exit $rc0 ($(tail -c 300 "$tmp/cb0.out"))"
fi

[[ $fails -eq 0 ]] && echo "cli_dist_zero_ckpt: all passed" || echo "cli_dist_zero_ckpt: $fails failed"
exit $((fails > 0))
