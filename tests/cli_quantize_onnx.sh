#!/usr/bin/env bash
# `fathom quantize --int8` on an image classifier from elsewhere (tests/onnx_quant_cnn.py
# writes it as torch.onnx.export would): compiled, then quantized dynamic and calibrated from
# an .npy file of the model's own inputs (an imported graph has no recipe, so no training data
# to name). Its 3x3 and 1x1 convolutions over 16 and 32 channels become qconv2d_int8 (the
# first conv, 27 weights a window, stays fp32 and says so); both int8 graphs run through
# `fathom run` within 0.05 of the fp32 graph's logits (max |diff| / max |fp32|) with the same
# top class on most of the 6 inputs. Bad input: `--calibrate recipe` on such a graph and
# calibration samples of the wrong shape are refused by name, exit 1, nothing written.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
cli_need_onnx_python
cli_begin fathom_cli_quant_onnx
d=$tmp
python3 "$here/onnx_quant_cnn.py" "$d" || { echo "FAIL: writing the model"; exit 1; }

"$bin" compile "$d/cnn.onnx" -o "$d/c" >/dev/null; rc=$?
check "compile" '[ $rc = 0 ]'
out_d=$("$bin" quantize "$d/c" -o "$d/qd" --int8 --dynamic); rc1=$?
out_s=$("$bin" quantize "$d/c" -o "$d/qs" --int8 --calibrate "$d/calib.npy" --samples 48); rc2=$?
count() { python3 -c "import json, sys; print(sum(n['op'] == sys.argv[2] for n in json.load(open(sys.argv[1]))['nodes']))" "$1/graph.json" "$2"; }
check "quantize dynamic and calibrated from an .npy of the model's inputs" '[ "$rc1$rc2" = 00 ]'
check "two qconv2d_int8 nodes in each ($(count "$d/qd" qconv2d_int8), $(count "$d/qs" qconv2d_int8)) and the linear int8" \
  '[ "$(count "$d/qd" qconv2d_int8)" = 2 ] && [ "$(count "$d/qs" qconv2d_int8)" = 2 ] && [ "$(count "$d/qs" qlinear_int8)" = 1 ]'
check "the report names the first conv's reason and the calibrated ranges" \
  '[[ "$out_s" == *"a window of 27 weights (kh kw C < 32)"* ]] && [[ "$out_s" == *"int8 static (activations ["* ]]'
# the .onnx file itself, not compiled first: quantize imports it as `fathom import` does
# (and compiles it before quantizing, as for any graph), with the same int8 nodes
out_f=$("$bin" quantize "$d/cnn.onnx" -o "$d/qf" --int8 --dynamic 2>&1); rc=$?
check "quantize the .onnx file directly: exit 0, two qconv2d_int8 and the linear int8 ($out_f)" \
  '[ $rc = 0 ] && [ "$(count "$d/qf" qconv2d_int8)" = 2 ] && [ "$(count "$d/qf" qlinear_int8)" = 1 ]'
msg=$("$bin" quantize "$d/missing.onnx" -o "$d/x0" --int8 --dynamic 2>&1); rc=$?
check "a missing .onnx file: exit 1, named, nothing written ($msg)" \
  '[ $rc = 1 ] && [[ "$msg" == *"missing.onnx"* ]] && [ ! -e "$d/x0" ]'
for side in c qd qs qf; do "$bin" run "$d/$side" --input "x=$d/x.npy" --output "$d/y_$side" >/dev/null || bad "run $side"; done
res=$(python3 -c "
import sys, numpy as np
d = sys.argv[1]
ref = np.load(f'{d}/y_c/logits.npy')
for s in ('qd', 'qs', 'qf'):
    y = np.load(f'{d}/y_{s}/logits.npy')
    print(s, float(np.max(np.abs(y - ref)) / np.max(np.abs(ref))), int(np.sum(y.argmax(1) == ref.argmax(1))))" "$d")
echo "$res"
check "int8 logits (compiled then quantized, and quantized from the file) within 0.05 of fp32 and the same top class on at least 5 of 6 inputs" \
  'python3 -c "
import sys
for line in sys.argv[1].splitlines():
    s, e, a = line.split()
    assert float(e) <= 0.05 and int(a) >= 5, line" "$res"'

# bad input: refused by name, exit 1, nothing written
msg=$("$bin" quantize "$d/c" -o "$d/x1" --int8 --calibrate recipe 2>&1); rc=$?
check "--calibrate recipe on a graph without a recipe: exit 1, the way out named" \
  '[ $rc = 1 ] && [[ "$msg" == *"this graph has no recipe"* ]] && [[ "$msg" == *".npy file of its inputs"* ]] && [ ! -e "$d/x1" ]'
msg=$("$bin" quantize "$d/c" -o "$d/x2" --int8 --calibrate "$d/calib_bad.npy" 2>&1); rc=$?
check "calibration samples of the wrong shape: exit 1, named ($msg)" \
  '[ $rc = 1 ] && [[ "$msg" == *"does not fit the graph'"'"'s input"* ]] && [ ! -e "$d/x2" ]'
cli_end cli_quantize_onnx
