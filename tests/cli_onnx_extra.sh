#!/usr/bin/env bash
# The ops of src/onnx/onnx_ops_extra.c (CumProd, LpPool, LpNormalization, GroupNormalization,
# CenterCropPad, Col2Im, the bitwise ops and BitShift, AffineGrid, ReverseSequence, MaxUnpool,
# Det) through `fathom run` against ONNX Runtime (numpy or ONNX's reference where ONNX Runtime
# lacks the op or variant), on the CPU and the check device, and the refusals of bad inputs
# (tests/onnx_extra_check.py says what it compares and within what). Skipped (77) when onnx or
# onnxruntime is missing.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
cli_py_check cli_onnx_extra onnx_extra_check.py "the extra ONNX ops equal to ONNX Runtime (or numpy), and their refusals"
