# Sourced by the multi-process tests (cli_dist*.sh) after they set $bin: skips the test
# (exit 77) when mpirun is missing or this fathom was built without MPI, lets OpenMPI run
# as root (CI does) with more ranks than cores, and defines mpi() (MPI_TIMEOUT seconds,
# default 120; a launch failure of OpenMPI's own is retried, below), field() (FILE KEY: the first number after "KEY": in FILE) and remanifest()
# (DIR: a checkpoint unit's MANIFEST file lines recomputed from the files there). Under the
# sanitizer build leaks are not checked here: OpenMPI's own allocations kept to exit
# cannot be told from ours (CMakeLists.txt, test_dist_np2); the one-process tests check
# leaks.
if ! command -v mpirun >/dev/null 2>&1; then echo "SKIP: mpirun not installed (apt-get install openmpi-bin)"; exit 77; fi
if ! "$bin" info --json | grep -q '"mpi_built": true'; then echo "SKIP: this fathom was built without MPI"; exit 77; fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1
# mpirun, retried (twice at most, said on stderr) only when OpenMPI itself could not start the
# ranks ("N total processes failed to start"; seen under load, exit 132, before fathom ran):
# any other failure, a rank's crash or signal included, is returned as it is. Its stderr is
# held until mpirun ends, then written to the caller's stderr; stdout is passed through.
# Each mpirun gets its own session directory (orte_tmpdir_base): two of one user sharing
# /tmp/ompi.HOST.UID race on it under ctest -j2 ("orte_session_dir failed", OpenMPI 4).
mpi() {
  local err rc try sd
  err=$(mktemp /tmp/fathom_mpi_err.XXXXXX)
  sd=$(mktemp -d /tmp/fathom_ompi.XXXXXX)
  for try in 1 2 3; do
    OMPI_MCA_orte_tmpdir_base=$sd timeout "${MPI_TIMEOUT:-120}" mpirun --oversubscribe "$@" 2> "$err"; rc=$?
    if ((rc != 0 && try < 3)) && grep -q "processes failed to start" "$err" && ! grep -qi "signal" "$err"; then
      echo "note: OpenMPI could not start the ranks (exit $rc, attempt $try of 3): retrying" >&2
      continue
    fi
    break
  done
  cat "$err" >&2
  rm -rf "$err" "$sd"
  return $rc
}
field() { grep -o "\"$2\":[-0-9.e]*" "$1" | head -1 | cut -d: -f2; }
remanifest() {
  python3 - "$1" <<'PY'
import os, sys, zlib
d = sys.argv[1]
out = []
for l in open(os.path.join(d, 'MANIFEST')).read().splitlines():
    if l.startswith('file '):
        n = l.split()[1]
        if not os.path.exists(os.path.join(d, n)):
            continue
        b = open(os.path.join(d, n), 'rb').read()
        l = 'file %s %d %08x' % (n, len(b), zlib.crc32(b) & 0xffffffff)
    out.append(l)
open(os.path.join(d, 'MANIFEST'), 'w').write('\n'.join(out) + '\n')
PY
}
