#!/usr/bin/env bash
# Shell-level tests of `fathom train|eval|predict|recipes`: usage and exit codes,
# the --json contract, saving/evaluating/predicting with a model directory, and
# the bad-input cases (malformed recipe, unknown layer, incompatible stack,
# missing data set, NaN loss, a full disk while checkpointing).
# Usage: bash tests/cli_train.sh <path-to-fathom-binary>
set -uo pipefail
bin=${1:?usage: cli_train.sh FATHOM_BIN}
. "$(dirname "$0")/cli_lib.sh"
cli_begin fathom_cli_train

# ---- usage ----
for c in train eval predict recipes; do expect 0 "usage: fathom $c" "$bin" $c --help; done
expect 2 "no recipe given" "$bin" train
expect 2 "--epochs needs a whole number" "$bin" train fashion-cnn --epochs many
expect 2 "unknown option '--bogus'" "$bin" train fashion-cnn --bogus
expect 2 "more than one recipe" "$bin" train a.ini b.ini
expect 2 "no model directory" "$bin" eval
expect 2 "no inputs given" "$bin" predict somedir
expect 2 "unknown argument" "$bin" recipes extra
expect 0 "fashion-cnn" "$bin" recipes
expect 0 "fashion-mlp" "$bin" recipes
"$bin" recipes --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert {r["name"] for r in d["recipes"]} >= {"fashion-cnn","fashion-mlp"}' \
  && ok "recipes --json" || bad "recipes --json"

# ---- synthetic data: 4 classes of 8x8 images (a bright quadrant), idx + npy + png ----
cli_images "$tmp" 192 64
python3 - "$tmp" <<'PY'
import struct, sys, random, zlib
d = sys.argv[1]
test = open(f"{d}/test-images", "rb").read()[16:]  # the pixels after the idx header
# two samples as a float32 .npy [2, 1, 8, 8]
hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 1, 8, 8), }"
hdr += " " * (63 - (10 + len(hdr)) % 64) + "\n"
vals = struct.pack("<128f", *[b / 255.0 for b in test[:128]])
open(f"{d}/two.npy", "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + vals)
hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }"
hdr += " " * (63 - (10 + len(hdr)) % 64) + "\n"
open(f"{d}/five.npy", "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + struct.pack("<5f", 0, 1, 2, 3, 4))
# the second test sample as an 8x8 grayscale PNG
raw = b"".join(b"\x00" + bytes(test[64 + 8 * y: 64 + 8 * y + 8]) for y in range(8))
def chunk(t, b): return struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b) & 0xffffffff)
png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 8, 8, 8, 0, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
open(f"{d}/one.png", "wb").write(png)
PY

default_layers="layer = conv2d 4 3 padding=1
layer = batchnorm2d
layer = relu
layer = maxpool2d 2
layer = flatten
layer = linear 4"
default_opt="name = adam
lr = 0.01"
recipe() { # recipe FILE [optimizer lines] [layer lines]
  {
    echo "# synthetic: a tiny CNN on 8x8 images"
    echo "[data]"
    echo "dataset = idx"
    echo "train_images = $tmp/train-images"
    echo "train_labels = $tmp/train-labels"
    echo "test_images = $tmp/test-images"
    echo "test_labels = $tmp/test-labels"
    echo "normalize = 0.3 0.25"
    echo "[model]"
    echo "input = 1 8 8"
    echo "${3:-$default_layers}"
    echo "[train]"
    echo "epochs = 3"
    echo "batch = 32"
    echo "seed = 3"
    echo "[optimizer]"
    echo "${2:-$default_opt}"
  } > "$1"
}
recipe "$tmp/syn.ini"

# ---- train --json: exactly one JSON object on stdout ----
if "$bin" train "$tmp/syn.ini" --out "$tmp/model" --json > "$tmp/train.json" 2> "$tmp/train.err"; then
  python3 - "$tmp/train.json" <<'PY' && ok "train --json" || bad "train --json: $(cat "$tmp/train.json") $(cat "$tmp/train.err")"
import json, sys
d = json.loads(open(sys.argv[1]).read())  # the whole of stdout is one object
for k in ("test_accuracy", "train_loss", "epochs", "train_seconds", "samples_per_second", "peak_memory_bytes", "model_path"):
    assert k in d, k
assert d["epochs"] == 3 and d["test_accuracy"] > 0.9 and d["peak_memory_bytes"] > 0, d
assert d["model_path"].endswith("model.safetensors")
PY
else bad "train failed: $(cat "$tmp/train.err")"; fi
[[ -f $tmp/model/model.safetensors && -f $tmp/model/train_state.safetensors && -f $tmp/model/recipe.ini ]] \
  && ok "model directory complete" || bad "model directory incomplete: $(ls "$tmp/model")"
expect 0 "test accuracy" "$bin" train "$tmp/syn.ini" --out "$tmp/model_h" --epochs 1 --batch 16 --lr 0.005 --seed 4 --threads 1

# ---- eval and predict ----
"$bin" eval "$tmp/model" --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["samples"] == 64 and d["test_accuracy"] > 0.9, d' \
  && ok "eval --json" || bad "eval --json"
expect 0 "test accuracy" "$bin" eval "$tmp/model"
"$bin" predict "$tmp/model" "$tmp/test-images" "$tmp/two.npy" "$tmp/one.png" --json > "$tmp/pred.json" \
  && python3 - "$tmp/pred.json" <<'PY' && ok "predict idx/npy/png" || bad "predict: $(cat "$tmp/pred.json")"
import json, sys
d = json.load(open(sys.argv[1]))
p = d["predictions"]
assert len(p) == 64 + 2 + 1, len(p)
acc = sum(x["class"] == i % 4 for i, x in enumerate(p[:64])) / 64
assert acc > 0.9, acc
assert [x["class"] for x in p[64:66]] == [0, 1] and p[66]["class"] == 1, p[64:]
PY
expect 0 "class" "$bin" predict "$tmp/model" "$tmp/one.png"
expect 1 "does not fit the model's input [1, 8, 8]" "$bin" predict "$tmp/model" "$tmp/five.npy"
expect 1 "no such model directory" "$bin" eval "$tmp/nonexistent"

# ---- resume through the command ----
expect 0 "" "$bin" train "$tmp/syn.ini" --out "$tmp/r" --max-steps 4 --no-eval
expect 0 "resumed" "$bin" train "$tmp/syn.ini" --resume "$tmp/r"

# ---- a fresh run into a directory that holds a run is refused (the earlier model is kept) ----
snap() { (cd "$1" && find . -type f | sort | xargs sha256sum); }
before=$(snap "$tmp/r")
expect 1 "train: $tmp/r already holds a training run (2 checkpoints in $tmp/r/ckpt, the newest of step 18); nothing was written. --resume $tmp/r continues it, --overwrite trains afresh" \
  "$bin" train "$tmp/syn.ini" --out "$tmp/r" --no-eval
[[ "$(snap "$tmp/r")" == "$before" ]] && ok "the refused run changed no file of the earlier one" || bad "the refused run changed $tmp/r"
# the GPT trainer too (a model file alone counts)
mkdir -p "$tmp/gm" && cp "$tmp/r/model.safetensors" "$tmp/gm/"
printf '[model]\ntype = gpt\nn_layer = 1\nn_head = 2\nn_embd = 16\nffn_hidden = 32\nblock_size = 8\n[tokenizer]\nkind = char\n' > "$tmp/g.ini"
printf '[data]\ncorpus = %s/syn.ini\n[train]\nbatch_size = 2\nsteps = 2\n' "$tmp" >> "$tmp/g.ini"
expect 1 "train: $tmp/gm already holds a training run (a model, $tmp/gm/model.safetensors)" "$bin" train "$tmp/g.ini" --out "$tmp/gm"
expect 2 "--resume continues the run in its directory and --overwrite replaces it: give one" \
  "$bin" train "$tmp/syn.ini" --out "$tmp/r" --resume --overwrite
expect 0 "" "$bin" train "$tmp/syn.ini" --out "$tmp/r" --overwrite --max-steps 4 --no-eval
[[ -d $tmp/r/ckpt/step-00000004 && ! -e $tmp/r/ckpt/step-00000012 ]] && ok "--overwrite: the new run replaced the earlier one" ||
  bad "--overwrite: $(ls "$tmp/r/ckpt")"

# ---- bad input ----
printf '[model]\ninput = 1 8 8\nlayer = linear 4\n[train]\nepochs = lots\n' > "$tmp/bad.ini"
expect 1 "bad.ini:5: train.epochs: expected" "$bin" train "$tmp/bad.ini"
recipe "$tmp/unk.ini" "" "layer = flatten
layer = dense 4"
expect 1 "unknown layer 'dense'" "$bin" train "$tmp/unk.ini"
recipe "$tmp/shape.ini" "" "layer = flatten
layer = conv2d 4 3
layer = linear 4"
expect 1 "expects input [N, C, H, W] but the previous layers give [1, 64]" "$bin" train "$tmp/shape.ini"
printf '[data]\ndataset = fashion-mnist\npath = %s/none\n[model]\ninput = 1 28 28\nlayer = flatten\nlayer = linear 10\n' "$tmp" > "$tmp/nodata.ini"
expect 1 "apt-get install dataset-fashion-mnist" "$bin" train "$tmp/nodata.ini"
recipe "$tmp/nan.ini" "name = sgd
lr = 1e30"
expect 1 "training stopped" "$bin" train "$tmp/nan.ini" --out "$tmp/nan"

# ---- a full disk while checkpointing: the command fails, the old checkpoint survives ----
cp "$tmp/model/model.safetensors" "$tmp/model.bak"
cp "$tmp/model/train_state.safetensors" "$tmp/state.bak"
expect 1 "No space left on device" env FATHOM_TEST_FAIL_WRITE_AFTER=300 "$bin" train "$tmp/syn.ini" --resume "$tmp/model" --epochs 4 --no-eval
cmp -s "$tmp/model.bak" "$tmp/model/model.safetensors" && cmp -s "$tmp/state.bak" "$tmp/model/train_state.safetensors" \
  && ok "checkpoint intact after failed write" || bad "checkpoint changed by a failed write"
ls "$tmp/model" | grep -q '\.tmp\.' && bad "temporary file left behind" || ok "no temporary files left"
expect 0 "test accuracy" "$bin" eval "$tmp/model"

cli_end cli_train
