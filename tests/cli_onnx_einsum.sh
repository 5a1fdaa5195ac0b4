#!/usr/bin/env bash
# Einsum through `fathom run` (the interpreter) and its graph form (`fathom compile`), against
# numpy.einsum and ONNX Runtime: matmuls, attention's equations with a dynamic batch, diagonals,
# sums, three operands, the ellipsis; and refusals (tests/onnx_einsum_check.py). Skipped (77)
# when numpy or onnx is missing.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
cli_py_check cli_onnx_einsum onnx_einsum_check.py "Einsum (interpreter and graph) equal to numpy and ONNX Runtime; bad equations refused"
