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
cli_py_check cli_onnx_ort_quantized onnx_ort_quantized_check.py "ONNX Runtime's quantized models and the quantization ops equal to ONNX Runtime"
