#!/usr/bin/env bash
# Data-parallel checkpoints survive a crash: `mpirun -np 2 fathom train` (rank 0
# writes the checkpoints) is killed by FATHOM_FAULT at every write and rename
# point of its run (SIGKILL of rank 0, as a power cut of its machine would), then
# resumed with 2 ranks from the newest committed checkpoint (the log must name
# it); the final model must be bitwise equal to an uninterrupted 2-rank run's,
# with no temporary left.
# Skipped (77) when this fathom has no MPI or mpirun is missing.
# Usage: bash tests/cli_dist_crash.sh <path-to-fathom-binary>
set -uo pipefail
bin=${1:?usage: cli_dist_crash.sh FATHOM_BIN}
. "$(dirname "$0")/cli_lib.sh"
. "$(dirname "$0")/mpi_lib.sh" # skips without MPI; OpenMPI settings; mpi()
cli_begin fathom_dist_crash
mpi2() { mpi -np 2 "$@"; } # always 2 ranks here

cli_images "$tmp" 64 32
cli_idx_data "$tmp" > "$tmp/r.ini"
printf '[model]\ninput = 1 8 8\nlayer = flatten\nlayer = linear 8\nlayer = dropout 0.2\nlayer = linear 4\n' >> "$tmp/r.ini"
printf '[train]\nepochs = 2\nbatch = 16\nseed = 5\n[optimizer]\nname = adam\nlr = 0.01\n' >> "$tmp/r.ini"
flags=(--threads 1 --no-eval --quiet --dist-timeout 10)
mpi2 "$bin" train "$tmp/r.ini" --out "$tmp/ref" "${flags[@]}" > "$tmp/ref.log" 2>&1 ||
  { echo "FAIL: the uninterrupted 2-rank run: $(tail -5 "$tmp/ref.log")"; exit 1; }

total=0
for kind in write rename; do
  n=1
  while :; do
    d=$tmp/$kind-$n
    FATHOM_FAULT=$kind:$n:kill mpi2 "$bin" train "$tmp/r.ini" --out "$d" "${flags[@]}" > "$d.log" 2>&1
    rc=$?
    if [[ $rc -eq 0 ]]; then break; fi # fewer points than n
    if ! grep -q "FATHOM_FAULT: $kind $n" "$d.log"; then bad "$kind:$n: exit $rc without the fault: $(tail -3 "$d.log")"; break; fi
    # the newest committed checkpoint: the resume must start there, not from scratch
    newest=$(cd "$d/ckpt" 2> /dev/null && ls -d step-???????? 2> /dev/null | sort | tail -1)
    if [[ -n $newest ]]; then want="resuming from $d/ckpt/$newest (step $((10#${newest#step-})))"
    else want="training from step 0"; fi
    if ! mpi2 "$bin" train "$tmp/r.ini" --resume "$d" "${flags[@]}" > "$d.resume.log" 2>&1; then
      bad "$kind:$n: the 2-rank resume failed: $(tail -3 "$d.resume.log")"
    elif ! grep -qF "$want" "$d.resume.log"; then
      bad "$kind:$n: the resume does not say '$want': $(head -3 "$d.resume.log")"
    elif ! cmp -s "$tmp/ref/model.safetensors" "$d/model.safetensors"; then
      bad "$kind:$n: the resumed model differs from the uninterrupted 2-rank run's"
    elif find "$d" -name '*.tmp.*' | grep -q .; then
      bad "$kind:$n: temporaries left: $(find "$d" -name '*.tmp.*')"
    else
      ok "$kind:$n: killed, ${newest:-no checkpoint yet}, resumed on 2 ranks, bitwise equal"
    fi
    rm -rf "$d" "$d.log" "$d.resume.log"
    n=$((n + 1))
    ((n > 60)) && { bad "$kind: more than 60 points?"; break; }
  done
  echo "$kind: covered $((n - 1)) points"
  total=$((total + n - 1))
done
echo "2-rank crash points covered: $total"
((total > 0)) || bad "no fault point was reached"
cli_end cli_dist_crash
