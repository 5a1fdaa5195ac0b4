#!/usr/bin/env bash
# `fathom export` checked by ONNX itself (tests/onnx_export_check.py): every
# libonnx-testdata case that imports as a graph is exported, accepted by
# onnx.checker and run by ONNX Runtime with fathom's outputs within 1e-5
# relative. Skipped (77), with the reason, without onnx/onnxruntime; also the
# command's usage errors (exit 2) and refusals (exit 1).
set -uo pipefail
bin=$1
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
d=$(mktemp -d /tmp/fathom_cli_export.XXXXXX)
trap 'rm -rf "$d"' EXIT
fail=0
"$bin" export 2>/dev/null; [ $? = 2 ] || { echo "FAIL: export without arguments must exit 2"; fail=1; }
"$bin" export "$d" 2>/dev/null; [ $? = 2 ] || { echo "FAIL: export without -o must exit 2"; fail=1; }
err=$("$bin" export "$d" -o "$d/m.onnx" 2>&1); rc=$?
[ $rc = 1 ] && [[ "$err" == *"not an inference graph directory"* ]] && [ ! -e "$d/m.onnx" ] ||
  { echo "FAIL: export of a non-graph directory: rc $rc, '$err'"; fail=1; }
"$py" tests/onnx_export_check.py "$bin"; rc=$?
[ $fail = 0 ] || exit 1
exit $rc
