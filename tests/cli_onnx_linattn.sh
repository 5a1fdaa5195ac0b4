#!/usr/bin/env bash
# ONNX LinearAttention (every update rule, grouped- and multi-query heads, past_state, decode
# steps, float16) and CausalConvWithState (with and without state, bias, silu / swish, kernel
# size 1, float16) through `fathom run` against ONNX Runtime (ONNX's reference agreeing), also
# on --device check, and the refusals of bad ones (tests/onnx_linattn_check.py).
# Skipped (77) when onnx or onnxruntime is missing.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
cli_py_check cli_onnx_linattn onnx_linattn_check.py "LinearAttention and CausalConvWithState equal to ONNX Runtime; bad ones refused"
