#!/usr/bin/env bash
# Never save poison: a run whose weights become non-finite, whose validation
# loss becomes NaN, or whose loss explodes (divergence_factor) stops with an
# error naming the last good checkpoint, and that checkpoint (and every other
# file in the output directory) is left exactly as it was.
# Usage: bash tests/cli_poison.sh <path-to-fathom-binary>
set -uo pipefail
bin=${1:?usage: cli_poison.sh FATHOM_BIN}
tmp=$(mktemp -d /tmp/fathom_poison.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
snapshot() { (cd "$1" && find . -type f | sort | xargs sha256sum); }

python3 - "$tmp" <<'PY'
import struct, sys, random
d = sys.argv[1]
r = random.Random(1); imgs = bytearray(); labs = bytearray()
for i in range(64):
    c = i % 4; labs.append(r.randrange(4))  # noisy labels: no step size drives the loss to 0
    for p in range(64):
        y, x = divmod(p, 8)
        imgs.append(r.randrange(100) + (120 if (y >= 4) * 2 + (x >= 4) == c else 0))
open(f"{d}/train-images", "wb").write(struct.pack(">BBBBIII", 0, 0, 8, 3, 64, 8, 8) + imgs)
open(f"{d}/train-labels", "wb").write(struct.pack(">BBBBI", 0, 0, 8, 1, 64) + labs)
open(f"{d}/corpus.txt", "w").write("in the beginning god created the heaven and the earth\n" * 40)
PY
plain() { # FILE EXTRA-TRAIN-LINES
  printf '[data]\ndataset = idx\ntrain_images = %s/train-images\ntrain_labels = %s/train-labels\n' "$tmp" "$tmp" > "$1"
  printf '[model]\ninput = 1 8 8\nlayer = flatten\nlayer = linear 4\n[train]\nepochs = 2\nbatch = 16\nseed = 1\n%s\n' "$2" >> "$1"
  printf '[optimizer]\nname = sgd\nlr = 0.01\n' >> "$1"
}

# ---- plain: weights that overflow to inf are refused at the checkpoint (divergence check off) ----
plain "$tmp/p.ini" "checkpoint_every = 1
divergence_factor = 0"
"$bin" train "$tmp/p.ini" --out "$tmp/p" --no-eval --max-steps 2 > /dev/null 2>&1 || bad "plain: the good run failed"
before=$(snapshot "$tmp/p")
out=$("$bin" train "$tmp/p.ini" --resume "$tmp/p" --no-eval --lr 1e300 2>&1); rc=$?
[[ $rc -eq 1 && $out == *"became non-finite"* && $out == *"The last good checkpoint (step 2) in $tmp/p/ckpt is untouched"* ]] \
  && echo "ok: plain: non-finite weights stop the run" || bad "plain inf weights: exit $rc: $out"
[[ "$(snapshot "$tmp/p")" == "$before" ]] && echo "ok: plain: the output directory is unchanged" || bad "plain: files changed"

# ---- plain: a loss that explodes over its running minimum (default divergence_factor 1e3) ----
plain "$tmp/d.ini" "checkpoint_every = 1"
"$bin" train "$tmp/d.ini" --out "$tmp/d" --no-eval --max-steps 2 > /dev/null 2>&1 || bad "divergence: the good run failed"
before=$(snapshot "$tmp/d")
out=$("$bin" train "$tmp/d.ini" --resume "$tmp/d" --no-eval --lr 1e6 2>&1); rc=$?
[[ $rc -eq 1 && $out == *"training stopped"* && $out == *"last good checkpoint (step "* ]] \
  && echo "ok: plain: divergence stops the run" || bad "plain divergence: exit $rc: $out"
# checkpoints it committed before the loss exploded are finite ones; the one it resumed from is untouched
[[ "$(snapshot "$tmp/d" | grep ckpt/step-00000002/)" == "$(echo "$before" | grep ckpt/step-00000002/)" ]] \
  || bad "divergence: the checkpoint the run resumed from changed"

# ---- GPT: AdamW at lr 1e3 explodes (the issue saw a loss of 1e17 pass) ----
gpt() { # FILE LR
  printf '[model]\ntype = gpt\nn_layer = 1\nn_head = 2\nn_embd = 16\nffn_hidden = 32\nblock_size = 16\n' > "$1"
  printf '[tokenizer]\nkind = char\n[data]\ncorpus = %s/corpus.txt\n' "$tmp" >> "$1"
  printf '[train]\nbatch_size = 4\nsteps = 12\nwarmup = 0\nlr = %s\nmin_lr = %s\ngrad_clip = 0\neval_every = 1\neval_batches = 1\nckpt_every = 1\nseed = 1\n' "$2" "$2" >> "$1"
}
gpt "$tmp/g.ini" 1e-3
"$bin" train "$tmp/g.ini" --out "$tmp/g" --stop-after 2 --quiet > /dev/null 2>&1 || bad "gpt: the good run failed"
before=$(snapshot "$tmp/g")
gpt "$tmp/g-big.ini" 1e3
out=$("$bin" train "$tmp/g-big.ini" --out "$tmp/g" --resume --quiet 2>&1); rc=$?
[[ $rc -eq 1 && $out == *"training stopped"* && $out == *"last good checkpoint (step "*") in $tmp/g/ckpt is untouched"* ]] \
  && echo "ok: gpt: an exploding loss stops the run" || bad "gpt lr 1e3: exit $rc: $out"
# checkpoints committed by this run before it stopped are complete and finite; the
# step-2 one it started from is untouched
[[ "$(sha256sum < "$tmp/g/ckpt/step-00000002/model.safetensors")" == \
   "$(echo "$before" | grep './ckpt/step-00000002/model.safetensors' | cut -d' ' -f1)  -" ]] \
  || bad "gpt: the checkpoint the run resumed from changed"
python3 - "$tmp/g" <<'PY' || bad "gpt: a committed checkpoint holds non-finite weights"
import json, struct, sys, glob, math, array
for f in glob.glob(sys.argv[1] + "/ckpt/step-*/model.safetensors"):
    b = open(f, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); data = b[8 + n:]
    for k, v in h.items():
        if k == "__metadata__": continue
        a = array.array("f"); a.frombytes(data[v["data_offsets"][0]:v["data_offsets"][1]])
        assert all(math.isfinite(x) for x in a), (f, k)
PY
echo "$out" | grep -q "became\|diverged" || bad "gpt: the message does not say what went wrong: $out"

# ---- a model file with NaN weights (not written by fathom's trainers) is refused by eval and generate ----
nanify() { # DIR: the first tensor's first value becomes NaN (a new file, not through the hard links)
  python3 - "$1/model.safetensors" <<'PY'
import json, struct, sys, os
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); k = sorted(x for x in h if x != "__metadata__")[0]
o = 8 + n + h[k]["data_offsets"][0]; b[o:o + 4] = struct.pack("<f", float("nan"))
os.unlink(p); open(p, "wb").write(b)
PY
}
cp -r "$tmp/p" "$tmp/p-nan" && nanify "$tmp/p-nan"
out=$("$bin" eval "$tmp/p-nan" --data "$tmp" 2>&1); rc=$?
[[ $rc -ne 0 && $out == *"holds NaN or inf values"* ]] && echo "ok: eval refuses NaN weights" || bad "eval of NaN weights: exit $rc: $out"
mkdir "$tmp/g-nan" && cp "$tmp/g"/{config.json,tokenizer.txt,model.safetensors} "$tmp/g-nan/" && nanify "$tmp/g-nan"
out=$("$bin" generate "$tmp/g-nan" --prompt "in the" --tokens 4 2>&1); rc=$?
[[ $rc -ne 0 && $out == *"holds NaN or inf values"* ]] && echo "ok: generate refuses NaN weights" || bad "generate of NaN weights: exit $rc: $out"

if ((fails)); then echo "cli_poison: $fails failure(s)"; exit 1; fi
echo "cli_poison: all passed"
