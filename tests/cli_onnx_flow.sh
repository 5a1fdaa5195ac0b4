#!/usr/bin/env bash
# ONNX control flow: If, Loop and Scan (outer-scope values, nested subgraphs, for- and
# while-loops, empty scan outputs, reversed scans, opset 8's batched Scan) through
# `fathom run` against ONNX Runtime, and the refusals of bad ones (tests/onnx_flow_check.py).
# Skipped (77) when onnx or onnxruntime is missing.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
cli_py_check cli_onnx_flow onnx_flow_check.py "If, Loop and Scan equal to ONNX Runtime; bad ones refused"
