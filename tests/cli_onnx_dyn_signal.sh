#!/usr/bin/env bash
# `fathom run` on NonMaxSuppression, NonZero, Compress, Unique and the signal ops (the
# windows, DFT, STFT, MelWeightMatrix) against ONNX Runtime and numpy, on the CPU and the
# check device, and the refusals of bad inputs (tests/onnx_dyn_signal_check.py says what it
# compares and within what). Skipped (77) when onnx or onnxruntime is missing.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
cli_py_check cli_onnx_dyn_signal onnx_dyn_signal_check.py "the data-dependent-shape and signal ops equal to ONNX Runtime and numpy, and their refusals"
