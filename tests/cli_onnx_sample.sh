#!/usr/bin/env bash
# GridSample (every mode, padding mode and align_corners; 2-D and 3-D) and RoiAlign (avg and max,
# both coordinate modes, adaptive and fixed sampling) through `fathom run` against ONNX Runtime,
# and the refusals of bad ones (tests/onnx_sample_check.py). Skipped (77) when onnx or
# onnxruntime is missing.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
cli_py_check cli_onnx_sample onnx_sample_check.py "GridSample and RoiAlign equal to ONNX Runtime; bad inputs refused"
