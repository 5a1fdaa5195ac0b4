# Sourced by the tests/cli_*.sh scripts: the checks and the synthetic data they
# all used to write out for themselves.
#   cli_begin PREFIX    makes $tmp (removed on exit) and sets fails=0
#   ok MSG / bad MSG    record a passed / failed check
#   check MSG EXPR      evaluates the shell test EXPR: ok MSG if it holds, else bad MSG
#   cli_need_onnx_python
#                       skips the script (exit 77) unless python3 has onnx and numpy
#   expect CODE NEEDLE CMD...
#                       runs CMD; checks its exit code and that NEEDLE (if not
#                       empty) is in its stdout+stderr
#   cli_images DIR NTRAIN NTEST
#                       DIR/{train,test}-{images,labels}: idx files of 8x8 u8
#                       images in 4 classes, each class a bright quadrant, so a
#                       tiny model learns them in a few steps (train seed 1,
#                       test seed 2: the same bytes in every script)
#   cli_idx_data DIR    prints the [data] section of a recipe reading them
#   cli_idx_recipe DIR EPOCHS LAYER...
#                       prints a whole recipe on those images: [data], a
#                       [model] of input 1 8 8 and one `layer =` per LAYER,
#                       EPOCHS epochs of batch 32 (seed 3), Adam at lr 0.01
#   cli_tiny_gpt OUT NLINES TEXT
#                       trains a 2-layer, 32-wide byte-level GPT for 3 steps on
#                       NLINES lines of "TEXT N." into OUT (uses $bin; the
#                       corpus and recipe go in $tmp); exits 1 if training fails
#   cli_end NAME        prints the summary; exits 1 if any check failed
#   cli_py_check NAME SCRIPT WHAT
#                       a whole test whose checks are the Python file tests/SCRIPT (run as
#                       SCRIPT FATHOM_BIN TMPDIR under the worktree's .venv python when there
#                       is one): prints its report, skips (77) when it does, checks that it
#                       passed (WHAT), then cli_end NAME
# A script sources it as: . "$(dirname "$0")/cli_lib.sh"

cli_begin() {
  tmp=$(mktemp -d "/tmp/${1:-fathom_cli}.XXXXXX") || { echo "FAIL: mktemp"; exit 1; }
  # shellcheck disable=SC2064  # $tmp is fixed now, on purpose
  trap "rm -rf '$tmp'" EXIT
  fails=0
}

ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
check() { if eval "$2"; then ok "$1"; else bad "$1"; fi; }

cli_need_onnx_python() {
  python3 -c "import onnx, numpy" 2>/dev/null || { echo "SKIP: python3 with onnx and numpy is needed"; exit 77; }
}

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

cli_idx_recipe() {
  local dir=$1 epochs=$2 l; shift 2
  cli_idx_data "$dir"
  printf '[model]\ninput = 1 8 8\n'
  for l in "$@"; do printf 'layer = %s\n' "$l"; done
  printf '[train]\nepochs = %s\nbatch = 32\nseed = 3\n[optimizer]\nname = adam\nlr = 0.01\n' "$epochs"
}

cli_tiny_gpt() {
  local out=$1 n=$2 text=$3 i
  for ((i = 1; i <= n; i++)); do echo "$text $i."; done > "$tmp/corpus.txt"
  cat > "$tmp/tiny.ini" <<'INI'
[model]
type = gpt
arch = gpt2
n_layer = 2
n_head = 2
n_embd = 32
ffn_hidden = 64
block_size = 32
[tokenizer]
kind = byte
[train]
batch_size = 4
steps = 3
warmup = 1
lr = 1e-3
eval_every = 3
eval_batches = 1
ckpt_every = 3
log_every = 3
INI
  "$bin" train "$tmp/tiny.ini" --corpus "$tmp/corpus.txt" --out "$out" --quiet > /dev/null 2> "$tmp/tiny_train.err" ||
    { echo "FAIL: training the tiny GPT"; cat "$tmp/tiny_train.err"; exit 1; }
}

cli_end() {
  if ((fails)); then echo "$1: $fails failure(s)"; exit 1; fi
  echo "$1: all passed"
}

cli_py_check() {
  local py=python3 out rc
  [ -x .venv/bin/python ] && py=.venv/bin/python
  cli_begin "fathom_$1"
  out=$("$py" "$here/$2" "$bin" "$tmp" 2>&1); rc=$?
  echo "$out"
  [ $rc = 77 ] && exit 77
  check "$3" '[ $rc = 0 ]'
  cli_end "$1"
}
