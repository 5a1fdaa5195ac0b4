#!/usr/bin/env bash
# GridSample (every mode, padding mode and align_corners; 2-D and 3-D) and RoiAlign (avg and max,
# both coordinate modes, adaptive and fixed sampling) through `fathom run` against ONNX Runtime,
# and the refusals of bad ones (tests/onnx_sample_check.py). Skipped (77) when onnx or
# onnxruntime is missing.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
cli_begin fathom_cli_onnx_sample
out=$("$py" "$here/onnx_sample_check.py" "$bin" "$tmp" 2>&1); rc=$?
echo "$out"
[ $rc = 77 ] && exit 77
check "GridSample and RoiAlign equal to ONNX Runtime; bad inputs refused" '[ $rc = 0 ]'
cli_end cli_onnx_sample
