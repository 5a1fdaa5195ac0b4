#!/usr/bin/env bash
# No silent acceptance: a table of bad values from recipes (plain and GPT), the
# command line, the environment and file headers. Each must be refused with a
# non-zero exit and a message that names the key (or flag, variable, tensor) and
# the value, before any training happens. The deploy commands (quantize, prune,
# distill, compile, eval, profile, serve, plan) too, and they write nothing.
# Usage: bash tests/cli_bad_values.sh <path-to-fathom-binary>
set -uo pipefail
bin=${1:?usage: cli_bad_values.sh FATHOM_BIN}
tmp=$(mktemp -d /tmp/fathom_badv.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fails=0 cases=0
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
# refuse NEEDLE... -- CMD...: non-zero exit, no crash, every needle in the output
refuse() {
  local needles=() out rc
  while [[ $1 != -- ]]; do needles+=("$1"); shift; done
  shift
  cases=$((cases + 1))
  out=$("$@" 2>&1); rc=$?
  if [[ $rc -eq 0 || $rc -gt 2 ]]; then bad "$* -> exit $rc (expected 1 or 2): $out"; return; fi
  for n in "${needles[@]}"; do
    [[ $out == *"$n"* ]] || { bad "$* -> the message lacks '$n': $out"; return; }
  done
}

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
open(f"{d}/corpus.txt", "w").write("in the beginning god created the heaven and the earth\n" * 40)
PY
# plain RECIPE-FILE [SECTION KEY VALUE]: a valid recipe, then the bad line in its section
plain() {
  {
    printf '[data]\ndataset = idx\ntrain_images = %s/train-images\ntrain_labels = %s/train-labels\n' "$tmp" "$tmp"
    printf 'test_images = %s/test-images\ntest_labels = %s/test-labels\n' "$tmp" "$tmp"
    printf '[model]\ninput = 1 8 8\nlayer = flatten\nlayer = linear 4\n'
    printf '[train]\nepochs = 1\nbatch = 16\nseed = 1\n[optimizer]\nname = adam\nlr = 0.01\n'
    if [[ $# -gt 1 ]]; then printf '[%s]\n%s = %s\n' "$2" "$3" "$4"; fi
  } > "$1"
}
gpt() {
  {
    printf '[model]\ntype = gpt\nn_layer = 1\nn_head = 2\nn_embd = 16\nffn_hidden = 32\nblock_size = 16\n'
    printf '[tokenizer]\nkind = char\n[data]\ncorpus = %s/corpus.txt\n[train]\nbatch_size = 4\nsteps = 2\n' "$tmp"
    if [[ $# -gt 1 ]]; then printf '[%s]\n%s = %s\n' "$2" "$3" "$4"; fi
  } > "$1"
}

# ---- plain recipes: every integer against its field's range, every float finite ----
while IFS='|' read -r sec key val; do
  plain "$tmp/p.ini" "$sec" "$key" "$val"
  refuse "$sec.$key" "'$val'" -- "$bin" train "$tmp/p.ini" --out "$tmp/p-out" --no-eval
done <<'EOF'
train|epochs|4294967296
train|epochs|0
train|epochs|-1
train|epochs|1.5
train|epochs|lots
train|threads|4294967297
train|threads|1000
train|batch|0
train|batch|9223372036854775808
train|seed|-1
train|label_smoothing|1
train|label_smoothing|-0.1
train|clip_grad_norm|inf
train|checkpoint_every|-1
train|keep_checkpoints|0
train|divergence_factor|-1
data|workers|2147483648
data|workers|-1
data|limit|-3
data|crop_padding|4294967296
data|normalize|0 inf
data|normalize|0 0
data|normalize|nan 1
data|normalize|0 1e300
model|input|1 1e300 8
optimizer|lr|nan
optimizer|lr|-1
optimizer|betas|0.9 1.5
optimizer|eps|inf
schedule|warmup_steps|-5
schedule|step_size|0
schedule|gamma|-1
EOF

# ---- plain recipes' layer lines: sizes whole numbers, every option known and in range (an option with a typo,
# a stray number or 'bias=maybe' was silently ignored before) ----
while IFS='|' read -r spec needle; do
  plain "$tmp/p.ini" model layer "$spec"
  refuse "layer '$spec'" "$needle" -- "$bin" train "$tmp/p.ini" --out "$tmp/p-out" --no-eval
done <<'EOF'
linear 8 bias=maybe|bias must be true or false, got 'maybe'
linear 8 bias=0|got '0'
linear 8 eps=1|unknown option 'eps'
linear 8.5|got 8.5
linear 1e30|got 1e30
linear 2147483648|got 2147483648
linear 4 4 4|linear takes 1 to 2 numbers, got 3
conv2d 4 3 pading=1|unknown option 'pading'
conv2d 4 3 stride=0|stride must be a whole number in [1,
conv2d 4 3 stride=two|got 'two'
conv2d 4 3 padding=-1|got '-1'
conv2d 4 3 in=1.5|got '1.5'
conv2d 4 3 padding=1 padding=2|option 'padding' is given twice
conv2d 4 0|got 0
batchnorm2d momentum=lots|momentum must be a number in [0, 1], got 'lots'
batchnorm2d momentum=2|got '2'
layernorm eps=0|eps must be a number > 0, got '0'
maxpool2d 2 stride=-1|got '-1'
embedding 10 4|p.ini:19: layer 'embedding 10 4' comes after 2 other layers, but an embedding takes the token ids
dropout 0.1 0.2|dropout takes 0 to 1 numbers, got 2
relu 5|relu takes 0 numbers, got 1
flatten start=1|unknown option 'start' (flatten takes no options)
EOF

# ---- a line longer than the INI reader's buffer (199 characters): inih cut it there and parsed the rest as the next
# line (a continuation of the value when it starts with a space), so a long comment could change a value ----
plain "$tmp/long.ini"
sed -i "s|^layer = linear 4\$|layer = linear 4$(printf '%*s' 250 '')# a long trailing comment|" "$tmp/long.ini"
refuse "long.ini:10:" "longer than 199 characters" -- "$bin" train "$tmp/long.ini" --out "$tmp/p-out" --no-eval
plain "$tmp/long2.ini"
sed -i "s|^lr = 0.01\$|lr = 0.01$(printf '%*s' 200 '')5|" "$tmp/long2.ini"
refuse "long2.ini:17:" "longer than 199 characters" -- "$bin" train "$tmp/long2.ini" --out "$tmp/p-out" --no-eval
gpt "$tmp/glong.ini"
sed -i "s|^steps = 2\$|steps = 2$(printf '%*s' 250 '')0|" "$tmp/glong.ini"
refuse "glong.ini: line 14:" "longer than 199 characters" -- "$bin" train "$tmp/glong.ini" --out "$tmp/g-out"

# ---- the plain trainer's flags: whole numbers within their fields' ranges ----
plain "$tmp/ok.ini"
for args in "--epochs 1e10" "--batch 1e300" "--threads 1e10" "--max-steps 1e30" "--epochs 4294967296" \
            "--threads 0" "--threads 257" "--lr inf" "--lr nan" "--seed -1" "--hist-every 0"; do
  set -- $args
  refuse "$1" "'$2'" -- "$bin" train "$tmp/ok.ini" --out "$tmp/p-out" --no-eval $args
done

# ---- GPT recipes ----
while IFS='|' read -r sec key val; do
  gpt "$tmp/g.ini" "$sec" "$key" "$val"
  refuse "[$sec] $key" "'$val'" -- "$bin" train "$tmp/g.ini" --out "$tmp/g-out"
done <<'EOF'
train|steps|1e30
train|batch_size|4294967297
train|lr|inf
train|beta2|1
train|keep_checkpoints|0
train|eval_batches|2.5
train|divergence_factor|nan
model|n_layer|0
model|dropout|1.5
model|bias|maybe
data|val_fraction|0
tokenizer|vocab_size|1e12
EOF
gpt "$tmp/gok.ini"
refuse "--batch" "'4294967297'" -- "$bin" train "$tmp/gok.ini" --out "$tmp/g-out" --batch 4294967297
refuse "--sample" "'99999999999'" -- "$bin" train "$tmp/gok.ini" --out "$tmp/g-out" --sample 99999999999

# ---- the environment ----
refuse FATHOM_MEMORY_LIMIT "'lots'" -- env FATHOM_MEMORY_LIMIT=lots "$bin" train "$tmp/ok.ini" --out "$tmp/p-out"
refuse FATHOM_MEMORY_MODE "'huge'" -- env FATHOM_MEMORY_MODE=huge "$bin" train "$tmp/ok.ini" --out "$tmp/p-out"
refuse FATHOM_MEMORY_PREALLOCATE "'lots'" -- env FATHOM_MEMORY_PREALLOCATE=lots "$bin" train "$tmp/ok.ini" --out "$tmp/p-out"
refuse FATHOM_NUM_THREADS "'0'" -- env FATHOM_NUM_THREADS=0 "$bin" train "$tmp/ok.ini" --out "$tmp/p-out"
refuse FATHOM_NUM_THREADS "'1e10'" -- env FATHOM_NUM_THREADS=1e10 "$bin" train "$tmp/ok.ini" --out "$tmp/p-out"
# the crash tests' hooks: a misspelt fault injected nothing, and a crash test passed unexercised
for v in wirte:3 write:0 rename:2:explode; do
  refuse FATHOM_FAULT "'$v'" -- env FATHOM_FAULT="$v" "$bin" train "$tmp/ok.ini" --out "$tmp/p-out"
done
refuse FATHOM_TEST_FAIL_WRITE_AFTER "'lots'" -- env FATHOM_TEST_FAIL_WRITE_AFTER=lots "$bin" train "$tmp/ok.ini" --out "$tmp/p-out"
# not a bad value, but the same promise: the plain trainer's out-of-memory advice names
# only what it takes (the allocator's names the GPT trainer's --checkpointing, --precision
# and --memory-limit, which `fathom train` on a plain recipe refuses). Every limit from
# 20 to 40 KiB: data loading, the loader's buffers and backward each run out somewhere.
ooms=0
for k in $(seq 20 2 40); do
  out=$(env FATHOM_MEMORY_LIMIT=${k}K "$bin" train "$tmp/ok.ini" --out "$tmp/oom-out" --no-eval 2>&1); rc=$?
  [[ $rc -eq 0 ]] && continue
  ooms=$((ooms + 1))
  [[ $rc -eq 1 && $out == *"out of memory"*"(try a smaller --batch, or a larger FATHOM_MEMORY_LIMIT)"* &&
     $out != *--checkpointing* && $out != *--precision* && $out != *--memory-limit* ]] ||
    bad "FATHOM_MEMORY_LIMIT=${k}K: exit $rc, advice not the plain trainer's: $out"
done
((ooms > 0)) || bad "no FATHOM_MEMORY_LIMIT from 20 to 40 KiB ran out of memory: the advice was not checked"

# ---- file headers: a dtype that disagrees with the model or the data, a directory, a truncated file, a graph's meta ----
"$bin" train "$tmp/ok.ini" --out "$tmp/m" --no-eval > /dev/null 2>&1 || bad "training the header fixture failed"
python3 - "$tmp/m/model.safetensors" "$tmp" <<'PY'
import json, struct, sys, os
src, d = sys.argv[1], sys.argv[2]
b = open(src, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
hdr = json.loads(b[8:8 + n]); data = b[8 + n:]
def write(name, h, payload):
    os.makedirs(f"{d}/{name}", exist_ok=True)
    t = json.dumps(h).encode(); t += b" " * (-len(t) % 8)
    open(f"{d}/{name}/model.safetensors", "wb").write(struct.pack("<Q", len(t)) + t + payload)
k = next(x for x in hdr if x != "__metadata__")
h = json.loads(json.dumps(hdr)); h[k]["dtype"] = "I32"          # same bytes, integer dtype
write("i32", h, data)
h = json.loads(json.dumps(hdr)); h[k]["dtype"] = "F16"          # half the bytes the offsets span
write("f16", h, data)
write("trunc", hdr, data[:-4])                                   # the data ends early
os.makedirs(f"{d}/dir/model.safetensors", exist_ok=True)          # a directory where the file should be
PY
refuse "is i32 in the file but the model expects f32" -- "$bin" eval "$tmp/i32" --data "$tmp"
refuse "dtype F16" "needs" -- "$bin" eval "$tmp/f16"
refuse "truncated" -- "$bin" eval "$tmp/trunc"
refuse "not a regular file" -- "$bin" eval "$tmp/dir"
# a corpus read whole (fm_read_file: bytes, a NUL allowed): a directory was "out of host memory"
# (GPT train) or "out of memory" (tokenizer train); a pipe has no size and read as "the corpus is
# empty" (both must train from it)
gpt "$tmp/gdir.ini" && sed -i "s|corpus = .*|corpus = $tmp/dir|" "$tmp/gdir.ini"
refuse "$tmp/dir: is a directory, not a text file" -- "$bin" train "$tmp/gdir.ini" --out "$tmp/gd-out" --quiet
refuse "$tmp/dir: is a directory, not a text file" -- "$bin" tokenizer train "$tmp/dir" --kind bpe --vocab 300 --out "$tmp/t.tok"
gpt "$tmp/gpipe.ini" && sed -i "s|corpus = .*|corpus = /dev/stdin|" "$tmp/gpipe.ini"
cat "$tmp/corpus.txt" | "$bin" train "$tmp/gpipe.ini" --out "$tmp/gp-out" --quiet > "$tmp/gpipe.log" 2>&1 && [[ -f $tmp/gp-out/model.safetensors ]] ||
  bad "a GPT corpus from a pipe did not train: $(tail -2 "$tmp/gpipe.log")"
cat "$tmp/corpus.txt" | "$bin" tokenizer train /dev/stdin --kind bpe --vocab 300 --out "$tmp/tp.tok" > "$tmp/tpipe.log" 2>&1 &&
  [[ -f $tmp/tp.tok ]] || bad "tokenizer train from a pipe failed: $(tail -2 "$tmp/tpipe.log")"
# embed --file (fm_read_text_file; read before the model): a directory named, a pipe read whole
# (it was "cannot read": no size); no model here, so a pipe read well ends at the model's error
out=$("$bin" embed "$tmp/no-model" --file "$tmp/dir" 2>&1)
[[ $? -eq 1 && $out == *"embed: $tmp/dir: is a directory, not a text file"* ]] || bad "embed --file DIR: $out"
out=$(printf 'one\ntwo\n' | "$bin" embed "$tmp/no-model" --file /dev/stdin 2>&1)
[[ $out == *"$tmp/no-model"* && $out != *"/dev/stdin"* ]] || bad "embed --file from a pipe was not read: $out"
# a compiled GPT graph's meta (generate read block_size with atoi: '16x' was 16, '99999999999' undefined)
"$bin" train "$tmp/gok.ini" --out "$tmp/gm" --quiet > /dev/null 2>&1 && "$bin" compile "$tmp/gm" -o "$tmp/gc" > /dev/null 2>&1 ||
  bad "training and compiling the GPT graph fixture failed"
for v in 16x 99999999999; do
  rm -rf "$tmp/gb" && cp -r "$tmp/gc" "$tmp/gb" && sed -i "s/\"block_size\": \"16\"/\"block_size\": \"$v\"/" "$tmp/gb/graph.json"
  refuse "meta block_size '$v'" -- "$bin" generate "$tmp/gb" --prompt "in" --tokens 2
done

# ---- the deploy commands' numbers: quantize, prune, distill, compile, eval, profile, serve, plan ----
m=$tmp/m
for args in "--int4 --group 48" "--int4 --group 1e3" "--int8 --calibrate recipe --samples 0" \
            "--int8 --calibrate recipe --samples 99999999999" "--int8 --calibrate recipe --method median" \
            "--int8 --calibrate recipe --method percentile --percentile 101" \
            "--int8 --calibrate recipe --method percentile --percentile nan"; do
  set -- $args
  refuse "${*: -2:1}" "${*: -1}" -- "$bin" quantize "$m" -o "$tmp/q-out" $args
done
for args in "--sparsity 1" "--sparsity nan" "--sparsity -0.5" "--sparsity 0.5 --finetune -1" "--sparsity 0.5 --finetune 1e9" \
            "--sparsity 0.5 --lr inf" "--sparsity 0.5 --batch 0" "--sparsity 0.5 --threads 1000"; do
  set -- $args
  refuse "${*: -2:1}" "'${*: -1}'" -- "$bin" prune "$m" -o "$tmp/pr-out" $args
done
for args in "--temperature 0" "--temperature 1e6" "--temperature inf" "--temperature 0.001" "--alpha 1.5" "--alpha -0.1" \
            "--alpha nan" "--steps 0" "--batch 0" "--epochs 1e9" "--lr -1"; do
  set -- $args
  refuse "$1" "'$2'" -- "$bin" distill --teacher "$m" --student "$tmp/ok.ini" --out "$tmp/d-out" --quiet $args
done
refuse "--batch" "'0'" -- "$bin" compile "$m" -o "$tmp/c-out" --batch 0
for v in 0 1e3 99999999999; do refuse "--batch" "'$v'" -- "$bin" eval "$m" --batch "$v"; done
refuse "--top" "'1e10'" -- "$bin" profile --top 1e10 "$tmp/none.json"
refuse "--peak-gflops" "'nan'" -- "$bin" profile --peak-gflops nan "$tmp/none.json"
refuse "--peak-gflops" "'inf'" -- "$bin" profile --peak-gflops inf "$tmp/none.json"
for args in "--port 70000" "--port -1" "--metrics-port 1e5" "--max-body-mb 5000" "--max-body-mb 0" "--poll-secs 0" \
            "--max-connections 4294967296" "--connection-timeout -1" "--release-idle-secs 1e9"; do
  set -- $args
  refuse "$1" "'$2'" -- "$bin" serve --model-repository "$tmp/no-repo" $args
done
# plan words its own: `--mfu 2: out of range (1e-06..1)`, `--gpus "1e6": not a whole number`
for args in "--mfu 2" "--batch 0" "--zero 4" "--headroom inf" "--budget -1" "--requests-per-second 0"; do
  refuse "$args" -- "$bin" plan --preset gpt2-124m $args
done
refuse '--mfu "nan"' -- "$bin" plan --preset gpt2-124m --mfu nan
refuse '--gpus "1e6"' -- "$bin" plan --preset gpt2-124m --gpus 1e6
refuse "--tokens" '"lots"' -- "$bin" plan --preset gpt2-124m --tokens lots
[[ ! -e $tmp/q-out && ! -e $tmp/pr-out && ! -e $tmp/d-out && ! -e $tmp/c-out ]] || bad "a refused command wrote its output"

echo "bad values refused: $((cases - fails)) of $cases"
((cases >= 50)) || bad "the table has only $cases cases"
if ((fails)); then echo "cli_bad_values: $fails failure(s)"; exit 1; fi
echo "cli_bad_values: all passed"
