#!/usr/bin/env bash
# `fathom run` on ONNX's recurrent ops LSTM, GRU and RNN: PyTorch's nn.LSTM/GRU/RNN
# exported by torch.onnx.export against PyTorch and ONNX Runtime, single nodes built with
# onnx.helper (sequence_lens, peepholes, clip, input_forget, linear_before_reset, layout 1,
# every activation) against ONNX Runtime, and the refusals of bad nodes
# (tests/onnx_rnn_check.py says what it compares and within what). Skipped (77) when
# torch, onnx or onnxruntime is missing.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
cli_begin fathom_cli_onnx_rnn
out=$("$py" "$here/onnx_rnn_check.py" "$bin" "$tmp" 2>&1); rc=$?
echo "$out"
[ $rc = 77 ] && exit 77
check "LSTM, GRU and RNN equal to PyTorch and ONNX Runtime; bad nodes refused" '[ $rc = 0 ]'
cli_end cli_onnx_rnn
