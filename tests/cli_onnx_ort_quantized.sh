#!/usr/bin/env bash
# `fathom run` on int8 models made by ONNX Runtime's quantizer (quantize_dynamic, and
# quantize_static in QDQ and QOperator formats, per tensor and per channel) and on single
# quantization ops at their edges, against ONNX Runtime; and the refusals of bad ones
# (tests/onnx_ort_quantized_check.py says what it compares and within what). Skipped (77)
# when onnx or onnxruntime is missing.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
cli_begin fathom_cli_onnx_ort_quant
out=$("$py" "$here/onnx_ort_quantized_check.py" "$bin" "$tmp" 2>&1); rc=$?
echo "$out"
[ $rc = 77 ] && exit 77
check "ONNX Runtime's quantized models and the quantization ops equal to ONNX Runtime" '[ $rc = 0 ]'
cli_end cli_onnx_ort_quantized
