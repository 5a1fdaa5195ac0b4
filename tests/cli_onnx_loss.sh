#!/usr/bin/env bash
# `fathom run` on NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss models against ONNX
# Runtime (and torch, where installed), on the CPU and the check device, and the refusals of
# bad targets and weights (tests/onnx_loss_check.py says what it compares and within what).
# Skipped (77) when onnx or onnxruntime is missing.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
cli_py_check cli_onnx_loss onnx_loss_check.py "the ONNX loss ops equal to ONNX Runtime and torch, and their refusals"
