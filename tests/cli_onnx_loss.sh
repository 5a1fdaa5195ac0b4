#!/usr/bin/env bash
# `fathom run` on NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss models against ONNX
# Runtime (and torch, where installed), on the CPU and the check device, and the refusals of
# bad targets and weights (tests/onnx_loss_check.py says what it compares and within what).
# Skipped (77) when onnx or onnxruntime is missing.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
cli_begin fathom_cli_onnx_loss
out=$("$py" "$here/onnx_loss_check.py" "$bin" "$tmp" 2>&1); rc=$?
echo "$out"
[ $rc = 77 ] && exit 77
check "the ONNX loss ops equal to ONNX Runtime and torch, and their refusals" '[ $rc = 0 ]'
cli_end cli_onnx_loss
