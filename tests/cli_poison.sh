#!/usr/bin/env bash
# Never save poison: a run whose weights or optimizer moments become non-finite,
# whose validation loss becomes NaN, or whose loss explodes (divergence_factor,
# configurable, 0 = off) stops with an error naming the last good checkpoint, and
# that checkpoint (and every other file in the output directory) is left exactly
# as it was. Each case is checked for both trainers (plain and GPT recipes), the
# validation loss for GPT only (the plain trainer evaluates after its last
# checkpoint). eval, predict and generate refuse weights holding NaN.
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
plain() { # FILE EXTRA-TRAIN-LINES [OPTIMIZER]
  printf '[data]\ndataset = idx\ntrain_images = %s/train-images\ntrain_labels = %s/train-labels\n' "$tmp" "$tmp" > "$1"
  printf '[model]\ninput = 1 8 8\nlayer = flatten\nlayer = linear 4\n[train]\nepochs = 2\nbatch = 16\nseed = 1\n%s\n' "$2" >> "$1"
  printf '[optimizer]\nname = %s\nlr = 0.01\n' "${3:-sgd}" >> "$1"
}
# finite OUT: every committed checkpoint's model and optimizer state hold finite values only
finite() {
  python3 - "$1" <<'PY'
import json, struct, sys, glob, math, array
for f in glob.glob(sys.argv[1] + "/ckpt/step-*/*.safetensors"):
    b = open(f, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); data = b[8 + n:]
    for k, v in h.items():
        if k == "__metadata__" or v["dtype"] != "F32": continue
        a = array.array("f"); a.frombytes(data[v["data_offsets"][0]:v["data_offsets"][1]])
        assert all(math.isfinite(x) for x in a), (f, k)
PY
}
# poke CKPT TENSOR VALUE: one value of the checkpoint's train_state.safetensors becomes VALUE
# (TENSOR meta:KEY: the metadata value KEY becomes the string VALUE)
# (a new file, not through the hard links), and the MANIFEST is rewritten to match, so that
# the checkpoint is complete and resumes: only the finiteness check can stop it.
poke() {
  python3 - "$@" <<'PY'
import json, os, struct, sys, zlib
d, name, val = sys.argv[1], sys.argv[2], sys.argv[3]
p = os.path.join(d, "train_state.safetensors")
b = bytearray(open(p, "rb").read()); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
if name.startswith("meta:"):  # a metadata value instead (header re-padded to 8 bytes; offsets are data-relative)
    h["__metadata__"][name[5:]] = val; j = json.dumps(h).encode(); j += b" " * (-len(j) % 8)
    b = bytearray(struct.pack("<Q", len(j))) + j + b[8 + n:]
else:
    o = 8 + n + h[name]["data_offsets"][0]; b[o:o + 4] = struct.pack("<f", float(val))
os.unlink(p); open(p, "wb").write(b)
m = []
for l in open(os.path.join(d, "MANIFEST")).read().splitlines():
    if l.startswith("file "):
        f = l.split()[1]; c = open(os.path.join(d, f), "rb").read()
        l = "file %s %d %08x" % (f, len(c), zlib.crc32(c) & 0xffffffff)
    m.append(l)
open(os.path.join(d, "MANIFEST"), "w").write("\n".join(m) + "\n")
PY
}

# ---- plain: weights that overflow to inf are refused at the checkpoint (divergence check off) ----
plain "$tmp/p.ini" "checkpoint_every = 1
divergence_factor = 0"
"$bin" train "$tmp/p.ini" --out "$tmp/p" --no-eval --max-steps 2 > /dev/null 2>&1 || bad "plain: the good run failed"
before=$(snapshot "$tmp/p")
out=$("$bin" train "$tmp/p.ini" --resume "$tmp/p" --no-eval --lr 1e300 2>&1); rc=$?
[[ $rc -eq 1 && $out == *"weight '"*"' became non-finite"* && $out == *"The last good checkpoint (step 2) in $tmp/p/ckpt is untouched"* ]] \
  && echo "ok: plain: non-finite weights stop the run" || bad "plain inf weights: exit $rc: $out"
[[ "$(snapshot "$tmp/p")" == "$before" ]] && echo "ok: plain: the output directory is unchanged" || bad "plain: files changed"

# ---- plain: a loss that explodes over its running minimum (default divergence_factor 1e3) ----
plain "$tmp/d.ini" "checkpoint_every = 1"
"$bin" train "$tmp/d.ini" --out "$tmp/d" --no-eval --max-steps 2 > /dev/null 2>&1 || bad "divergence: the good run failed"
cp -r "$tmp/d" "$tmp/d-good"
before=$(snapshot "$tmp/d")
out=$("$bin" train "$tmp/d.ini" --resume "$tmp/d" --no-eval --lr 1e6 2>&1); rc=$?
[[ $rc -eq 1 && $out == *"the loss diverged: "*" is over 1000 x its running minimum"*"(divergence_factor)"* &&
   $out == *"training stopped"* && $out == *"last good checkpoint (step "* ]] \
  && echo "ok: plain: divergence stops the run" || bad "plain divergence: exit $rc: $out"
# checkpoints it committed before the loss exploded are finite ones; the one it resumed from is untouched
[[ "$(snapshot "$tmp/d" | grep ckpt/step-00000002/)" == "$(echo "$before" | grep ckpt/step-00000002/)" ]] \
  || bad "divergence: the checkpoint the run resumed from changed"
# the loss that exploded (step 3's) was computed on the weights checkpoint 3 holds: that one is
# set aside (ckpt/step-00000003.diverged), OUT/ links to step 2 again, and --resume picks step 2
[[ $out == *"The checkpoint of step 3 holds the weights that gave this loss: moved to $tmp/d/ckpt/step-00000003.diverged"* &&
   $out == *"The last good checkpoint (step 2) in $tmp/d/ckpt is untouched"* && -d $tmp/d/ckpt/step-00000003.diverged &&
   ! -e $tmp/d/ckpt/step-00000003 ]] && echo "ok: plain: the checkpoint holding the diverged weights is set aside" \
  || bad "plain divergence: step 3 not set aside: $(ls "$tmp/d/ckpt"): $out"
cmp -s "$tmp/d/model.safetensors" "$tmp/d/ckpt/step-00000002/model.safetensors" || bad "plain divergence: OUT/ not linked to step 2"
out=$("$bin" train "$tmp/d.ini" --resume "$tmp/d" --no-eval --max-steps 3 2>&1)
[[ $out == *"resuming from $tmp/d/ckpt/step-00000002 (step 2)"* ]] && echo "ok: plain: --resume after divergence starts from step 2" \
  || bad "plain divergence: resume did not pick step 2: $out"
# with keep_checkpoints = 1 there is no earlier one to go back to: nothing moves, and the message says so
plain "$tmp/k1.ini" "checkpoint_every = 1
keep_checkpoints = 1"
cp -r "$tmp/d-good" "$tmp/k1" && rm -rf "$tmp/k1/ckpt/step-00000001"
out=$("$bin" train "$tmp/k1.ini" --resume "$tmp/k1" --no-eval --lr 1e6 2>&1); rc=$?
[[ $rc -eq 1 && $out == *"The checkpoint of step 3 in $tmp/k1/ckpt holds the weights that gave this loss, and no earlier one is kept"* &&
   -d $tmp/k1/ckpt/step-00000003 ]] && echo "ok: plain: keep_checkpoints = 1: the diverged checkpoint is named, not moved" \
  || bad "plain divergence, keep 1: exit $rc: $(ls "$tmp/k1/ckpt"): $out"

# the limit is the recipe's: at lr 10 the loss rises about 10x (1.47 -> 15.7) in one step,
# which divergence_factor = 10 stops and the default 1e3 lets run to the end; 0 turns it off
for f in 10 1000 0; do
  plain "$tmp/d$f.ini" "checkpoint_every = 1
divergence_factor = $f"
  rm -rf "$tmp/d$f" && cp -r "$tmp/d-good" "$tmp/d$f"
  out=$("$bin" train "$tmp/d$f.ini" --resume "$tmp/d$f" --no-eval --lr 10 2>&1); rc=$?
  if [ "$f" = 10 ]; then
    [[ $rc -eq 1 && $out == *"is over 10 x its running minimum"*"(divergence_factor)"* ]] \
      && echo "ok: plain: divergence_factor = 10 stops a 10x rise" || bad "plain divergence_factor 10: exit $rc: $out"
  else
    [[ $rc -eq 0 && $out != *diverged* ]] && echo "ok: plain: divergence_factor = $f lets a 10x rise run" \
      || bad "plain divergence_factor $f: exit $rc: $out"
  fi
done

# the running minimum is saved with each checkpoint: a run resumed from step 4 (whose loss, 1.3177, is
# the lowest) stops where the uninterrupted run stops, step 5's 1.4195 being over 1.076 x 1.3177; the
# minimum restarting from the first resumed loss let the resumed run go to its end (previous binary)
plain "$tmp/m.ini" "checkpoint_every = 1
divergence_factor = 1.076"
whole=$("$bin" train "$tmp/m.ini" --out "$tmp/m-whole" --no-eval 2>&1 | grep -o "the loss diverged: [^;]* at step [0-9]*")
"$bin" train "$tmp/m.ini" --out "$tmp/m" --no-eval --max-steps 4 > /dev/null 2>&1 || bad "running minimum: the first 4 steps failed"
resumed=$("$bin" train "$tmp/m.ini" --resume "$tmp/m" --no-eval 2>&1 | grep -o "the loss diverged: [^;]* at step [0-9]*")
[[ -n $whole && $whole == *"running minimum 1.3177"* && "$resumed" == "$whole" ]] \
  && echo "ok: plain: a resumed run keeps the loss's running minimum ($resumed)" \
  || bad "running minimum across a resume: uninterrupted '$whole', resumed '$resumed'"

# a damaged running minimum in the checkpoint is refused by name at resume, and nothing is written
"$bin" train "$tmp/m.ini" --out "$tmp/m-bad" --no-eval --max-steps 4 > /dev/null 2>&1 || bad "damaged minimum: the first 4 steps failed"
poke "$tmp/m-bad/ckpt/step-00000004" meta:loss_min abc
before=$(snapshot "$tmp/m-bad")
out=$("$bin" train "$tmp/m.ini" --resume "$tmp/m-bad" --no-eval 2>&1); rc=$?
[[ $rc -ne 0 && $out == *"loss_min is 'abc', not a finite number"* && $out == *"step-00000004"* &&
   "$(snapshot "$tmp/m-bad")" == "$before" ]] \
  && echo "ok: plain: a damaged loss_min is refused at resume, files unchanged" || bad "plain damaged loss_min: exit $rc: $out"

# ---- plain, fp16: a non-finite loss is the loss scaler's to skip, not a reason to stop ----
# (lr 1e6: after the first update every loss overflows; each such step is skipped, the
# weights stay finite, the run ends with exit 0 and reports the skipped steps)
plain "$tmp/h.ini" "checkpoint_every = 1"
out=$("$bin" train "$tmp/h.ini" --out "$tmp/h" --no-eval --precision fp16 --lr 1e6 --json 2> "$tmp/h.err"); rc=$?
skipped=$(echo "$out" | python3 -c "import json, sys; print(json.load(sys.stdin)['skipped_steps'])" 2> /dev/null)
[[ $rc -eq 0 && ${skipped:-0} -gt 0 ]] && ! grep -q "training stopped" "$tmp/h.err" && finite "$tmp/h" \
  && echo "ok: plain fp16: non-finite losses are skipped steps ($skipped), not a stop" \
  || bad "plain fp16 skip: exit $rc, skipped '${skipped}': $(tail -2 "$tmp/h.err")"

# ---- plain: a non-finite optimizer moment (Adam's exp_avg_sq = inf leaves the weights finite:
# the update is m / sqrt(inf) = 0) is refused before the next checkpoint is committed ----
plain "$tmp/a.ini" "checkpoint_every = 1" adam
"$bin" train "$tmp/a.ini" --out "$tmp/a" --no-eval --max-steps 2 > /dev/null 2>&1 || bad "plain adam: the good run failed"
poke "$tmp/a/ckpt/step-00000002" 1.weight.exp_avg_sq inf
before=$(snapshot "$tmp/a/ckpt")  # (OUT/NAME are re-linked to the checkpoint resumed from)
out=$("$bin" train "$tmp/a.ini" --resume "$tmp/a" --no-eval 2>&1); rc=$?
[[ $rc -eq 1 && $out == *"optimizer state '1.weight.exp_avg_sq' became non-finite"* &&
   $out == *"The last good checkpoint (step 2) in $tmp/a/ckpt is untouched"* ]] \
  && echo "ok: plain: a non-finite optimizer moment stops the run" || bad "plain inf moment: exit $rc: $out"
[[ "$(snapshot "$tmp/a/ckpt")" == "$before" ]] && echo "ok: plain: no checkpoint with the inf moment was written" \
  || bad "plain inf moment: files changed"

# ---- GPT: AdamW at lr 1e3 explodes (the issue saw a loss of 1e17 pass) ----
gpt() { # FILE LR
  printf '[model]\ntype = gpt\nn_layer = 1\nn_head = 2\nn_embd = 16\nffn_hidden = 32\nblock_size = 16\n' > "$1"
  printf '[tokenizer]\nkind = char\n[data]\ncorpus = %s/corpus.txt\n' "$tmp" >> "$1"
  printf '[train]\nbatch_size = 4\nsteps = 12\nwarmup = 0\nlr = %s\nmin_lr = %s\ngrad_clip = 0\neval_every = 1\neval_batches = 1\nckpt_every = 1\nseed = 1\n' "$2" "$2" >> "$1"
}
gpt "$tmp/g.ini" 1e-3
"$bin" train "$tmp/g.ini" --out "$tmp/g" --stop-after 2 --quiet > /dev/null 2>&1 || bad "gpt: the good run failed"
cp -r "$tmp/g" "$tmp/g-good"
before=$(snapshot "$tmp/g")
gpt "$tmp/g-big.ini" 1e3
out=$("$bin" train "$tmp/g-big.ini" --out "$tmp/g" --resume --quiet 2>&1); rc=$?
[[ $rc -eq 1 && $out == *"the loss diverged: "*" is over 1000 x its running minimum"*"(divergence_factor)"* &&
   $out == *"training stopped"* && $out == *"last good checkpoint (step "*") in $tmp/g/ckpt is untouched"* ]] \
  && echo "ok: gpt: an exploding loss stops the run" || bad "gpt lr 1e3: exit $rc: $out"
# checkpoints committed by this run before it stopped are complete and finite; the
# step-2 one it started from is untouched
[[ "$(sha256sum < "$tmp/g/ckpt/step-00000002/model.safetensors")" == \
   "$(echo "$before" | grep './ckpt/step-00000002/model.safetensors' | cut -d' ' -f1)  -" ]] \
  || bad "gpt: the checkpoint the run resumed from changed"
finite "$tmp/g" || bad "gpt: a committed checkpoint holds non-finite weights"
[[ $out == *"The checkpoint of step 3 holds the weights that gave this loss: moved to $tmp/g/ckpt/step-00000003.diverged"* &&
   -d $tmp/g/ckpt/step-00000003.diverged && ! -e $tmp/g/ckpt/step-00000003 ]] \
  && cmp -s "$tmp/g/model.safetensors" "$tmp/g/ckpt/step-00000002/model.safetensors" \
  && echo "ok: gpt: the checkpoint holding the diverged weights is set aside, OUT/ links to step 2" \
  || bad "gpt divergence: step 3 not set aside: $(ls "$tmp/g/ckpt"): $out"

# the running minimum is saved with each GPT checkpoint too: at lr 3e-2 step 11's loss (2.2396)
# is the lowest and step 12's (2.5423) is over 1.05 x it; a run resumed from step 11 stops as
# the uninterrupted one does (the previous binary's resumed run started the minimum at 2.5423
# and finished)
gpt "$tmp/gm.ini" 3e-2
echo "divergence_factor = 1.05" >> "$tmp/gm.ini"
whole=$("$bin" train "$tmp/gm.ini" --out "$tmp/gm-whole" --quiet 2>&1 | grep -o "the loss diverged: [^;]* at step [0-9]*")
"$bin" train "$tmp/gm.ini" --out "$tmp/gm" --stop-after 11 --quiet > /dev/null 2>&1 || bad "gpt running minimum: the first 11 steps failed"
resumed=$("$bin" train "$tmp/gm.ini" --out "$tmp/gm" --resume --quiet 2>&1 | grep -o "the loss diverged: [^;]* at step [0-9]*")
[[ -n $whole && $whole == *"running minimum 2.2395"* && "$resumed" == "$whole" ]] \
  && echo "ok: gpt: a resumed run keeps the loss's running minimum ($resumed)" \
  || bad "gpt running minimum across a resume: uninterrupted '$whole', resumed '$resumed'"

# the same run with the divergence check off: at lr 1e3 the weights become non-finite
# (eval off), and the checkpoint check refuses them
gpt "$tmp/g-nf.ini" 1e3
echo "divergence_factor = 0" >> "$tmp/g-nf.ini"
rm -rf "$tmp/g-nf" && cp -r "$tmp/g-good" "$tmp/g-nf"
before=$(snapshot "$tmp/g-nf/ckpt")
out=$("$bin" train "$tmp/g-nf.ini" --out "$tmp/g-nf" --resume --quiet --no-eval 2>&1); rc=$?
# (which goes non-finite first, a weight or its AdamW second moment, depends on the GEMM
# provider's summation order: both stop the run at that step)
[[ $rc -eq 1 && ($out == *"weight '"*"' became non-finite"* || $out == *"optimizer state '"*"' became non-finite"*) &&
   $out == *"last good checkpoint (step "*") in $tmp/g-nf/ckpt is untouched"* ]] \
  && echo "ok: gpt: non-finite weights stop the run" || bad "gpt inf weights: exit $rc: $out"
# the checkpoint the message names exists, and every committed one (this run's too) is finite
good=$(echo "$out" | sed -n 's/.*last good checkpoint (step \([0-9]*\)).*/\1/p')
[[ -n $good && -f "$tmp/g-nf/ckpt/step-$(printf %08d "$good")/MANIFEST" ]] || bad "gpt inf weights: no checkpoint step $good"
at=$(echo "$out" | sed -n 's/.* at step \([0-9]*\); training stopped.*/\1/p')
[[ -n $at && $at -eq $((good + 1)) ]] || bad "gpt inf weights: stopped 'at step $at' but the last good checkpoint is $good: $out"
finite "$tmp/g-nf" || bad "gpt inf weights: a committed checkpoint holds non-finite weights"

# ---- GPT: a damaged running minimum in the checkpoint is refused by name at resume ----
rm -rf "$tmp/g-lm" && cp -r "$tmp/g-good" "$tmp/g-lm"
poke "$tmp/g-lm/ckpt/step-00000002" meta:loss_min 1e999
before=$(snapshot "$tmp/g-lm/ckpt")
out=$("$bin" train "$tmp/g.ini" --out "$tmp/g-lm" --resume --quiet 2>&1); rc=$?
[[ $rc -ne 0 && $out == *"loss_min is '1e999', not a finite number"* && $out == *"step-00000002"* &&
   "$(snapshot "$tmp/g-lm/ckpt")" == "$before" ]] \
  && echo "ok: gpt: a damaged loss_min is refused at resume, files unchanged" || bad "gpt damaged loss_min: exit $rc: $out"

# ---- GPT: a non-finite validation loss stops the run before the checkpoint of that step ----
# (lr 1e30: the first update leaves weights whose validation loss is NaN; validation runs
# after each step and before its checkpoint)
gpt "$tmp/g-val.ini" 1e30
rm -rf "$tmp/g-val" && cp -r "$tmp/g-good" "$tmp/g-val"
before=$(snapshot "$tmp/g-val")
out=$("$bin" train "$tmp/g-val.ini" --out "$tmp/g-val" --resume --quiet 2>&1); rc=$?
# (step 3: the log's count, "step 3  val loss nan"; it said "at step 2" before, the index of the step)
[[ $rc -eq 1 && $out == *"the validation loss became "*"nan at step 3; training stopped"* &&
   $out == *"The last good checkpoint (step 2) in $tmp/g-val/ckpt is untouched"* ]] \
  && echo "ok: gpt: a non-finite validation loss stops the run" || bad "gpt NaN validation loss: exit $rc: $out"
[[ "$(snapshot "$tmp/g-val")" == "$before" ]] && echo "ok: gpt: after a NaN validation loss every file is unchanged" \
  || bad "gpt NaN validation loss: files changed"

# ---- GPT: the divergence limit is the recipe's (lr 10: the loss rises about 80x over its
# minimum within a few steps: stopped by divergence_factor = 10, not by the default 1e3) ----
for f in 10 1000; do
  gpt "$tmp/g$f.ini" 10
  echo "divergence_factor = $f" >> "$tmp/g$f.ini"
  rm -rf "$tmp/g$f" && cp -r "$tmp/g-good" "$tmp/g$f"
  out=$("$bin" train "$tmp/g$f.ini" --out "$tmp/g$f" --resume --quiet 2>&1); rc=$?
  if [ "$f" = 10 ]; then
    [[ $rc -eq 1 && $out == *"the loss diverged: "*" is over 10 x its running minimum"*"(divergence_factor)"* ]] \
      && echo "ok: gpt: divergence_factor = 10 stops the run" || bad "gpt divergence_factor 10: exit $rc: $out"
  else
    [[ $rc -eq 0 && $out != *diverged* ]] && echo "ok: gpt: divergence_factor = 1000 lets it run" \
      || bad "gpt divergence_factor 1000: exit $rc: $out"
  fi
done

# ---- GPT: a non-finite AdamW moment is refused before the next checkpoint is committed ----
rm -rf "$tmp/g-m" && cp -r "$tmp/g-good" "$tmp/g-m"
poke "$tmp/g-m/ckpt/step-00000002" wte.weight.exp_avg_sq inf
before=$(snapshot "$tmp/g-m/ckpt")
out=$("$bin" train "$tmp/g.ini" --out "$tmp/g-m" --resume --quiet 2>&1); rc=$?
[[ $rc -eq 1 && $out == *"optimizer state 'wte.weight.exp_avg_sq' became non-finite"* &&
   $out == *"The last good checkpoint (step 2) in $tmp/g-m/ckpt is untouched"* ]] \
  && echo "ok: gpt: a non-finite AdamW moment stops the run" || bad "gpt inf moment: exit $rc: $out"
[[ "$(snapshot "$tmp/g-m/ckpt")" == "$before" ]] && echo "ok: gpt: no checkpoint with the inf moment was written" \
  || bad "gpt inf moment: files changed"

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
out=$("$bin" predict "$tmp/p-nan" "$tmp/train-images" 2>&1); rc=$?
[[ $rc -ne 0 && $out == *"holds NaN or inf values"* ]] && echo "ok: predict refuses NaN weights" || bad "predict of NaN weights: exit $rc: $out"
mkdir "$tmp/g-nan" && cp "$tmp/g"/{config.json,tokenizer.txt,model.safetensors} "$tmp/g-nan/" && nanify "$tmp/g-nan"
out=$("$bin" generate "$tmp/g-nan" --prompt "in the" --tokens 4 2>&1); rc=$?
[[ $rc -ne 0 && $out == *"holds NaN or inf values"* ]] && echo "ok: generate refuses NaN weights" || bad "generate of NaN weights: exit $rc: $out"

if ((fails)); then echo "cli_poison: $fails failure(s)"; exit 1; fi
echo "cli_poison: all passed"
