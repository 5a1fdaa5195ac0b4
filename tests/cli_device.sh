#!/usr/bin/env bash
# Devices end to end through the command, on the checked test device (`check`: the
# CPU's kernels on memory the host may not touch, docs/DEVICES.md), so the device
# path runs in CI without a GPU:
#  - a CNN (conv, batch norm, pooling, dropout) trains with `fathom train --device
#    check` to losses, test figures and a model file bitwise equal to the CPU run
#    (fp32); so do fashion-mlp and fashion-cnn on Fashion-MNIST for a few steps
#    where the data set is installed (the MLP and GPT: cli_train_unified.sh);
#  - a run stopped on one device resumes on the other and ends where an
#    uninterrupted run ends;
#  - eval, predict and generate with --device check print what the CPU prints, for
#    trained models and for their compiled graphs (`fathom compile`);
#  - the JSON names the device and its memory report (per device);
#  - bad --device values fail before any work, with nothing written.
# Any host access to device memory would abort the run (and fail this test).
set -uo pipefail
bin=${1:?usage: cli_device.sh FATHOM_BIN}
. "$(dirname "$0")/cli_lib.sh"
cli_begin fathom_device
skips=0
cli_images "$tmp" 192 64
python3 - "$tmp" <<'PY'
import random, sys
r = random.Random(1); w = "in the beginning god created the heaven and the earth".split()
open(f"{sys.argv[1]}/corpus.txt", "w").write("\n".join(" ".join(r.choice(w) for _ in range(12)) for _ in range(120)))
PY
data=$(cli_idx_data "$tmp")
train='[train]\nepochs = 2\nbatch = 32\nseed = 3\n[optimizer]\nname = adamw\nlr = 0.01\n'
{ echo "$data"; printf '[model]\ninput = 1 8 8\nlayer = flatten\nlayer = linear 16\nlayer = relu\nlayer = linear 4\n'; printf "$train"; } > "$tmp/mlp.ini"
{ echo "$data"; printf '[model]\ninput = 1 8 8\nlayer = conv2d 4 3 padding=1\nlayer = batchnorm2d\nlayer = relu\nlayer = maxpool2d 2\nlayer = flatten\nlayer = dropout 0.25\nlayer = linear 4\n'; printf "$train"; } > "$tmp/cnn.ini"
printf '[model]\ntype = gpt\narch = gpt2\nn_layer = 1\nn_head = 2\nn_embd = 16\nffn_hidden = 32\nblock_size = 16\n[tokenizer]\nkind = char\n[data]\ncorpus = %s/corpus.txt\n[train]\nbatch_size = 4\nsteps = 6\neval_every = 3\neval_batches = 1\nckpt_every = 3\nlog_every = 3\n' "$tmp" > "$tmp/gpt.ini"

run() { # NAME RECIPE ARGS...: a --json run (stdout: the JSON, stderr kept)
  local name=$1 recipe=$2; shift 2
  "$bin" train "$recipe" --out "$tmp/$name" --json --threads 2 "$@" > "$tmp/$name.json" 2> "$tmp/$name.err" \
    || bad "$name: exit $?: $(tail -3 "$tmp/$name.err")"
}
# same figures and the same model bytes on both devices
same() { # A B KEYS...: JSON keys equal as numbers (exactly), tensors of the two models equal bit for bit
  local a=$1 b=$2; shift 2
  python3 - "$tmp" "$a" "$b" "$@" <<'PY' && ok "$a == $b ($*, model tensors)" || bad "$a != $b"
import json, struct, sys
d, a, b, keys = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
ja, jb = json.load(open(f"{d}/{a}.json")), json.load(open(f"{d}/{b}.json"))
for k in keys:
    assert ja[k] == jb[k], (k, ja[k], jb[k])
def tensors(p):
    raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; hdr = json.loads(raw[8:8 + n]); base = 8 + n
    return {k: (v["dtype"], v["shape"], raw[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
            for k, v in hdr.items() if k != "__metadata__"}
ta, tb = tensors(ja["model_path"]), tensors(jb["model_path"])
assert ta.keys() == tb.keys() and all(ta[k] == tb[k] for k in ta), "model tensors differ"
PY
}

# ---- training: cpu vs check ----
run cnn-cpu "$tmp/cnn.ini"
run cnn-check "$tmp/cnn.ini" --device check
same cnn-cpu cnn-check train_loss test_loss test_accuracy steps
run gpt-cpu "$tmp/gpt.ini"
python3 - "$tmp" <<'PY' && ok "JSON: device and its memory report" || bad "JSON: device and its memory report"
import json, sys
d = sys.argv[1]
for k in ["cnn"]:
    c, h = json.load(open(f"{d}/{k}-check.json")), json.load(open(f"{d}/{k}-cpu.json"))
    assert c["device"] == "check:0" and h["device"] == "cpu", (c["device"], h["device"])
    # the check run's figures are the device's: its weights, gradients and optimizer state live there
    for j in (c, h):
        assert j["memory"]["weights"] > 0 and j["memory"]["optimizer_state"] > 0 and j["peak_memory_bytes"] > 0, (k, j["memory"])
PY
[[ $(tail -n 1 "$tmp/cnn-check.err") == "model saved to $tmp/cnn-check/model.safetensors"* ]] && ok "check run: last line names the model" \
  || bad "check run: last line: $(tail -n 1 "$tmp/cnn-check.err")"

# ---- the built-in recipes on Fashion-MNIST, a few steps ----
if [[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]]; then
  for r in fashion-mlp fashion-cnn; do
    run "$r-cpu" "$r" --steps 6 --batch 32 --no-eval
    run "$r-check" "$r" --steps 6 --batch 32 --no-eval --device check
    same "$r-cpu" "$r-check" train_loss steps
  done
else
  echo "SKIP: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist): fashion-mlp/cnn on check not run"
  skips=$((skips + 1))
fi

# ---- resume on the other device: stopped on check, finished on cpu (and the reverse for the GPT) ----
run mlp-full "$tmp/mlp.ini" --steps 10 --no-eval
run mlp-moved "$tmp/mlp.ini" --steps 10 --no-eval --device check --stop-after 4
"$bin" train "$tmp/mlp.ini" --resume "$tmp/mlp-moved" --steps 10 --no-eval --json --device cpu > "$tmp/mlp-moved2.json" 2> "$tmp/mlp-moved2.err" \
  || bad "mlp resume on cpu: $(tail -3 "$tmp/mlp-moved2.err")"
same mlp-full mlp-moved2 train_loss steps
run gpt-moved "$tmp/gpt.ini" --stop-after 3
"$bin" train "$tmp/gpt.ini" --resume "$tmp/gpt-moved" --out "$tmp/gpt-moved" --json --device check > "$tmp/gpt-moved2.json" 2> "$tmp/gpt-moved2.err" \
  || bad "gpt resume on check: $(tail -3 "$tmp/gpt-moved2.err")"
same gpt-cpu gpt-moved2 train_loss val_loss steps

# ---- eval, predict, generate on the device print what the cpu prints (models and compiled graphs) ----
"$bin" compile "$tmp/cnn-cpu" -o "$tmp/cnn-graph" > /dev/null 2>&1 || bad "compile cnn-cpu"
"$bin" compile "$tmp/gpt-cpu" -o "$tmp/gpt-graph" > /dev/null 2>&1 || bad "compile gpt-cpu"
for cmd in "eval $tmp/cnn-cpu --json --quiet" "predict $tmp/cnn-cpu $tmp/test-images --json" \
           "generate $tmp/gpt-cpu --prompt in --tokens 12 --temperature 0 --quiet" \
           "eval $tmp/cnn-graph --json --quiet" "predict $tmp/cnn-graph $tmp/test-images --json" \
           "generate $tmp/gpt-graph --prompt in --tokens 12 --temperature 0 --quiet" \
           "eval $tmp/gpt-cpu --json --quiet" "eval $tmp/gpt-cpu --precision bf16 --json --quiet" \
           "eval $tmp/gpt-graph --tokens $tmp/gpt-cpu/tokens.bin --json --quiet"; do
  # shellcheck disable=SC2086
  a=$("$bin" $cmd 2>&1) || bad "$cmd (cpu): $a"
  # shellcheck disable=SC2086
  b=$("$bin" $cmd --device check 2>&1) || bad "$cmd --device check: $b"
  [[ -n $a && "$a" == "$b" ]] && ok "$cmd: same output on check" || bad "$cmd: cpu '$a' vs check '$b'"
done

# ---- bad --device values: refused before any work, nothing written ----
expect 2 "unknown device 'gpu' (expected cpu, cuda, cuda:N, check or check:N)" "$bin" train "$tmp/mlp.ini" --out "$tmp/x1" --device gpu
expect 2 "device check:2 does not exist: this machine has 2 such devices (up to check:1)" "$bin" train "$tmp/gpt.ini" --out "$tmp/x2" --device check:2
expect 2 "unknown device 'check:'" "$bin" eval "$tmp/cnn-cpu" --device check:
expect 2 "eval: --device needs a value" "$bin" eval "$tmp/cnn-cpu" --device
expect 2 "device check:9 does not exist" "$bin" predict "$tmp/cnn-cpu" "$tmp/test-images" --device check:9
expect 2 "unknown device 'cuda:-1'" "$bin" generate "$tmp/gpt-cpu" --prompt in --tokens 3 --device cuda:-1
[[ ! -e $tmp/x1 && ! -e $tmp/x2 ]] && ok "no output directory after a refused --device" || bad "a refused --device wrote files"
if "$bin" info --json | grep -q '"available": true'; then
  echo "SKIP: a CUDA device is present: the no-GPU message is not checked here"
  skips=$((skips + 1))
else
  expect 1 "device cuda:0 is not usable: " "$bin" train "$tmp/mlp.ini" --out "$tmp/x3" --device cuda
  expect 1 "device cuda:0 is not usable: " "$bin" eval "$tmp/cnn-cpu" --device cuda
  [[ ! -e $tmp/x3 ]] && ok "no output directory after --device cuda without a GPU" || bad "--device cuda without a GPU wrote files"
fi

if ((skips)) && ! ((fails)); then echo "cli_device: passed, $skips part(s) skipped"; exit 77; fi
cli_end cli_device
