#!/usr/bin/env bash
# ONNX Runtime's QDQ int8 models (quantize_static) through `fathom compile`: each Q-DQ-MatMul/Gemm
# on symmetric int8 weights becomes qlinear_int8, the other Q/DQ pairs cast-free float chains,
# and the outputs equal the interpreter's and ONNX Runtime's (tests/onnx_qdq_check.py). Skipped
# (77) when onnxruntime's quantization tool is missing.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
cli_py_check cli_onnx_qdq onnx_qdq_check.py "QDQ models compiled to qlinear_int8, outputs equal to the interpreter and ONNX Runtime"
