#!/usr/bin/env bash
# The ONNX backend node suite of the onnx PyPI package (onnx/backend/test/data/node,
# 1,765 cases in onnx 1.22.0; newer opsets than Debian's libonnx-testdata 1.12)
# through test_onnx_conformance, with the same 90% bar, graph conversion and
# export checks. Skipped (77), with the reason, when the package is missing.
set -uo pipefail
runner=$1
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
dir=$("$py" -c 'import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node"))' 2>/dev/null)
if [ -z "$dir" ] || [ ! -d "$dir" ]; then
  echo "SKIP: the onnx Python package (with its backend test data) is not installed: pip install onnx==1.22.0"
  exit 77
fi
echo "onnx $("$py" -c 'import onnx; print(onnx.__version__)'): $dir"
exec "$runner" "$dir" "${@:2}"
