#!/usr/bin/env bash
# ONNX sequences and optionals (SplitToSequence, SequenceMap, ConcatFromSequence, the sequence
# ops, a Loop carrying a sequence, If giving sequences, Optional and its ops, a Loop carrying an
# optional) through `fathom run` against ONNX Runtime, each also on the check device, and the
# refusals of bad ones (tests/onnx_seq_check.py). Skipped (77) when onnx or onnxruntime is missing.
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
cli_py_check cli_onnx_seq onnx_seq_check.py "sequences and optionals equal to ONNX Runtime; bad ones refused"
