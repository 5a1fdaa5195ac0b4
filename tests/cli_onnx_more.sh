#!/usr/bin/env bash
# ONNX BitCast, DeformConv and TensorScatter (src/onnx/onnx_ops_more.c) through `fathom run`
# against ONNX Runtime (numpy or ONNX's reference where it lacks the variant), each also on
# --device check, and the refusals of bad ones (tests/onnx_more_check.py).
# Skipped (77) when onnx or onnxruntime is missing.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
cli_py_check cli_onnx_more onnx_more_check.py "BitCast, DeformConv and TensorScatter equal to ONNX Runtime; bad ones refused"
