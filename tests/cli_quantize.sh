#!/usr/bin/env bash
# `fathom quantize`: an MLP trained here on synthetic images is quantized each
# way (int8 dynamic, int8 calibrated from the recipe's data with each method
# and from an .npy file, both with 7-bit weights (--reduce-range), int4 g32/g64
# with and without min); every result
# runs through eval (accuracy within 0.5 points of fp32 on 400 test images) and
# predict, and the command lists what it quantized. Bad input is refused with
# its reason and nothing is written: calibration data of the wrong shape or
# type, a group that does not divide a layer, a GPT given --calibrate, a
# directory that is no model, an --ops kind or --exclude name that is not there;
# --ops/--exclude keep the nodes they name fp32; usage errors exit 2.
# Usage: bash tests/cli_quantize.sh <path-to-fathom-binary>
set -uo pipefail
bin=${1:?usage: cli_quantize.sh FATHOM_BIN}
. "$(dirname "$0")/cli_lib.sh"
cli_begin fathom_cli_quantize

cli_images "$tmp" 256 400
cli_idx_recipe "$tmp" 2 flatten "linear 64" relu "linear 4" > "$tmp/syn.ini"
"$bin" train "$tmp/syn.ini" --out "$tmp/m" --quiet >/dev/null 2>&1 || { bad "training the test model"; cli_end cli_quantize; }
acc() { "$bin" eval "$1" --json --quiet 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["test_accuracy"])'; }
base=$(acc "$tmp/m")
[[ -n $base ]] && ok "fp32 accuracy $base" || bad "eval of the trained model"

# calibration inputs as predict takes them: u8 images in an .npy file
python3 - "$tmp" <<'PY'
import struct, sys
d = sys.argv[1]
raw = open(f"{d}/train-images", "rb").read()[16:16 + 100 * 64]
def npy(path, dtype, shape, data):
    hdr = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (dtype, ", ".join(map(str, shape)) + ("," if len(shape) == 1 else ""))
    hdr += " " * (63 - (10 + len(hdr)) % 64) + "\n"
    open(path, "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + data)
npy(f"{d}/calib.npy", "|u1", (100, 8, 8), raw)
npy(f"{d}/calib_bad.npy", "|u1", (100, 7, 7), raw[:100 * 49])
npy(f"{d}/calib_int.npy", "<i8", (10, 64), bytes(8 * 640))
PY

check_model() { # DIR MODE-TEXT
  local a
  a=$(acc "$1")
  if [[ -z $a ]]; then bad "$2: eval failed"; return; fi
  python3 -c "import sys; sys.exit(abs($a - $base) > 0.005)" && ok "$2: accuracy $a (fp32 $base)" || bad "$2: accuracy $a vs fp32 $base"
  expect 0 "" "$bin" predict "$1" "$tmp/calib.npy"
}
expect 0 "2 of 4 nodes quantized" "$bin" quantize "$tmp/m" -o "$tmp/q8d" --int8 --dynamic
expect 0 "int8 dynamic" "$bin" quantize "$tmp/m" -o "$tmp/q8d" --int8 --dynamic
check_model "$tmp/q8d" "int8 dynamic"
for method in minmax percentile entropy; do
  expect 0 "int8 static (activations" "$bin" quantize "$tmp/m" -o "$tmp/q8s_$method" --int8 --calibrate recipe --method "$method" --samples 200
  check_model "$tmp/q8s_$method" "int8 static $method (the recipe's data)"
done
expect 0 "int8 static" "$bin" quantize "$tmp/m" -o "$tmp/q8n" --int8 --calibrate "$tmp/calib.npy"
check_model "$tmp/q8n" "int8 static (.npy file)"
# --reduce-range: 7-bit weight codes ([-63, 63]; the AVX2 int8 tile's fast form), dynamic and calibrated
expect 0 "int8 dynamic (per-row 7-bit weights" "$bin" quantize "$tmp/m" -o "$tmp/q7d" --int8 --dynamic --reduce-range
check_model "$tmp/q7d" "int8 dynamic, 7-bit weights"
expect 0 "int8 static (7-bit weights, activations" "$bin" quantize "$tmp/m" -o "$tmp/q7s" --int8 --calibrate recipe --reduce-range --samples 200
check_model "$tmp/q7s" "int8 static, 7-bit weights"
codes() { python3 -c '
import sys
from safetensors.numpy import load_file
w = load_file(sys.argv[1] + "/weights.safetensors")
print(max(int(abs(v.astype("int32")).max()) for k, v in w.items() if k.endswith(".int8_panels")))' "$1" 2>/dev/null; }
c8=$(codes "$tmp/q8d"); c7=$(codes "$tmp/q7d"); c7s=$(codes "$tmp/q7s")
[[ $c8 == 127 && $c7 == 63 && $c7s == 63 ]] && ok "largest weight code: 127 (8-bit), 63 (--reduce-range)" \
  || bad "largest weight codes: 8-bit '$c8', 7-bit dynamic '$c7', 7-bit static '$c7s'"
meta() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1] + "/graph.json")).get("meta", {}).get("int8_weights", "none"))' "$1" 2>/dev/null; }
m8=$(meta "$tmp/q8d"); m7=$(meta "$tmp/q7d")
[[ $m8 == none && $m7 == "7-bit (reduce_range)" ]] && ok "graph meta int8_weights: '$m7' (none without the flag)" || bad "graph meta int8_weights: '$m8', '$m7'"
for g in 32 64; do
  expect 0 "int4 g$g symmetric" "$bin" quantize "$tmp/m" -o "$tmp/q4_$g" --int4 --group "$g"
  check_model "$tmp/q4_$g" "int4 g$g"
done
expect 0 "int4 g32 with min" "$bin" quantize "$tmp/m" -o "$tmp/q4m" --int4 --with-min
check_model "$tmp/q4m" "int4 g32 with min"
# fathom plan counts a quantized graph's parameters as the fp32 model's (int8 panels' padding and
# int4's packing undone, scales not counted), and plans its run (the int8 codes' scratch replayed)
"$bin" compile "$tmp/m" -o "$tmp/mc" >/dev/null 2>&1
params() { "$bin" plan --model "$1" --json 2>/dev/null | python3 -c "import json, sys; print(json.load(sys.stdin)['params'])" 2>/dev/null; }
p0=$(params "$tmp/mc"); p8=$(params "$tmp/q8d"); p8s=$(params "$tmp/q8n"); p4=$(params "$tmp/q4m")
[[ -n $p0 && $p0 -gt 1000 && $p8 == "$p0" && $p8s == "$p0" && $p4 == "$p0" ]] && ok "plan: $p0 parameters fp32, int8 and int4 alike" \
  || bad "plan parameters: fp32 '$p0', int8 dynamic '$p8', static '$p8s', int4 '$p4'"
# --ops and --exclude (ONNX Runtime's op_types_to_quantize and nodes_to_exclude): the last linear kept fp32 by name
out=$("$bin" quantize "$tmp/m" -o "$tmp/q8x" --int8 --dynamic --ops linear --exclude 3 2>&1)
[[ $? == 0 && $out == *"1 of 4 nodes quantized"* && $out == *"fp32: excluded (--exclude)"* ]] && ok "--exclude keeps the named node fp32" || bad "--exclude: $out"
check_model "$tmp/q8x" "int8 dynamic, last linear excluded"
expect 1 "left by --ops and --exclude" "$bin" quantize "$tmp/m" -o "$tmp/x8" --int8 --dynamic --ops conv2d
expect 1 "--ops 'linears': expected a comma-separated list of linear, matmul, conv2d, embedding" "$bin" quantize "$tmp/m" -o "$tmp/x8" --int8 --dynamic --ops linears
expect 1 "--exclude 'fc9': the graph has no node of that name" "$bin" quantize "$tmp/m" -o "$tmp/x8" --int8 --dynamic --exclude 1,fc9
[[ ! -e $tmp/x8 ]] && ok "nothing written for refused --ops/--exclude" || bad "$tmp/x8 written"
# a quantized graph directory is a model too: quantizing it again is refused only for want of f32 weights
expect 1 "no node of this graph can be quantized" "$bin" quantize "$tmp/q8d" -o "$tmp/again" --int8 --dynamic
[[ ! -e $tmp/again ]] && ok "nothing written for a graph with nothing to quantize" || bad "$tmp/again written"

# bad input: an error naming it, exit 1, nothing written
expect 1 "does not fit the model's input" "$bin" quantize "$tmp/m" -o "$tmp/x1" --int8 --calibrate "$tmp/calib_bad.npy"
expect 1 "holds i64 values" "$bin" quantize "$tmp/m" -o "$tmp/x2" --int8 --calibrate "$tmp/calib_int.npy"
expect 1 "--group 128 does not divide its 64 input features" "$bin" quantize "$tmp/m" -o "$tmp/x3" --int4 --group 128
expect 1 "" "$bin" quantize "$tmp/nonexistent" -o "$tmp/x4" --int8 --dynamic
mkdir -p "$tmp/notamodel" && echo hi > "$tmp/notamodel/readme.txt"
expect 1 "" "$bin" quantize "$tmp/notamodel" -o "$tmp/x5" --int8 --dynamic
for i in 1 2 3 4 5; do [[ -e $tmp/x$i ]] && bad "$tmp/x$i was written"; done
ok "no output directory for the refused runs"
# a GPT cannot be calibrated (no image input): refused with the way out
python3 - "$tmp" <<'PY'
import sys
open(sys.argv[1] + "/corpus.txt", "w").write("In the beginning God created the heaven and the earth. " * 40)
PY
printf '[model]\ntype = gpt\nn_layer = 1\nn_head = 2\nn_embd = 32\nffn_hidden = 64\nblock_size = 16\n[tokenizer]\nkind = char\n' > "$tmp/gpt.ini"
printf '[data]\ncorpus = %s/corpus.txt\n[train]\nbatch_size = 4\nsteps = 2\n' "$tmp" >> "$tmp/gpt.ini"
if "$bin" train "$tmp/gpt.ini" --out "$tmp/gpt" --quiet >/dev/null 2>&1; then
  expect 1 "Use --int8 --dynamic" "$bin" quantize "$tmp/gpt" -o "$tmp/x6" --int8 --calibrate "$tmp/calib.npy"
  [[ ! -e $tmp/x6 ]] || bad "$tmp/x6 was written"
  expect 0 "int8 dynamic" "$bin" quantize "$tmp/gpt" -o "$tmp/gq8" --int8 --dynamic
  expect 0 "" "$bin" generate "$tmp/gq8" --prompt "In the" --tokens 5
  # a graph runs as it was quantized: --precision bf16 is refused, naming why
  expect 2 "is a graph, which runs in the precision it was compiled or quantized in" "$bin" generate "$tmp/gq8" --prompt "In the" --tokens 5 --precision bf16
  expect 0 "int4 g32" "$bin" quantize "$tmp/gpt" -o "$tmp/gq4" --int4
  expect 0 "" "$bin" generate "$tmp/gq4" --prompt "In the" --tokens 5
else
  bad "training the test GPT"
fi
# usage errors: exit 2
expect 2 "choose one of --int8 and --int4" "$bin" quantize "$tmp/m" -o "$tmp/x7"
expect 2 "exactly one of --dynamic and --calibrate" "$bin" quantize "$tmp/m" -o "$tmp/x7" --int8
expect 2 "exactly one of --dynamic and --calibrate" "$bin" quantize "$tmp/m" -o "$tmp/x7" --int8 --dynamic --calibrate recipe
expect 2 "--group 48 must be 32, 64 or 128" "$bin" quantize "$tmp/m" -o "$tmp/x7" --int4 --group 48
expect 2 "--reduce-range (7-bit int8 weights) applies to --int8, not to --int4" "$bin" quantize "$tmp/m" -o "$tmp/x7" --int4 --reduce-range
expect 2 "--method 'kl'" "$bin" quantize "$tmp/m" -o "$tmp/x7" --int8 --calibrate recipe --method kl
expect 2 "no output directory" "$bin" quantize "$tmp/m" --int8 --dynamic
expect 2 "unknown option" "$bin" quantize "$tmp/m" -o "$tmp/x7" --int9
[[ ! -e $tmp/x7 ]] || bad "$tmp/x7 was written"
cli_end cli_quantize
