#!/usr/bin/env bash
# The rough edges a new user hit (issue 15, part 6), each checked: u8 .npy inputs to
# predict scaled as the training data was; a missing model directory and the wrong
# kind of model told apart (eval, predict, generate); `fathom recipes` prints whole
# descriptions; a bad plot extension is a usage error; an RGB PNG gives one
# prediction; `plan --model DIR` of a trained CNN plans a CNN; `fathom info` says
# why CUDA is absent.
set -uo pipefail
bin=${1:?usage: cli_rough_edges.sh FATHOM_BIN}
. "$(dirname "$0")/cli_lib.sh"
cli_begin fathom_rough

cli_images "$tmp" 192 64
python3 - "$tmp" <<'PY'
import random, struct, sys, zlib
d = sys.argv[1]
test = open(f"{d}/test-images", "rb").read()[16:]  # the pixels after the idx header
def npy(path, descr, shape, payload):
    hdr = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    hdr += " " * (63 - (10 + len(hdr)) % 64) + "\n"
    open(path, "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + payload)
# the first eight test samples as u8 pixels and as f32 in [0, 1]
npy(f"{d}/u8.npy", "|u1", "(8, 1, 8, 8)", bytes(test[:512]))
npy(f"{d}/f32.npy", "<f4", "(8, 1, 8, 8)", struct.pack("<512f", *[b / 255.0 for b in test[:512]]))
def png(path, color, rows):
    def chunk(t, b): return struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b) & 0xffffffff)
    raw = b"".join(b"\x00" + r for r in rows)
    open(path, "wb").write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 8, 8, 8, color, 0, 0, 0))
                           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
grey = [bytes(test[64 + 8 * y: 64 + 8 * y + 8]) for y in range(8)]  # the second test sample (class 1)
png(f"{d}/grey.png", 0, grey)
png(f"{d}/rgb.png", 2, [bytes(v for v in r for _ in range(3)) for r in grey])
r = random.Random(1); w = "in the beginning god created the heaven and the earth".split()
open(f"{d}/corpus.txt", "w").write("\n".join(" ".join(r.choice(w) for _ in range(12)) for _ in range(80)))
PY
cli_idx_data "$tmp" > "$tmp/cnn.ini"
printf '[model]\ninput = 1 8 8\nlayer = conv2d 4 3 padding=1\nlayer = batchnorm2d\nlayer = relu\nlayer = maxpool2d 2\nlayer = flatten\nlayer = linear 4\n[train]\nepochs = 3\nbatch = 32\nseed = 3\n[optimizer]\nname = adam\nlr = 0.01\n' >> "$tmp/cnn.ini"
printf '[model]\ntype = gpt\narch = gpt2\nn_layer = 1\nn_head = 2\nn_embd = 16\nffn_hidden = 32\nblock_size = 16\n[tokenizer]\nkind = char\n[data]\ncorpus = %s/corpus.txt\n[train]\nbatch_size = 4\nsteps = 2\neval_every = 2\neval_batches = 1\nckpt_every = 2\nlog_every = 2\n' "$tmp" > "$tmp/gpt.ini"
"$bin" train "$tmp/cnn.ini" --out "$tmp/cnn" --quiet || bad "the CNN did not train"
"$bin" train "$tmp/gpt.ini" --out "$tmp/gpt" --quiet || bad "the GPT did not train"

# u8 .npy: the same predictions as the same pixels in f32 [0, 1]
"$bin" predict "$tmp/cnn" "$tmp/u8.npy" --json > "$tmp/u8.json" && "$bin" predict "$tmp/cnn" "$tmp/f32.npy" --json > "$tmp/f32.json" \
  && python3 - "$tmp" <<'PY' && ok "u8 .npy scaled like f32" || bad "u8 .npy predictions differ from f32: $(cat "$tmp/u8.json")"
import json, sys
d = sys.argv[1]
a = json.load(open(f"{d}/u8.json"))["predictions"]; b = json.load(open(f"{d}/f32.json"))["predictions"]
assert [x["class"] for x in a] == [x["class"] for x in b] == [i % 4 for i in range(8)], (a, b)
assert all(abs(x["probability"] - y["probability"]) < 1e-5 for x, y in zip(a, b)), (a, b)
PY
# an RGB PNG for a one-channel model: one prediction, that of its grey version
"$bin" predict "$tmp/cnn" "$tmp/rgb.png" "$tmp/grey.png" --json > "$tmp/png.json" && python3 - "$tmp/png.json" <<'PY' \
  && ok "RGB PNG gives one prediction" || bad "RGB PNG: $(cat "$tmp/png.json")"
import json, sys
p = json.load(open(sys.argv[1]))["predictions"]
assert len(p) == 2 and p[0]["class"] == p[1]["class"] == 1 and abs(p[0]["probability"] - p[1]["probability"]) < 1e-3, p
PY
# a missing directory and the wrong kind of model, each with its own message
expect 1 "no such model directory" "$bin" eval "$tmp/nothing"
expect 1 "no such model directory" "$bin" predict "$tmp/nothing" "$tmp/u8.npy"
expect 0 "perplexity" "$bin" eval "$tmp/gpt" --quiet # a GPT evaluates on its held-out tokens
expect 2 "--data is for classifiers" "$bin" eval "$tmp/gpt" --data "$tmp"
expect 1 "holds a GPT model" "$bin" predict "$tmp/gpt" "$tmp/u8.npy"
expect 1 "no such model directory" "$bin" generate "$tmp/nothing" --prompt in --tokens 2
expect 1 "holds a classifier model (recipe.ini), not a GPT: use \`fathom eval" "$bin" generate "$tmp/cnn" --prompt in --tokens 2
# typo suggestions for the other commands' flags too
expect 2 "eval: unknown option '--jsn' (did you mean '--json'?)" "$bin" eval "$tmp/cnn" --jsn
expect 2 "predict: unknown option '--jsno' (did you mean '--json'?)" "$bin" predict "$tmp/cnn" "$tmp/u8.npy" --jsno
expect 2 "generate: unknown option '--temprature' (did you mean '--temperature'?)" "$bin" generate "$tmp/gpt" --temprature 1
expect 2 "plot: unknown option '--tilte' (did you mean '--title'?)" "$bin" plot "$tmp/logs" --tilte x
expect 2 "summary: unknown option '--bach' (did you mean '--batch'?)" "$bin" summary "$tmp/cnn" --bach 3
# `fathom recipes`: a description is the whole first paragraph of the recipe's header
expect 0 "15 minutes on 2 CPU cores" "$bin" recipes
"$bin" recipes --json | python3 -c 'import json,sys; d={r["name"]: r["description"] for r in json.load(sys.stdin)["recipes"]}; assert "15 minutes" in d["kjv-gpt"], d' \
  && ok "recipes --json: whole descriptions" || bad "recipes --json truncates"
# a bad plot extension is a usage error, found before the logs are read
expect 2 "must end in .svg or .png" "$bin" plot "$tmp/nologs" -o "$tmp/curves.pdf"
# plan --model DIR of a trained CNN plans a CNN
expect 0 "CNN" "$bin" plan --model "$tmp/cnn"
# fathom info: the reason CUDA is absent matches the build
"$bin" info --json > "$tmp/info.json" && "$bin" info > "$tmp/info.txt" && python3 - "$tmp" <<'PY' && ok "info says why CUDA is absent" || bad "info: $(grep cuda "$tmp/info.txt")"
import json, sys
d = sys.argv[1]
j = json.load(open(f"{d}/info.json")); j = j.get("build", j)
t = open(f"{d}/info.txt").read()
assert "cuda_switched_off" in j, j
if j["cuda_built"]: assert "cuda:  built in" in t
elif j["cuda_switched_off"]: assert "switched off at build time" in t and "no CUDA toolkit" not in t, t
else: assert "no CUDA toolkit at build time" in t, t
PY

cli_end cli_rough_edges
