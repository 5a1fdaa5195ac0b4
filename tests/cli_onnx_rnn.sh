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
cli_py_check cli_onnx_rnn onnx_rnn_check.py "LSTM, GRU and RNN equal to PyTorch and ONNX Runtime; bad nodes refused"
