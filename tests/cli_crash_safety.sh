#!/usr/bin/env bash
# Crash safety of checkpoints, for the plain (fashion-style) trainer and the GPT
# trainer: FATHOM_FAULT makes the N-th write or rename of a run kill the process
# (SIGKILL, as a power cut would) or fail with EIO, for every N the run reaches.
# After each fault, `--resume` must start at the newest committed checkpoint (the
# log names it and its step, or says "training from step 0" when there is none),
# take exactly the remaining steps (counted in its --profile trace), finish with
# a model.safetensors bitwise equal to an uninterrupted run's, and leave no
# temporary file. (An equal final model alone would not show that: a resume that
# silently started again from step 0 ends equal too.) Also:
# a damaged newest checkpoint is skipped with a message, keep_checkpoints prunes,
# and an old-layout directory (no ckpt/) still resumes.
# Usage: bash tests/cli_crash_safety.sh <path-to-fathom-binary>
set -uo pipefail
bin=${1:?usage: cli_crash_safety.sh FATHOM_BIN}
tmp=$(mktemp -d /tmp/fathom_crash.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

# ---- fixtures: 4 classes of 8x8 images; a small text corpus ----
python3 - "$tmp" <<'PY'
import struct, sys, random
d = sys.argv[1]
r = random.Random(1); imgs = bytearray(); labs = bytearray()
for i in range(96):
    c = i % 4; labs.append(c)
    for p in range(64):
        y, x = divmod(p, 8)
        imgs.append(r.randrange(100) + (120 if (y >= 4) * 2 + (x >= 4) == c else 0))
open(f"{d}/train-images", "wb").write(struct.pack(">BBBBIII", 0, 0, 8, 3, 96, 8, 8) + imgs)
open(f"{d}/train-labels", "wb").write(struct.pack(">BBBBI", 0, 0, 8, 1, 96) + labs)
words = "in the beginning god created the heaven and the earth and the earth was without form".split()
s = 7; lines = []
for _ in range(120):
    row = []
    for _ in range(10):
        s = (s * 1103515245 + 12345) % 2**31
        row.append(words[s % len(words)])
    lines.append(" ".join(row))
open(f"{d}/corpus.txt", "w").write("\n".join(lines) + "\n")
PY
cat > "$tmp/plain.ini" <<EOF
[data]
dataset = idx
train_images = $tmp/train-images
train_labels = $tmp/train-labels
[model]
input = 1 8 8
layer = flatten
layer = linear 8
layer = dropout 0.2
layer = linear 4
[train]
epochs = 2
batch = 32
seed = 5
[optimizer]
name = adam
lr = 0.01
EOF
cat > "$tmp/gpt.ini" <<EOF
[model]
type = gpt
arch = gpt2
n_layer = 1
n_head = 2
n_embd = 16
ffn_hidden = 32
block_size = 16
dropout = 0.1
[tokenizer]
kind = char
[data]
corpus = $tmp/corpus.txt
val_fraction = 0.1
[train]
batch_size = 4
steps = 4
warmup = 1
eval_every = 2
eval_batches = 1
ckpt_every = 2
log_every = 2
seed = 3
EOF
plain_train() { "$bin" train "$tmp/plain.ini" --out "$1" --no-eval "${@:2}"; }
# resumes trace their steps (--profile): the number of step spans is the number of steps the run took
plain_resume() { "$bin" train "$tmp/plain.ini" --resume "$1" --no-eval --profile "$1.trace.json"; }
gpt_train() { "$bin" train "$tmp/gpt.ini" --out "$1" --quiet "${@:2}"; }
gpt_resume() { "$bin" train "$tmp/gpt.ini" --out "$1" --resume --profile "$1.trace.json"; }
# step_spans TRACE: how many optimizer steps a traced run took
step_spans() {
  python3 -c 'import json, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"] if isinstance(t, dict) else t
print(sum(e.get("name") == "step" and e.get("cat") == "step" and e.get("ph") in ("X", "B") for e in ev))' "$1" 2> /dev/null || echo "unreadable"
}
# newest_ckpt DIR: the newest committed checkpoint directory ("" when there is none)
newest_ckpt() { find "$1/ckpt" -maxdepth 1 -name 'step-[0-9]*' 2> /dev/null | grep -E '/step-[0-9]+$' | LC_ALL=C sort | tail -1; }
# resumed_as_expected RECIPE DIR LOG CKPT: the resume started at CKPT, the newest checkpoint committed before it
# (the log names it and its step; "training from step 0" when there was none) and took exactly the remaining
# steps (its trace); prints that step
resumed_as_expected() {
  local rec=$1 d=$2 log=$3 ck=$4 step took
  step=0
  [[ -n $ck ]] && step=$((10#${ck##*step-}))
  if [[ -z $ck ]]; then
    grep -q "no complete checkpoint in .*: training from step 0" "$log" || { echo "the log does not say it starts from step 0: $(grep -i 'resum\|step 0' "$log" | head -2)"; return 1; }
  elif [[ $rec == plain ]]; then
    grep -qF "resuming from $ck (step $step)" "$log" || { echo "the log does not name $ck (step $step): $(grep -i resum "$log" | head -2)"; return 1; }
  else
    grep -qF "resumed from $ck at step $step" "$log" || { echo "the log does not name $ck at step $step: $(grep -i resum "$log" | head -2)"; return 1; }
  fi
  took=$(step_spans "$d.trace.json")
  [[ $took == $((total_steps - step)) ]] || { echo "resumed at step $step of $total_steps but took $took steps"; return 1; }
  echo "$step"
}

# crash_every RECIPE KIND ACTION: fault every point of a run; prints the count
total=0
crash_every() {
  local rec=$1 kind=$2 action=$3 n=1 rc d ck from
  while :; do
    d=$tmp/$rec-$kind-$action-$n
    FATHOM_FAULT=$kind:$n:$action "${rec}_train" "$d" > "$d.log" 2>&1
    rc=$?
    if [[ $rc -eq 0 ]]; then break; fi # the run has fewer points than n: all covered
    if ! grep -q "FATHOM_FAULT: $kind $n" "$d.log"; then bad "$rec $kind:$n:$action: exit $rc without the fault: $(tail -3 "$d.log")"; break; fi
    if [[ $action == kill && $rc -ne 137 ]]; then bad "$rec $kind:$n:kill: exit $rc, expected 137"; fi
    if [[ $action == eio ]] && ! grep -q "injected by FATHOM_FAULT\|Input/output error" "$d.log"; then
      bad "$rec $kind:$n:eio: the error does not say what failed: $(tail -2 "$d.log")"
    fi
    from= ck=$(newest_ckpt "$d")
    if ! "${rec}_resume" "$d" > "$d.resume.log" 2>&1; then bad "$rec $kind:$n:$action: resume failed: $(tail -3 "$d.resume.log")"
    elif ! from=$(resumed_as_expected "$rec" "$d" "$d.resume.log" "$ck"); then bad "$rec $kind:$n:$action: $from"
    elif ! cmp -s "$tmp/$rec-ref/model.safetensors" "$d/model.safetensors"; then bad "$rec $kind:$n:$action: final model differs from the uninterrupted run"
    elif find "$d" -name '*.tmp.*' | grep -q .; then bad "$rec $kind:$n:$action: temporary files left: $(find "$d" -name '*.tmp.*')"
    fi
    [[ $from =~ ^[0-9]+$ ]] && resumed_from[$from]=$((${resumed_from[$from]:-0} + 1))
    rm -rf "$d" "$d.log" "$d.resume.log" "$d.trace.json"
    n=$((n + 1))
    ((n > 200)) && { bad "$rec $kind: more than 200 points?"; break; }
  done
  echo "$rec: $kind:N:$action covered $((n - 1)) points"
  total=$((total + n - 1))
}

for rec in plain gpt; do
  "${rec}_train" "$tmp/$rec-ref" > "$tmp/$rec-ref.log" 2>&1 || { bad "$rec reference run failed: $(tail -3 "$tmp/$rec-ref.log")"; continue; }
  # the whole run's steps: the reference's last checkpoint; a resume of a finished run must take none
  ck=$(newest_ckpt "$tmp/$rec-ref")
  total_steps=$((10#${ck##*step-}))
  cp -a "$tmp/$rec-ref" "$tmp/$rec-done"
  "${rec}_resume" "$tmp/$rec-done" > "$tmp/$rec-done.log" 2>&1 || bad "$rec: resuming a finished run failed: $(tail -3 "$tmp/$rec-done.log")"
  [[ $(step_spans "$tmp/$rec-done.trace.json") == 0 ]] || bad "$rec: resuming a finished run took $(step_spans "$tmp/$rec-done.trace.json") steps"
  # and the trace counts steps: a fresh traced run takes all of them
  "${rec}_train" "$tmp/$rec-traced" --profile "$tmp/$rec-traced.trace.json" > /dev/null 2>&1 || bad "$rec: the traced run failed"
  [[ $(step_spans "$tmp/$rec-traced.trace.json") == "$total_steps" ]] ||
    bad "$rec: a fresh run traced $(step_spans "$tmp/$rec-traced.trace.json") steps, its checkpoints $total_steps"
  declare -A resumed_from=()
  for kind in write rename; do
    for action in kill eio; do crash_every "$rec" "$kind" "$action"; done
  done
  echo "$rec: resumed from step (cases): $(for k in $(printf '%s\n' "${!resumed_from[@]}" | sort -n); do printf '%s (%s) ' "$k" "${resumed_from[$k]}"; done)"
  unset resumed_from
done
echo "crash points covered: $total (each resumed from its newest committed checkpoint, taking only the remaining steps, to a bitwise-equal final model)"

# ---- a damaged newest checkpoint is skipped, with a message, never fatal ----
d=$tmp/damaged
"$bin" train "$tmp/plain.ini" --out "$d" --no-eval > /dev/null 2>&1 || bad "damaged: first run failed"
newest=$(ls -d "$d"/ckpt/step-* | sort | tail -1)
printf 'x' | dd of="$newest/model.safetensors" bs=1 seek=200 conv=notrunc status=none
out=$("$bin" train "$tmp/plain.ini" --resume "$d" --no-eval 2>&1) || bad "damaged: resume failed: $out"
[[ $out == *"ignoring the incomplete checkpoint $newest: model.safetensors fails its checksum"* && $out == *"resuming from $d/ckpt/step-00000003 (step 3)"* ]] \
  && echo "ok: damaged checkpoint skipped" || bad "damaged: messages: $out"
cmp -s "$tmp/plain-ref/model.safetensors" "$d/model.safetensors" || bad "damaged: final model differs"
# keep_checkpoints (default 2): four epochs leave two, the newest
d=$tmp/keep
"$bin" train "$tmp/plain.ini" --out "$d" --no-eval --epochs 4 > /dev/null 2>&1 || bad "keep: run failed"
[[ "$(cd "$d/ckpt" && echo step-*)" == "step-00000009 step-00000012" ]] && echo "ok: the newest 2 checkpoints kept" \
  || bad "keep: $(ls "$d/ckpt")"

# ---- the old layout (files directly in the directory, no ckpt/) still resumes ----
d=$tmp/legacy
"$bin" train "$tmp/plain.ini" --out "$d" --no-eval --epochs 1 > /dev/null 2>&1 || bad "legacy: first run failed"
for f in model.safetensors train_state.safetensors; do cp "$d/ckpt/step-00000003/$f" "$d/$f.copy" && mv "$d/$f.copy" "$d/$f"; done
rm -rf "$d/ckpt"
out=$("$bin" train "$tmp/plain.ini" --resume "$d" --no-eval 2>&1) || bad "legacy: resume failed: $out"
[[ $out == *"written by an older fathom"* ]] && echo "ok: old layout resumes" || bad "legacy: message: $out"
cmp -s "$tmp/plain-ref/model.safetensors" "$d/model.safetensors" || bad "legacy: final model differs"

# ---- no hard links (FATHOM_TEST_NO_LINK=1: the copy a file system without links gets) ----
# OUT/NAME are copies of the newest checkpoint's files, and a resume from them ends bitwise equal
d=$tmp/nolink
FATHOM_TEST_NO_LINK=1 "$bin" train "$tmp/plain.ini" --out "$d" --no-eval --epochs 1 > /dev/null 2>&1 || bad "nolink: first run failed"
[[ $(stat -c %h "$d/model.safetensors" 2> /dev/null) == 1 ]] && cmp -s "$d/model.safetensors" "$d/ckpt/step-00000003/model.safetensors" \
  && cmp -s "$d/train_state.safetensors" "$d/ckpt/step-00000003/train_state.safetensors" || bad "nolink: OUT/ holds no copies of step 3"
out=$(FATHOM_TEST_NO_LINK=1 "$bin" train "$tmp/plain.ini" --resume "$d" --no-eval 2>&1) || bad "nolink: resume failed: $out"
cmp -s "$tmp/plain-ref/model.safetensors" "$d/model.safetensors" && [[ $(stat -c %h "$d/model.safetensors") == 1 ]] \
  && ! find "$d" -name '*.tmp.*' | grep -q . && echo "ok: without hard links OUT/ gets copies, and resume is bitwise equal" \
  || bad "nolink: final model differs or temporaries left: $(find "$d" -name '*.tmp.*')"

# ---- stale temporary files of a dead process are removed at start-up ----
d=$tmp/stale
mkdir -p "$d/ckpt/step-00000009.tmp.999999" && touch "$d/model.safetensors.tmp.999999" "$d/ckpt/step-00000009.tmp.999999/x"
out=$("$bin" train "$tmp/plain.ini" --out "$d" --no-eval --epochs 1 2>&1) || bad "stale: run failed: $out"
[[ ! -e $d/model.safetensors.tmp.999999 && ! -e $d/ckpt/step-00000009.tmp.999999 && $out == *"left by an interrupted write"* ]] \
  && echo "ok: stale temporary files removed" || bad "stale: $out; $(ls -R "$d")"

if ((fails)); then echo "cli_crash_safety: $fails failure(s)"; exit 1; fi
echo "cli_crash_safety: all passed"
