#!/usr/bin/env bash
# `fathom run MODEL.onnx` and `fathom import`: ONNX's conv_with_strides_padding case (Debian's
# libonnx-testdata) gives the output documented by ONNX, printed, as JSON and as
# a .npy written to --output; bad usage exits 2, a bad model or input exits 1 with
# the file named, and no output file is left half-written; predict, eval, generate, embed,
# prune and distill refuse an ONNX file by name and offer `fathom run`.
set -uo pipefail
bin=$1
case_dir=/usr/share/libonnx-testdata/data/node/test_conv_with_strides_padding
if [ ! -d "$case_dir" ]; then echo "SKIP: $case_dir missing (apt-get install libonnx-testdata)"; exit 77; fi
. "$(dirname "$0")/cli_lib.sh"
cli_begin fathom_cli_onnx
d=$tmp
x="x=$case_dir/test_data_set_0/input_0.pb" w="W=$case_dir/test_data_set_0/input_1.pb"

out=$("$bin" run "$case_dir/model.onnx" --input "$x" --input "$w" --json); rc=$?
check "json run exits 0" '[ $rc = 0 ]'
check "json values are ONNX's documented output" \
  '[[ "$out" == *"\"shape\":[1,1,4,3],\"data\":[12.0,27.0,24.0,63.0,108.0,81.0,123.0,198.0,141.0,112.0,177.0,124.0]"* ]]'
out=$("$bin" run "$case_dir/model.onnx" --input "$x" --input "$w" --device check --json); rc=$?
check "--device check: the same values" \
  '[ $rc = 0 ] && [[ "$out" == *"\"shape\":[1,1,4,3],\"data\":[12.0,27.0,24.0,63.0,108.0,81.0,123.0,198.0,141.0,112.0,177.0,124.0]"* ]]'
err=$("$bin" run "$case_dir/model.onnx" --input "$x" --input "$w" --device nope 2>&1); rc=$?
check "--device nope: usage, exit 2" '[ $rc = 2 ] && [[ "$err" == *"unknown device '"'"'nope'"'"'"* ]]'
out=$("$bin" run "$case_dir/model.onnx" --input "$x" --input "$w"); rc=$?
check "plain run prints the output" '[ $rc = 0 ] && [[ "$out" == "y: f32 [1, 1, 4, 3] [12, 27, 24, 63, 108, 81, 123, 198, ...]" ]]'
"$bin" run "$case_dir/model.onnx" --input "$x" --input "$w" --output "$d/out" >/dev/null; rc=$?
check "--output writes y.npy and outputs.json" '[ $rc = 0 ] && [ -s "$d/out/y.npy" ] && [ "$(ls "$d/out" | tr "\n" " ")" = "outputs.json y.npy " ]'
check "the .npy holds 12 f32 values" '[ $(stat -c %s "$d/out/y.npy") = $((128 + 48)) ]'
check "outputs.json names y's file, dtype and shape" \
  'python3 -c "import json, sys; o = json.load(open(sys.argv[1]))[\"outputs\"]; sys.exit(o != [{\"name\": \"y\", \"file\": \"y.npy\", \"dtype\": \"f32\", \"shape\": [1, 1, 4, 3]}])" "$d/out/outputs.json"'
# --output is one unit: an earlier output is replaced whole (Split's three files by Log's one), any other
# directory or file is refused before the model runs, and nothing in it changes
split=/usr/share/libonnx-testdata/data/node/test_split_equal_parts_1d
"$bin" run "$split/model.onnx" --input "$split/test_data_set_0/input_0.pb" --output "$d/out" >/dev/null; rc=$?
check "an earlier output replaced whole" '[ $rc = 0 ] && [ "$(ls "$d/out" | tr "\n" " ")" = "output_1.npy output_2.npy output_3.npy outputs.json " ]'
mkdir -p "$d/mine" && printf "x" > "$d/mine/x.npy"
err=$("$bin" run "$split/model.onnx" --input "$split/test_data_set_0/input_0.pb" --output "$d/mine" 2>&1); rc=$?
check "a directory of other files refused, exit 1, unchanged" \
  '[ $rc = 1 ] && [[ "$err" == *"$d/mine is a directory holding files that no earlier"* ]] && [ "$(ls "$d/mine")" = x.npy ]'
cp "$d/out/outputs.json" "$d/mine/"
err=$("$bin" run "$split/model.onnx" --input "$split/test_data_set_0/input_0.pb" --output "$d/mine" 2>&1); rc=$?
check "an outputs.json beside files it does not list: refused" '[ $rc = 1 ] && [ -e "$d/mine/x.npy" ]'
printf 'keep' > "$d/afile"
err=$("$bin" run "$split/model.onnx" --input "$split/test_data_set_0/input_0.pb" --output "$d/afile" 2>&1); rc=$?
check "a file as --output refused, unchanged" '[ $rc = 1 ] && [[ "$err" == *"exists and is not a directory"* ]] && [ "$(cat "$d/afile")" = keep ]'
"$bin" run "$split/model.onnx" --input "$split/test_data_set_0/input_0.pb" --output "$d/new/sub/out" >/dev/null; rc=$?
check "missing parent directories are made" '[ $rc = 0 ] && [ -s "$d/new/sub/out/output_3.npy" ] && ! ls "$d/new/sub" | grep -q tmp'

err=$("$bin" run 2>&1); rc=$?
check "no model: usage, exit 2" '[ $rc = 2 ] && [[ "$err" == *"no model given"* ]]'
err=$("$bin" run "$case_dir/model.onnx" --json --output "$d/o2" 2>&1); rc=$?
check "--json with --output: exit 2" '[ $rc = 2 ]'
err=$("$bin" run "$case_dir/model.onnx" --input "$case_dir/test_data_set_0/input_0.pb" 2>&1); rc=$?
check "unnamed input to a 2-input model: exit 2" '[ $rc = 2 ] && [[ "$err" == *"give them as NAME=FILE"* ]]'
err=$("$bin" run "$case_dir/model.onnx" --input "$x" 2>&1); rc=$?
check "missing input named, exit 1" '[ $rc = 1 ] && [[ "$err" == *"input '"'"'W'"'"' is not given"* ]]'
err=$("$bin" run "$case_dir/model.onnx" --input "$x" --input "W=$d/none.npy" 2>&1); rc=$?
check "unreadable input file named, exit 1" '[ $rc = 1 ] && [[ "$err" == *"none.npy"* ]]'
head -c 100 "$case_dir/model.onnx" > "$d/cut.onnx"
err=$("$bin" run "$d/cut.onnx" --input "$x" 2>&1); rc=$?
check "truncated model: file named, exit 1" '[ $rc = 1 ] && [[ "$err" == *"cut.onnx"* ]]'
# --json: NaN and infinities (log of 0 and -1) as strings; JSON has no such numbers
python3 -c "
import struct, sys
h = \"{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\"
h += ' ' * (64 - 10 - len(h) - 1) + '\\n'
sys.stdout.buffer.write(b'\\x93NUMPY\\x01\\x00' + struct.pack('<H', len(h)) + h.encode() + struct.pack('<2f', 0.0, -1.0))
" > "$d/zero_neg.npy"
out=$("$bin" run /usr/share/libonnx-testdata/data/node/test_log_example/model.onnx --input "$d/zero_neg.npy" --json); rc=$?
check "json: log(0), log(-1) as \"-inf\", \"nan\"" '[ $rc = 0 ] && [[ "$out" == *"\"data\":[\"-inf\",\"nan\"]"* ]]'

# fathom import: the graph directory, and a refusal naming the node
out=$("$bin" import "$case_dir/model.onnx" -o "$d/g"); rc=$?
check "import exits 0 and writes the graph" '[ $rc = 0 ] && [ -s "$d/g/graph.json" ] && [ -s "$d/g/weights.safetensors" ]'
check "import names the inputs" '[[ "$out" == *"inputs: x f32 [1, 1, 7, 5] W f32 [1, 1, 3, 3]"* ]]'
err=$("$bin" import "$case_dir/model.onnx" 2>&1); rc=$?
check "import without -o: exit 2" '[ $rc = 2 ]'
nogf=/usr/share/libonnx-testdata/data/node/test_maxpool_with_argmax_2d_precomputed_strides
err=$("$bin" import "$nogf/model.onnx" -o "$d/g2" 2>&1); rc=$?
check "import of an op with no graph form: node named, exit 1, nothing written" \
  '[ $rc = 1 ] && [[ "$err" == *"(MaxPool): output 1 has no graph form"* ]] && [ ! -e "$d/g2" ]'
# a Resize whose scales are a graph input (data): refused before the shape probes, naming the input
rz=/usr/share/libonnx-testdata/data/node/test_resize_downsample_scales_nearest
err=$("$bin" import "$rz/model.onnx" -o "$d/g3" 2>&1); rc=$?
check "import of a Resize with its scales as a graph input: the input named, exit 1, nothing written" \
  '[ $rc = 1 ] && [[ "$err" == *"(Resize): input 2 is the graph input '"'"'scales'"'"'"* ]] && [ ! -e "$d/g3" ]'
# fathom compile takes an .onnx file too (through the same conversion)
out=$("$bin" compile "$case_dir/model.onnx" -o "$d/c" 2>&1); rc=$?
check "compile model.onnx writes a graph" '[ $rc = 0 ] && [ -s "$d/c/graph.json" ]'
# MaxPool's Indices output against ONNX Runtime (storage orders, 1-3-D, ceil_mode, ties); the
# part needs onnx and onnxruntime and says so when they are missing
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
mkdir -p "$d/mp"
out=$("$py" "$(dirname "$0")/onnx_maxpool_indices_check.py" "$bin" "$d/mp" 2>&1); rc=$?
echo "$out" | tail -1
if [ $rc != 77 ]; then check "MaxPool Indices equal to ONNX Runtime" '[ $rc = 0 ]'; fi
# commands that want a model directory refuse an ONNX file by name, pointing at the ones that take it
for c in "predict M x.npy" "eval M" "generate M --prompt a --tokens 1" "embed M hello" "prune M --sparsity 0.5 -o $d/pr" \
         "distill --teacher M --student fashion-mlp --steps 1 --out $d/di"; do
  err=$("$bin" ${c//M/$case_dir/model.onnx} 2>&1); rc=$?
  check "${c%% *} on an .onnx file: exit 1, named, fathom run offered ($err)" \
    '[ $rc = 1 ] && [[ "$err" == *"model.onnx is an ONNX file"* ]] && [[ "$err" == *"fathom run"* ]] && [ ! -e "$d/pr" ] && [ ! -e "$d/di" ]'
done
cli_end cli_onnx_run
