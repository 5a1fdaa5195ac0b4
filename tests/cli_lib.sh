# Sourced by the tests/cli_*.sh scripts: the checks and the synthetic data they
# all used to write out for themselves.
#   cli_begin PREFIX    makes $tmp (removed on exit) and sets fails=0
#   ok MSG / bad MSG    record a passed / failed check
#   expect CODE NEEDLE CMD...
#                       runs CMD; checks its exit code and that NEEDLE (if not
#                       empty) is in its stdout+stderr
#   cli_images DIR NTRAIN NTEST
#                       DIR/{train,test}-{images,labels}: idx files of 8x8 u8
#                       images in 4 classes, each class a bright quadrant, so a
#                       tiny model learns them in a few steps (train seed 1,
#                       test seed 2: the same bytes in every script)
#   cli_idx_data DIR    prints the [data] section of a recipe reading them
#   cli_end NAME        prints the summary; exits 1 if any check failed
# A script sources it as: . "$(dirname "$0")/cli_lib.sh"

cli_begin() {
  tmp=$(mktemp -d "/tmp/${1:-fathom_cli}.XXXXXX") || { echo "FAIL: mktemp"; exit 1; }
  # shellcheck disable=SC2064  # $tmp is fixed now, on purpose
  trap "rm -rf '$tmp'" EXIT
  fails=0
}

ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

expect() {
  local code=$1 needle=$2; shift 2
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [[ $rc -ne $code ]]; then bad "$* -> exit $rc, expected $code: $out"; return; fi
  if [[ -n $needle && $out != *"$needle"* ]]; then bad "$* -> output lacks '$needle': $out"; return; fi
  ok "$* -> $code"
}

cli_images() {
  python3 - "$1" "$2" "$3" <<'PY' || { echo "FAIL: writing the synthetic images"; exit 1; }
import random, struct, sys
d, ntrain, ntest = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def split(name, n, seed):
    r = random.Random(seed); imgs = bytearray(); labs = bytearray()
    for i in range(n):
        c = i % 4; labs.append(c)
        for p in range(64):
            y, x = divmod(p, 8); q = (y >= 4) * 2 + (x >= 4)
            imgs.append(r.randrange(100) + (120 if q == c else 0))
    open(f"{d}/{name}-images", "wb").write(struct.pack(">BBBBIII", 0, 0, 8, 3, n, 8, 8) + imgs)
    open(f"{d}/{name}-labels", "wb").write(struct.pack(">BBBBI", 0, 0, 8, 1, n) + labs)
split("train", ntrain, 1)
split("test", ntest, 2)
PY
}

cli_idx_data() {
  printf '[data]\ndataset = idx\ntrain_images = %s/train-images\ntrain_labels = %s/train-labels\n' "$1" "$1"
  printf 'test_images = %s/test-images\ntest_labels = %s/test-labels\nnormalize = 0.3 0.25\n' "$1" "$1"
}

cli_end() {
  if ((fails)); then echo "$1: $fails failure(s)"; exit 1; fi
  echo "$1: all passed"
}
