#!/usr/bin/env bash
# The NCCL smoke test of tools/gpu-check.sh (docs/DISTRIBUTED.md): one rank under
# mpirun with --device DEVICE against the same training without mpirun. On cuda, in a
# build with NCCL, the MPI run joins NCCL on the GPU of its local rank (rank 0's unique
# id broadcast over MPI) and every gradient bucket is all-reduced through it (an
# average over one rank: the values unchanged), so the two loss curves must be equal
# (relative difference <= 1e-12 at every logged step); the run must also say it used
# NCCL. On check (tests/cli_dist_device.sh runs it so) there is no NCCL: the script's
# plumbing is what is tested.
#   usage: tools/gpu-check-nccl.sh FATHOM_BIN DEVICE OUT_DIR
# GPU_CHECK_NCCL_RECIPE (default fashion-mlp), GPU_CHECK_NCCL_FLAGS (default
# "--steps 30 --batch 64 --no-eval --seed 1"). Last line: "nccl smoke: pass ..." or a FAIL.
set -uo pipefail
bin=${1:?usage: gpu-check-nccl.sh FATHOM_BIN DEVICE OUT_DIR}
dev=${2:?device}
out=${3:?out dir}
mkdir -p "$out"
recipe=${GPU_CHECK_NCCL_RECIPE:-fashion-mlp}
read -ra flags <<<"${GPU_CHECK_NCCL_FLAGS:---steps 30 --batch 64 --no-eval --seed 1}"
if ! command -v mpirun >/dev/null 2>&1; then echo "nccl smoke: FAIL (mpirun not found: the NCCL path needs MPI)"; exit 1; fi
if ! "$bin" info --json | grep -q '"mpi_built": true'; then echo "nccl smoke: FAIL (this fathom was built without MPI)"; exit 1; fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
t0=$SECONDS
if ! timeout 240 "$bin" train "$recipe" "${flags[@]}" --device "$dev" --out "$out/plain" --json >"$out/plain.json" 2>"$out/plain.err"; then
  echo "nccl smoke: FAIL (the plain run failed: $(tail -c 400 "$out/plain.err"))"; exit 1
fi
# a session directory of its own: another mpirun sharing /tmp/ompi.HOST.UID can remove it as this one starts
mkdir -p "$out/ompi" && export OMPI_MCA_orte_tmpdir_base=$out/ompi
if ! timeout 240 mpirun -np 1 "$bin" train "$recipe" "${flags[@]}" --device "$dev" --out "$out/mpi" --json >"$out/mpi.json" 2>"$out/mpi.err"; then
  echo "nccl smoke: FAIL (mpirun -np 1 failed: $(tail -c 400 "$out/mpi.err"))"; exit 1
fi
grep -o 'loss [0-9.e+-]*' "$out/plain.err" | cut -d' ' -f2 >"$out/plain.loss"
grep -o 'loss [0-9.e+-]*' "$out/mpi.err" | cut -d' ' -f2 >"$out/mpi.loss"
n=$(wc -l <"$out/plain.loss")
if ((n == 0)) || [[ $n -ne $(wc -l <"$out/mpi.loss") ]]; then
  echo "nccl smoke: FAIL (logged losses: $n plain, $(wc -l <"$out/mpi.loss") under mpirun)"; exit 1
fi
worst=$(paste "$out/plain.loss" "$out/mpi.loss" | awk '{d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1;
  r = a > 0 ? d / a : d; if (r > w) w = r} END {printf "%.3g", w + 0}')
if ! awk -v w="$worst" 'BEGIN {exit !(w <= 1e-12)}'; then
  echo "nccl smoke: FAIL (largest relative loss difference $worst over $n logged steps)"; exit 1
fi
if [[ $dev == cuda* ]] && ! grep -q '"nccl":true' "$out/mpi.json"; then
  echo "nccl smoke: FAIL (the mpirun run did not use NCCL: $(head -c 300 "$out/mpi.json"))"; exit 1
fi
echo "nccl smoke: pass ($n logged losses equal, largest relative difference $worst; $((SECONDS - t0)) s)"
