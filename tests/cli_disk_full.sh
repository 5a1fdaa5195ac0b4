#!/usr/bin/env bash
# A real full disk while checkpointing: training writes into a 640 KiB tmpfs
# (mounted in a private mount namespace) where the third checkpoint does not
# fit. The run must fail saying so, the two complete checkpoints must survive
# untouched with no temporary file left, eval must read the newest, and after
# the disk grows, --resume must end bitwise equal to an uninterrupted run. Then
# compile, quantize, prune and export on a tmpfs with room for one output: each
# fails naming its output, what was there stays byte for byte, no temporary left.
# Exits 77 (skipped) where no tmpfs can be mounted (no root, no unshare).
# Usage: bash tests/cli_disk_full.sh <path-to-fathom-binary>
set -uo pipefail
bin=$(realpath "${1:?usage: cli_disk_full.sh FATHOM_BIN}")
if [[ ${FATHOM_IN_NS:-} != 1 ]]; then
  # a skip says why: what failed, the tool's own words, and what would make it run
  command -v unshare > /dev/null ||
    { echo "SKIP: cli_disk_full: no unshare on PATH (util-linux) to make a private mount namespace for the tmpfs"; exit 77; }
  if ! why=$(unshare -m --propagation private true 2>&1); then
    echo "SKIP: cli_disk_full: cannot make a mount namespace for the tmpfs (unshare -m as uid $(id -u): ${why:-no message});" \
         "it needs root or CAP_SYS_ADMIN (a container started without it cannot)"
    exit 77
  fi
  FATHOM_IN_NS=1 exec unshare -m --propagation private bash "$0" "$bin"
fi
tmp=$(mktemp -d /tmp/fathom_full.XXXXXX)
trap 'umount "$tmp/disk" 2> /dev/null; rm -rf "$tmp"' EXIT
mkdir "$tmp/disk"
if ! why=$(mount -t tmpfs -o size=640k tmpfs "$tmp/disk" 2>&1); then
  echo "SKIP: cli_disk_full: cannot mount a 640 KiB tmpfs in the mount namespace (mount as uid $(id -u): ${why:-no message})"
  exit 77
fi
fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

python3 - "$tmp" <<'PY'
import struct, sys, random
d = sys.argv[1]
r = random.Random(1); imgs = bytearray(); labs = bytearray()
for i in range(64):
    c = i % 4; labs.append(c)
    for p in range(64):
        y, x = divmod(p, 8)
        imgs.append(r.randrange(100) + (120 if (y >= 4) * 2 + (x >= 4) == c else 0))
for name in ("train", "test"):
    open(f"{d}/{name}-images", "wb").write(struct.pack(">BBBBIII", 0, 0, 8, 3, 64, 8, 8) + imgs)
    open(f"{d}/{name}-labels", "wb").write(struct.pack(">BBBBI", 0, 0, 8, 1, 64) + labs)
PY
# 64*400 + 400*4 weights: a checkpoint is about 3 x 108 KB (weights + two Adam moments)
cat > "$tmp/r.ini" <<EOF
[data]
dataset = idx
train_images = $tmp/train-images
train_labels = $tmp/train-labels
test_images = $tmp/test-images
test_labels = $tmp/test-labels
[model]
input = 1 8 8
layer = flatten
layer = linear 400
layer = relu
layer = linear 4
[train]
epochs = 4
batch = 16
seed = 2
checkpoint_every = 2
[optimizer]
name = adam
lr = 0.003
EOF
"$bin" train "$tmp/r.ini" --out "$tmp/ref" --no-eval > /dev/null 2>&1 || bad "reference run failed"
out=$("$bin" train "$tmp/r.ini" --out "$tmp/disk/run" --no-eval 2>&1); rc=$?
[[ $rc -eq 1 && $out == *"No space left on device"* && $out == *"previous checkpoints"*"are unchanged"* ]] \
  && echo "ok: the full disk stops the run and says so" || bad "full disk: exit $rc: $out"
n=$(ls -d "$tmp"/disk/run/ckpt/step-* 2> /dev/null | grep -vc '\.tmp\.')
[[ $n -ge 1 ]] && echo "ok: $n complete checkpoint(s) survive" || bad "no complete checkpoint survived: $(ls -R "$tmp/disk/run")"
find "$tmp/disk/run" -name '*.tmp.*' | grep -q . && bad "temporary files left: $(find "$tmp/disk/run" -name '*.tmp.*')" \
  || echo "ok: no temporary files left"
"$bin" eval "$tmp/disk/run" > /dev/null 2>&1 && echo "ok: eval reads the newest complete checkpoint" || bad "eval failed"
mount -o remount,size=8m "$tmp/disk" || bad "remount failed"
out=$("$bin" train "$tmp/r.ini" --resume "$tmp/disk/run" --no-eval 2>&1) || bad "resume failed: $out"
[[ $out == *"resuming from $tmp/disk/run/ckpt/step-"* ]] || bad "resume does not say which checkpoint: $out"
cmp -s "$tmp/ref/model.safetensors" "$tmp/disk/run/model.safetensors" && echo "ok: resumed run is bitwise equal" \
  || bad "the resumed run's model differs from the uninterrupted run's"

# ---- the other writers on a full disk: a 192 KiB tmpfs holds one ~110 KB output, not two ----
mkdir "$tmp/small" && mount -t tmpfs -o size=192k tmpfs "$tmp/small" || bad "mounting the small tmpfs failed"
trap 'umount "$tmp/disk" "$tmp/small" 2> /dev/null; rm -rf "$tmp"' EXIT
full() { # full WHAT PATH CMD...: CMD must fail on the full disk naming PATH, leave PATH as it was, no temporary
  local what=$1 path=$2 before after out rc; shift 2
  before=$(cd "$tmp/small" && find . -type f | LC_ALL=C sort | xargs -r sha256sum)
  out=$("$@" 2>&1); rc=$?
  after=$(cd "$tmp/small" && find . -type f | LC_ALL=C sort | xargs -r sha256sum)
  if [[ $rc -ne 1 || $out != *"No space left on device"* || $out != *"$path"* ]]; then bad "$what on a full disk: exit $rc: $out"
  elif [[ $before != "$after" ]]; then bad "$what on a full disk changed what was there: $before -> $after"
  elif find "$tmp/small" -name '*.tmp.*' | grep -q .; then bad "$what on a full disk left $(find "$tmp/small" -name '*.tmp.*')"
  else echo "ok: $what on a full disk fails naming $path; the previous output is unchanged, no temporary left"; fi
}
"$bin" compile "$tmp/ref" -o "$tmp/small/g" > /dev/null 2>&1 || bad "compile into the small tmpfs failed"
full "compile over an earlier graph" "$tmp/small/g" "$bin" compile "$tmp/ref" -o "$tmp/small/g"
# the int8 graph is only ~30 KB: a filler leaves 16 KiB
avail=$(df --output=avail -B1 "$tmp/small" | tail -1)
head -c $((avail - 16384)) /dev/zero > "$tmp/small/filler" 2> /dev/null
full "quantize" "$tmp/small/q" "$bin" quantize "$tmp/ref" --int8 --dynamic -o "$tmp/small/q"
rm -f "$tmp/small/filler"
full "prune" "$tmp/small/p" "$bin" prune "$tmp/ref" --sparsity 0.5 -o "$tmp/small/p"
full "export (ONNX)" "$tmp/small/m.onnx" "$bin" export "$tmp/ref" -o "$tmp/small/m.onnx"
"$bin" eval "$tmp/small/g" > /dev/null 2>&1 && echo "ok: the earlier graph still evaluates" || bad "the earlier graph does not evaluate"
rm -rf "$tmp/small/g"
"$bin" export "$tmp/ref" -o "$tmp/small/m.onnx" > /dev/null 2>&1 || bad "export into the small tmpfs failed"
full "export over an earlier ONNX file" "$tmp/small/m.onnx" "$bin" export "$tmp/ref" -o "$tmp/small/m.onnx"
if ((fails)); then echo "cli_disk_full: $fails failure(s)"; exit 1; fi
echo "cli_disk_full: all passed"
