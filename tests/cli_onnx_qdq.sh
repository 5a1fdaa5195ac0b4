#!/usr/bin/env bash
# ONNX Runtime's QDQ int8 models (quantize_static) through `fathom compile`: each Q-DQ-MatMul/Gemm
# on symmetric int8 weights becomes qlinear_int8, the other Q/DQ pairs cast-free float chains,
# and the outputs equal the interpreter's and ONNX Runtime's (tests/onnx_qdq_check.py). Skipped
# (77) when onnxruntime's quantization tool is missing.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
cli_begin fathom_cli_onnx_qdq
out=$("$py" "$here/onnx_qdq_check.py" "$bin" "$tmp" 2>&1); rc=$?
echo "$out"
[ $rc = 77 ] && exit 77
check "QDQ models compiled to qlinear_int8, outputs equal to the interpreter and ONNX Runtime" '[ $rc = 0 ]'
cli_end cli_onnx_qdq
