#!/usr/bin/env bash
# Attention (opset 23 and 24: grouped-query, past and present, causal, bool and float masks,
# softcap, 3-D inputs, the qk_matmul_output modes, float16) and RotaryEmbedding (interleaved,
# partial, 3-D, with and without position_ids) through `fathom run` against ONNX Runtime, and
# the refusals of bad ones (tests/onnx_attn_check.py). Skipped (77) when onnx or onnxruntime
# is missing.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
cli_py_check cli_onnx_attn onnx_attn_check.py "Attention and RotaryEmbedding equal to ONNX Runtime; bad inputs refused"
