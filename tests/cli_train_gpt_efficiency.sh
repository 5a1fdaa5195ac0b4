#!/usr/bin/env bash
# `fathom train <gpt recipe>` with each efficiency flag on a tiny recipe and corpus
# (the KJV is not needed): the JSON on stdout reports the settings, the loss scale
# and skipped steps, and the memory report; checkpointing leaves the losses
# bitwise unchanged; bf16 stores fewer activation bytes; accumulation fewer still;
# a memory limit too small for the weights is refused before training, and one
# hit during training stops the run without writing a checkpoint.
set -uo pipefail
bin=$1
tmp=$(mktemp -d /tmp/fathom_gpt_eff.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

python3 - "$tmp/corpus.txt" <<'PY'
import sys
words = "in the beginning god created the heaven and the earth and the earth was without form and void".split()
s = 12345
lines = []
for _ in range(300):
    row = []
    for _ in range(12):
        s = (s * 1103515245 + 12345) % 2**31
        row.append(words[s % len(words)])
    lines.append(" ".join(row))
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
cat > "$tmp/tiny.ini" <<EOF
[model]
type = gpt
arch = gpt2
n_layer = 3
n_head = 2
n_embd = 32
ffn_hidden = 64
block_size = 32
dropout = 0.1
bias = true
[tokenizer]
kind = char
[data]
corpus = $tmp/corpus.txt
val_fraction = 0.1
[train]
batch_size = 8
steps = 12
warmup = 2
lr = 3e-3
min_lr = 3e-4
eval_every = 6
eval_batches = 2
ckpt_every = 6
log_every = 6
seed = 7
EOF

run() { # name args...
  local name=$1; shift
  "$bin" train "$tmp/tiny.ini" --out "$tmp/$name" --json "$@" > "$tmp/$name.json" 2> "$tmp/$name.err" \
    || fail "$name: exit $? $(cat "$tmp/$name.err")"
  [ "$(wc -l < "$tmp/$name.json")" -eq 1 ] || fail "$name: --json must print exactly one line: $(cat "$tmp/$name.json")"
}
run base
run blocks --checkpointing blocks
run selective --checkpointing selective
run bf16 --precision bf16
run fp16 --precision fp16
run accum --grad-accum 4
run prealloc --memory-mode preallocate --memory-preallocate 64M --memory-limit 1G
grep -q "memory: peak" "$tmp/base.err" && fail "--json: the text memory report went to the terminal too"

python3 - "$tmp" <<'PY' || exit 1
import json, sys
d = sys.argv[1]
r = {k: json.load(open(f"{d}/{k}.json")) for k in ["base", "blocks", "selective", "bf16", "fp16", "accum", "prealloc"]}
b = r["base"]
for k, v in r.items():
    for f in ["train_loss", "val_loss", "steps", "memory", "loss_scale", "skipped_steps", "data_wait_seconds", "peak_memory_bytes"]:
        assert f in v, (k, f, v)
    assert v["steps"] == 12, (k, v["steps"])
    m = v["memory"]
    for f in ["weights", "gradients", "optimizer_state", "activations"]:
        assert m[f] > 0, (k, f, m)
assert b["precision"] == "fp32" and b["checkpointing"] == "none" and b["grad_accum"] == 1 and b["loss_scale"] == 1
# checkpointing recomputes, it does not change the run (dropout is on)
for k in ["blocks", "selective"]:
    assert r[k]["checkpointing"] == k
    assert r[k]["train_loss"] == b["train_loss"] and r[k]["val_loss"] == b["val_loss"], (k, r[k], b)
assert r["blocks"]["memory"]["activations"] < b["memory"]["activations"], (r["blocks"]["memory"], b["memory"])
# low precision: close to fp32 but not identical, fewer activation bytes
for k in ["bf16", "fp16"]:
    assert r[k]["precision"] == k
    assert abs(r[k]["val_loss"] - b["val_loss"]) < 0.05 and r[k]["val_loss"] != b["val_loss"], (k, r[k]["val_loss"], b["val_loss"])
    assert r[k]["memory"]["activations"] < b["memory"]["activations"], (k, r[k]["memory"], b["memory"])
assert r["fp16"]["loss_scale"] == 65536 and r["fp16"]["skipped_steps"] == 0, r["fp16"]
assert r["bf16"]["loss_scale"] == 1
a = r["accum"]
assert a["grad_accum"] == 4 and a["batch"] == 8
assert a["memory"]["activations"] < 0.5 * b["memory"]["activations"], (a["memory"], b["memory"])
# preallocate reserves the arena once
assert r["prealloc"]["memory"]["peak_reserved"] >= 64 << 20, r["prealloc"]["memory"]
assert r["prealloc"]["train_loss"] == b["train_loss"]
PY

# without --json: progress and the memory report on stderr, fp16's scaler in the log lines
"$bin" train "$tmp/tiny.ini" --out "$tmp/text" --precision fp16 > "$tmp/text.out" 2> "$tmp/text.err" || fail "text run: $(cat "$tmp/text.err")"
grep -q "loss scale 65536  skipped 0" "$tmp/text.err" || fail "fp16 log lines lack the loss scale: $(cat "$tmp/text.err")"
grep -q "memory: peak" "$tmp/text.err" || fail "no memory report at the end: $(cat "$tmp/text.err")"
grep -q "activations" "$tmp/text.err" || fail "memory report without activations: $(cat "$tmp/text.err")"

# fp16 resumed from a checkpoint continues exactly, loss scaler included (its state is in the checkpoint)
"$bin" train "$tmp/tiny.ini" --out "$tmp/res" --precision fp16 --stop-after 6 --quiet > /dev/null 2>&1 || fail "fp16 --stop-after"
python3 - "$tmp/res/train_state.safetensors" <<'PY' || fail "fp16 checkpoint lacks the loss scaler's state"
import json, struct, sys
f = open(sys.argv[1], "rb")
meta = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))["__metadata__"]
assert meta["loss_scale"] == "65536" and meta["loss_scale_growth_tracker"] == "6", meta
PY
"$bin" train "$tmp/tiny.ini" --out "$tmp/res" --precision fp16 --resume --json --quiet > "$tmp/res.json" 2> "$tmp/res.err" || fail "fp16 --resume: $(cat "$tmp/res.err")"
python3 - "$tmp/res.json" "$tmp/fp16.json" <<'PY' || fail "fp16 resume differs from the uninterrupted run"
import json, sys
a, b = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert a["train_loss"] == b["train_loss"] and a["val_loss"] == b["val_loss"], (a, b)
PY

# a limit below the weights: a clear error before training, no checkpoint
"$bin" train "$tmp/tiny.ini" --out "$tmp/small" --memory-limit 16K > /dev/null 2> "$tmp/small.err"
rc=$?
[ "$rc" -eq 1 ] || fail "--memory-limit 16K: exit $rc"
grep -q "cannot hold the model before training starts" "$tmp/small.err" || fail "--memory-limit 16K: $(cat "$tmp/small.err")"
[ ! -e "$tmp/small/model.safetensors" ] || fail "--memory-limit 16K wrote a model"
# a limit the weights fit in but a step does not: out of memory with the numbers and the flags that help
"$bin" train "$tmp/tiny.ini" --out "$tmp/oom" --memory-limit 700K > /dev/null 2> "$tmp/oom.err"
rc=$?
[ "$rc" -eq 1 ] || fail "--memory-limit 700K: exit $rc $(cat "$tmp/oom.err")"
grep -q "out of memory on cpu: requested .* limit .*--checkpointing" "$tmp/oom.err" || fail "--memory-limit 700K: $(cat "$tmp/oom.err")"
[ ! -e "$tmp/oom/model.safetensors" ] || fail "an out-of-memory run wrote a checkpoint"
echo "gpt train efficiency flags: ok"
