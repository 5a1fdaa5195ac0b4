#!/usr/bin/env bash
# ConvTranspose over 3 spatial dims (strides, dilations, uneven pads, output_padding, groups,
# output_shape, auto_pad) through `fathom run` against ONNX Runtime, and the refusals of bad
# ones (tests/onnx_conv_check.py). Skipped (77) when onnx or onnxruntime is missing.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
cli_py_check cli_onnx_conv onnx_conv_check.py "3-D ConvTranspose equal to ONNX Runtime; bad ones refused"
