#!/usr/bin/env bash
# One `fathom train` for every recipe: the same flags and the same output contract
# for a classifier recipe and a GPT recipe (human text on stderr, JSON on stdout only
# with --json, the same keys for both, a last line saying where the model is), the
# efficiency flags on a classifier (bf16, fp16 with its loss scaler, gradient
# accumulation), --steps/--epochs, and the flag errors: --device, --lr, typos, a
# memory limit below what the weights, gradients and optimizer state need.
set -uo pipefail
bin=${1:?usage: cli_train_unified.sh FATHOM_BIN}
. "$(dirname "$0")/cli_lib.sh"
cli_begin fathom_unified

cli_images "$tmp" 192 64
python3 - "$tmp" <<'PY'
import random, struct, sys
d = sys.argv[1]
r = random.Random(1); w = "in the beginning god created the heaven and the earth".split()
open(f"{d}/corpus.txt", "w").write("\n".join(" ".join(r.choice(w) for _ in range(12)) for _ in range(120)))
PY
cli_idx_data "$tmp" > "$tmp/mlp.ini"
printf '[model]\ninput = 1 8 8\nlayer = flatten\nlayer = linear 16\nlayer = relu\nlayer = linear 4\n[train]\nepochs = 2\nbatch = 32\nseed = 3\n[optimizer]\nname = adam\nlr = 0.01\n' >> "$tmp/mlp.ini"
printf '[model]\ntype = gpt\narch = gpt2\nn_layer = 1\nn_head = 2\nn_embd = 16\nffn_hidden = 32\nblock_size = 16\n[tokenizer]\nkind = char\n[data]\ncorpus = %s/corpus.txt\n[train]\nbatch_size = 4\nsteps = 4\neval_every = 2\neval_batches = 1\nckpt_every = 2\nlog_every = 2\n' "$tmp" > "$tmp/gpt.ini"

run() { # NAME RECIPE ARGS...: a --json run, stdout and stderr kept
  local name=$1 recipe=$2; shift 2
  "$bin" train "$recipe" --out "$tmp/$name" --json "$@" > "$tmp/$name.json" 2> "$tmp/$name.err" \
    || { bad "$name: exit $?: $(tail -3 "$tmp/$name.err")"; return; }
  [[ $(wc -l < "$tmp/$name.json") -eq 1 ]] || bad "$name: stdout is not one JSON line: $(cat "$tmp/$name.json")"
}
run mlp "$tmp/mlp.ini"
run mlp_bf16 "$tmp/mlp.ini" --precision bf16
run mlp_fp16 "$tmp/mlp.ini" --precision fp16
run mlp_accum "$tmp/mlp.ini" --grad-accum 4
run mlp_steps "$tmp/mlp.ini" --steps 9 --no-eval
# a conv net with batch norm under autocast: batch norm runs in f32 (its first step failed
# with "weight dtype f32 does not match input dtype bf16" before)
cli_idx_recipe "$tmp" 2 "conv2d 4 3 padding=1" batchnorm2d relu "maxpool2d 2" flatten "linear 4" > "$tmp/cnn.ini"
for p in fp32 bf16 fp16; do
  out=$("$bin" train "$tmp/cnn.ini" --out "$tmp/cnn_$p" --precision $p --json 2> "$tmp/cnn_$p.err") \
    || { bad "conv + batch norm --precision $p: $(tail -2 "$tmp/cnn_$p.err")"; continue; }
  python3 -c "import json,sys; d=json.loads(sys.argv[1]); assert d['precision']=='$p' and d['test_accuracy']>0.9, d" "$out" \
    && ok "conv + batch norm --precision $p trains" || bad "conv + batch norm --precision $p: $out"
done
run gpt "$tmp/gpt.ini"
run gpt_epochs "$tmp/gpt.ini" --epochs 1 --lr 0.002 --no-eval
# a step count that ends exactly on an epoch's last batch (192 samples, batch 32: 6 per epoch)
# has finished that epoch: it says so and counts it
run mlp_steps_whole "$tmp/mlp.ini" --steps 12 --no-eval
grep -q "^epoch 2/2 " "$tmp/mlp_steps_whole.err" && ok "--steps 12: the second epoch's line" \
  || bad "--steps 12 ends epoch 2 without its line: $(cat "$tmp/mlp_steps_whole.err")"
python3 - "$tmp" <<'PY' && ok "JSON contract" || bad "JSON contract"
import json, sys
d = sys.argv[1]
r = {k: json.load(open(f"{d}/{k}.json")) for k in ["mlp", "mlp_bf16", "mlp_fp16", "mlp_accum", "mlp_steps", "mlp_steps_whole", "gpt", "gpt_epochs"]}
# the same keys for every kind of model
assert set(r["mlp"]) == set(r["gpt"]), set(r["mlp"]) ^ set(r["gpt"])
assert r["mlp"]["kind"] == "classifier" and r["gpt"]["kind"] == "gpt"
for k, v in r.items():
    assert v["device"] == "cpu" and v["model_path"].endswith("/model.safetensors"), (k, v)
    assert v["memory"]["weights"] > 0 and v["peak_memory_bytes"] > 0, (k, v)
m = r["mlp"]
assert m["test_accuracy"] > 0.9 and m["steps"] == 12 and m["epochs"] == 2 and m["val_loss"] is None, m
assert r["gpt"]["test_accuracy"] is None and r["gpt"]["val_loss"] > 0 and r["gpt"]["steps"] == 4, r["gpt"]
# low precision on a classifier: close to fp32, not identical; fp16 carries the loss scaler
for k in ["mlp_bf16", "mlp_fp16"]:
    assert r[k]["precision"] == k[4:] and r[k]["test_accuracy"] > 0.9, r[k]
    assert r[k]["train_loss"] != m["train_loss"] and abs(r[k]["train_loss"] - m["train_loss"]) < 0.05, (k, r[k], m)
assert r["mlp_fp16"]["loss_scale"] == 65536 and r["mlp_fp16"]["skipped_steps"] == 0 and m["loss_scale"] == 1
# accumulation: the mean over the same batch, to rounding, with fewer activation bytes
a = r["mlp_accum"]
assert a["grad_accum"] == 4 and abs(a["train_loss"] - m["train_loss"]) < 1e-5, (a, m)
assert a["memory"]["activations"] < m["memory"]["activations"], (a["memory"], m["memory"])
# --steps: exactly that many steps; --epochs on a GPT: a pass over its training tokens
assert r["mlp_steps"]["steps"] == 9 and r["mlp_steps"]["test_accuracy"] is None, r["mlp_steps"]
assert r["mlp_steps"]["epochs"] == 1, r["mlp_steps"]  # 9 steps: one whole epoch of 6, then 3 of the next
assert r["mlp_steps_whole"]["steps"] == 12 and r["mlp_steps_whole"]["epochs"] == 2, r["mlp_steps_whole"]
g = r["gpt_epochs"]
assert g["steps"] > 4 and g["val_loss"] is None, g
PY
# human text on stderr, the model's place on the last line; nothing on stdout without --json
for k in mlp gpt; do
  "$bin" train "$tmp/$k.ini" --out "$tmp/$k-text" > "$tmp/$k-text.out" 2> "$tmp/$k-text.err" || bad "$k text run failed"
  [[ ! -s $tmp/$k-text.out ]] && ok "$k: stdout empty without --json" || bad "$k: stdout without --json: $(cat "$tmp/$k-text.out")"
  last=$(tail -n 1 "$tmp/$k-text.err")
  [[ $last == "model saved to $tmp/$k-text/model.safetensors"* ]] && ok "$k: last line names the model" || bad "$k: last line: $last"
  "$bin" train "$tmp/$k.ini" --out "$tmp/$k-quiet" --quiet > "$tmp/q.out" 2> "$tmp/q.err"
  [[ ! -s $tmp/q.out && ! -s $tmp/q.err ]] && ok "$k: --quiet is quiet" || bad "$k: --quiet printed: $(cat "$tmp/q.out" "$tmp/q.err")"
done
# the checked test device (docs/DEVICES.md): the same training through the same path, fp32 losses bitwise
# those of the CPU; a CPU checkpoint resumes there (checkpoints are device-independent)
run mlp_check "$tmp/mlp.ini" --device check
run gpt_check "$tmp/gpt.ini" --device check
run mlp_check_accum "$tmp/mlp.ini" --device check:1 --grad-accum 4
python3 - "$tmp" <<'PY' && ok "check device equals the CPU" || bad "check device differs from the CPU"
import json, sys
d = sys.argv[1]
r = {k: json.load(open(f"{d}/{k}.json")) for k in ["mlp", "mlp_check", "gpt", "gpt_check", "mlp_accum", "mlp_check_accum"]}
for cpu, dev in [("mlp", "mlp_check"), ("gpt", "gpt_check"), ("mlp_accum", "mlp_check_accum")]:
    a, b = r[cpu], r[dev]
    assert b["device"].startswith("check"), b
    for k in ["train_loss", "val_loss", "test_loss", "test_accuracy", "steps"]:
        assert a[k] == b[k], (cpu, k, a[k], b[k])
    assert b["memory"]["weights"] > 0 and b["memory"]["optimizer_state"] > 0, b["memory"]
PY
cmp -s "$tmp/mlp/model.safetensors" "$tmp/mlp_check/model.safetensors" && ok "check-device model file equals the CPU's" \
  || bad "check-device model file differs from the CPU's"
cp -r "$tmp/mlp" "$tmp/mlp_move"
expect 0 "resum" "$bin" train "$tmp/mlp.ini" --resume "$tmp/mlp_move" --epochs 3 --no-eval --device check
# --checkpointing blocks on a conv net: each block (conv, batch norm, relu, dropout, pool; then
# conv, batch norm, relu, pool) is recomputed in the backward. Losses, accuracy and the model file
# (batch norm's running statistics and counters included: the recomputation must not update them
# again; dropout masks must repeat) equal the plain run's bit for bit, also on the check device,
# and the activations' peak is lower (only the blocks' inputs are kept); selective is refused.
cli_idx_data "$tmp" > "$tmp/cnn.ini"
printf '[model]\ninput = 1 8 8\nlayer = conv2d 8 3 padding=1\nlayer = batchnorm2d\nlayer = relu\nlayer = dropout 0.2\nlayer = maxpool2d 2\nlayer = conv2d 8 3 padding=1\nlayer = batchnorm2d\nlayer = relu\nlayer = avgpool2d 2\nlayer = flatten\nlayer = dropout 0.25\nlayer = linear 4\n[train]\nepochs = 2\nbatch = 32\nseed = 3\n[optimizer]\nname = adamw\nlr = 0.01\n' >> "$tmp/cnn.ini"
run cnn "$tmp/cnn.ini"
run cnn_ckpt "$tmp/cnn.ini" --checkpointing blocks
run cnn_ckpt_check "$tmp/cnn.ini" --checkpointing blocks --device check
python3 - "$tmp" <<'PY' && ok "cnn --checkpointing blocks equals the plain run" || bad "cnn --checkpointing blocks differs"
import json, sys
d = sys.argv[1]
a, b, c = (json.load(open(f"{d}/{k}.json")) for k in ("cnn", "cnn_ckpt", "cnn_ckpt_check"))
for k in ("train_loss", "test_loss", "test_accuracy", "steps"):
    assert a[k] == b[k] == c[k], (k, a[k], b[k], c[k])
assert b["checkpointing"] == "blocks", b["checkpointing"]
assert b["memory"]["activations"] < a["memory"]["activations"], (b["memory"], a["memory"])
PY
for k in cnn_ckpt cnn_ckpt_check; do
  cmp -s "$tmp/cnn/model.safetensors" "$tmp/$k/model.safetensors" && ok "$k: model file equals the plain run's" || bad "$k: model file differs"
done
expect 2 "--checkpointing selective needs a model with blocks" "$bin" train "$tmp/cnn.ini" --checkpointing selective

# resume: --resume DIR for both kinds
expect 0 "resum" "$bin" train "$tmp/mlp.ini" --resume "$tmp/mlp" --epochs 3 --no-eval
expect 0 "resumed" "$bin" train "$tmp/gpt.ini" --resume "$tmp/gpt" --steps 6

# ---- flag errors: usage errors (2) before any work; an unavailable device (1) says why ----
expect 2 "unknown device 'gpu'" "$bin" train "$tmp/mlp.ini" --device gpu
expect 2 "unknown device 'cuda:x'" "$bin" train "$tmp/gpt.ini" --device cuda:x
expect 1 "--device cuda:7: " "$bin" train "$tmp/mlp.ini" --device cuda:7
expect 2 "--device check:9: device check:9 does not exist" "$bin" train "$tmp/gpt.ini" --device check:9
expect 2 "--lr needs a number, got 'abc' (not a number)" "$bin" train "$tmp/mlp.ini" --lr abc
expect 2 "--lr needs a positive finite number" "$bin" train "$tmp/gpt.ini" --lr -1
expect 2 "unknown option '--epoch' (did you mean '--epochs'?)" "$bin" train "$tmp/mlp.ini" --epoch 3
expect 2 "unknown option '--gradaccum' (did you mean '--grad-accum'?)" "$bin" train "$tmp/gpt.ini" --gradaccum 2
expect 2 "unknown option '--zzzzzz'" "$bin" train "$tmp/mlp.ini" --zzzzzz
expect 2 "unknown command 'trian' (did you mean 'train'?)" "$bin" trian
expect 2 "give --steps or --epochs, not both" "$bin" train "$tmp/mlp.ini" --steps 3 --epochs 2
expect 2 "batch 32 is not divisible by --grad-accum 5" "$bin" train "$tmp/mlp.ini" --grad-accum 5
expect 2 "--checkpointing blocks needs a model with blocks" "$bin" train "$tmp/mlp.ini" --checkpointing blocks
expect 2 "--corpus applies to GPT recipes only" "$bin" train "$tmp/mlp.ini" --corpus x.txt
expect 2 "did you mean 'fashion-cnn'?" "$bin" train fashion-cnnn
expect 2 "no built-in recipe named 'zzzzzzzz'" "$bin" train zzzzzzzz
# a memory limit below weights + gradients + optimizer state: refused before training, nothing written
expect 1 "cannot hold the model before training starts" "$bin" train "$tmp/mlp.ini" --out "$tmp/small" --memory-limit 4K
[[ ! -e $tmp/small/model.safetensors ]] && ok "no model after the refused limit" || bad "a refused limit wrote a model"
expect 1 "memory limit 4.00 KiB on check:0 cannot hold the model" "$bin" train "$tmp/gpt.ini" --out "$tmp/small-gpt" --memory-limit 4K --device check
[[ ! -e $tmp/small-gpt/model.safetensors ]] && ok "no GPT model after the refused limit" || bad "a refused limit wrote a GPT model"

# resuming with a model of another shape: refused before any step, the checkpoints untouched
sed 's/linear 16/linear 24/' "$tmp/mlp.ini" > "$tmp/mlp24.ini"
sed 's/n_embd = 16/n_embd = 32/' "$tmp/gpt.ini" > "$tmp/gpt32.ini"
(cd "$tmp" && find mlp gpt -type f | sort | xargs md5sum) > "$tmp/before.md5"
expect 1 "tensor '1.weight' has shape [16, 64] in the file but [24, 64] in the model" "$bin" train "$tmp/mlp24.ini" --resume "$tmp/mlp"
expect 1 "has shape [271, 16] but the model expects [271, 32]" "$bin" train "$tmp/gpt32.ini" --resume "$tmp/gpt"
(cd "$tmp" && find mlp gpt -type f | sort | xargs md5sum) > "$tmp/after.md5"
cmp -s "$tmp/before.md5" "$tmp/after.md5" && ok "refused resumes changed nothing" || bad "a refused resume changed files: $(diff "$tmp/before.md5" "$tmp/after.md5")"

cli_end cli_train_unified
