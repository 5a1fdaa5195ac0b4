#!/usr/bin/env bash
# `fathom export` checked by ONNX itself (tests/onnx_export_check.py): every
# libonnx-testdata case that imports as a graph is exported, accepted by
# onnx.checker and run by ONNX Runtime with fathom's outputs within 1e-5
# relative. Skipped (77), with the reason, without onnx/onnxruntime; also the
# command's usage errors (exit 2) and refusals (exit 1).
set -uo pipefail
. "$(dirname "$0")/cli_lib.sh"
bin=$1
py=python3
[ -x .venv/bin/python ] && py=.venv/bin/python
d=$(mktemp -d /tmp/fathom_cli_export.XXXXXX)
trap 'rm -rf "$d"' EXIT
fail=0
"$bin" export 2>/dev/null; [ $? = 2 ] || { echo "FAIL: export without arguments must exit 2"; fail=1; }
"$bin" export "$d" 2>/dev/null; [ $? = 2 ] || { echo "FAIL: export without -o must exit 2"; fail=1; }
err=$("$bin" export "$d" -o "$d/m.onnx" 2>&1); rc=$?
[ $rc = 1 ] && [ ! -e "$d/m.onnx" ] ||
  { echo "FAIL: export of a non-graph directory: rc $rc, '$err'"; fail=1; }
# a CNN trained here (synthetic 8x8 images; conv, batch norm, relu, max pool, flatten,
# linear) exported from its model directory: onnx.checker accepts it and ONNX
# Runtime's logits match `fathom run` on the file within 1e-5 relative
cli_images "$d" 128 64
cli_idx_recipe "$d" 1 "conv2d 4 3 padding=1" batchnorm2d relu "maxpool2d 2" flatten "linear 4" > "$d/syn.ini"
"$bin" train "$d/syn.ini" --out "$d/cnn" > /dev/null 2> "$d/train.err" || { echo "FAIL: training the CNN"; cat "$d/train.err"; exit 1; }
"$bin" export "$d/cnn" -o "$d/cnn.onnx" > /dev/null || { echo "FAIL: export of the trained CNN"; fail=1; }
if "$py" -c "import onnx, onnxruntime, numpy" 2>/dev/null; then
  "$py" - "$bin" "$d" <<'PY' || fail=1
import subprocess, sys, numpy as np, onnx, onnxruntime as ort
fathom, d = sys.argv[1], sys.argv[2]
onnx.checker.check_model(onnx.load(f"{d}/cnn.onnx"), full_check=True)
s = ort.InferenceSession(f"{d}/cnn.onnx", providers=["CPUExecutionProvider"])
x = np.random.default_rng(0).standard_normal((5, 1, 8, 8)).astype(np.float32)
np.save(f"{d}/x.npy", x)
(ref,) = s.run(None, {s.get_inputs()[0].name: x})
subprocess.run([fathom, "run", f"{d}/cnn.onnx", "--input", f"{d}/x.npy", "--output", f"{d}/out"], check=True, capture_output=True)
mine = np.load(f"{d}/out/{s.get_outputs()[0].name}.npy")
err = np.max(np.abs(ref - mine)) / np.max(np.abs(ref))
print(f"trained CNN exported: inputs {[(i.name, i.shape) for i in s.get_inputs()]}, onnxruntime vs fathom max rel diff {err:.2e}")
sys.exit(0 if err <= 1e-5 else 1)
PY
fi
"$py" tests/onnx_export_check.py "$bin"; rc=$?
[ $fail = 0 ] || exit 1
exit $rc
