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
# recipe models trained here (synthetic 8x8 images), exported from their model
# directories: a CNN (conv, batch norm, relu, max pool, flatten, linear) and one with
# every other layer kind a classifier recipe can hold but embedding (average pool,
# layer norm, gelu, flatten, linear, rms norm, silu, tanh, dropout, sigmoid).
# onnx.checker accepts each, its input keeps the dynamic batch dim, and ONNX Runtime's
# logits match `fathom run` on the file within 1e-5 relative.
# The embedding layer takes token ids, which these image data sets do not give (a trained
# embedding model on CSV ids is exported and checked in tests/cli_embedding.sh): the
# directory `fathom train` would write (model.safetensors with the recipe in its metadata)
# is written by numpy + safetensors
# with seeded weights for embedding 16 3, layer norm, flatten, linear 4 on [1, 8, 8] ids;
# exported, its input is int64 [batch, 1, 8, 8] (a Gather), the checker accepts it, and
# ONNX Runtime matches `fathom run` within 1e-5 relative and numpy's own lookup + layer
# norm + linear on the weights within 1e-5
cli_images "$d" 128 64
cli_idx_recipe "$d" 1 "conv2d 4 3 padding=1" batchnorm2d relu "maxpool2d 2" flatten "linear 4" > "$d/syn.ini"
cli_idx_recipe "$d" 1 "avgpool2d 2" layernorm gelu flatten "linear 12" rmsnorm silu "linear 8" tanh \
  "dropout 0.2" sigmoid "linear 4" > "$d/mix.ini"
for m in cnn mix; do
  ini=$d/syn.ini
  [ $m = mix ] && ini=$d/mix.ini
  "$bin" train "$ini" --out "$d/$m" > /dev/null 2> "$d/train.err" || { echo "FAIL: training $m"; cat "$d/train.err"; exit 1; }
  "$bin" export "$d/$m" -o "$d/$m.onnx" > /dev/null || { echo "FAIL: export of the trained $m"; fail=1; }
done
if "$py" -c "import onnx, onnxruntime, numpy" 2>/dev/null; then
  if "$py" -c "import safetensors.numpy" 2>/dev/null; then
    { cli_idx_data "$d"; printf '[model]\ninput = 1 8 8\nlayer = embedding 16 3\nlayer = layernorm\nlayer = flatten\n'
      printf 'layer = linear 4\n[train]\nepochs = 1\nbatch = 32\n'; } > "$d/emb.ini"
    "$py" - "$d" <<'PY' || { echo "FAIL: writing the embedding model"; fail=1; }
import os, sys, numpy as np
from safetensors.numpy import save_file
d = sys.argv[1]
r = np.random.default_rng(5)
w = {"0.weight": r.standard_normal((16, 3)), "1.weight": 1 + 0.1 * r.standard_normal(3),
     "1.bias": 0.1 * r.standard_normal(3), "3.weight": 0.2 * r.standard_normal((4, 192)),
     "3.bias": 0.1 * r.standard_normal(4)}
os.makedirs(f"{d}/emb", exist_ok=True)
save_file({k: v.astype(np.float32) for k, v in w.items()}, f"{d}/emb/model.safetensors",
          metadata={"fathom.recipe": open(f"{d}/emb.ini").read()})
PY
    err=$("$bin" export "$d/emb" -o "$d/emb.onnx" 2>&1) || { echo "FAIL: export of the embedding model: $err"; fail=1; }
  else
    echo "SKIP: the embedding model's export (python module safetensors is not installed)"
  fi
  "$py" - "$bin" "$d" <<'PY' || fail=1
import subprocess, sys, numpy as np, onnx, onnxruntime as ort
fathom, d = sys.argv[1], sys.argv[2]
x = np.random.default_rng(0).standard_normal((5, 1, 8, 8)).astype(np.float32)
np.save(f"{d}/x.npy", x)
bad = 0
for m in ("cnn", "mix"):
    onnx.checker.check_model(onnx.load(f"{d}/{m}.onnx"), full_check=True)
    s = ort.InferenceSession(f"{d}/{m}.onnx", providers=["CPUExecutionProvider"])
    (ref,) = s.run(None, {s.get_inputs()[0].name: x})
    subprocess.run([fathom, "run", f"{d}/{m}.onnx", "--input", f"{d}/x.npy", "--output", f"{d}/out_{m}"], check=True,
                   capture_output=True)
    mine = np.load(f"{d}/out_{m}/{s.get_outputs()[0].name}.npy")
    err = np.max(np.abs(ref - mine)) / np.max(np.abs(ref))
    ops = sorted({n.op_type for n in onnx.load(f"{d}/{m}.onnx").graph.node})
    print(f"trained {m} exported: inputs {[(i.name, i.shape) for i in s.get_inputs()]}, ONNX ops {' '.join(ops)}; "
          f"onnxruntime vs fathom max rel diff {err:.2e}")
    if not (err <= 1e-5 and ref.shape == (5, 4) and s.get_inputs()[0].shape[0] == "batch"):
        print(f"FAIL: {m}: shape {ref.shape}, input {s.get_inputs()[0].shape}, rel diff {err}")
        bad = 1
import os
if os.path.exists(f"{d}/emb.onnx"):
    from safetensors.numpy import load_file
    model = onnx.load(f"{d}/emb.onnx")
    onnx.checker.check_model(model, full_check=True)
    ids = np.random.default_rng(1).integers(0, 16, (5, 1, 8, 8)).astype(np.int64)
    np.save(f"{d}/ids.npy", ids)
    s = ort.InferenceSession(f"{d}/emb.onnx", providers=["CPUExecutionProvider"])
    inp = s.get_inputs()[0]
    (ref,) = s.run(None, {inp.name: ids})
    subprocess.run([fathom, "run", f"{d}/emb.onnx", "--input", f"{d}/ids.npy", "--output", f"{d}/out_emb"], check=True,
                   capture_output=True)
    mine = np.load(f"{d}/out_emb/{s.get_outputs()[0].name}.npy")
    err = np.max(np.abs(ref - mine)) / np.max(np.abs(ref))
    w = {k: v.astype(np.float64) for k, v in load_file(f"{d}/emb/model.safetensors").items()}
    e = w["0.weight"][ids]  # [5, 1, 8, 8, 3]
    e = (e - e.mean(-1, keepdims=True)) / np.sqrt(e.var(-1, keepdims=True) + 1e-5) * w["1.weight"] + w["1.bias"]
    want = e.reshape(5, -1) @ w["3.weight"].T + w["3.bias"]
    err_np = np.max(np.abs(ref - want)) / np.max(np.abs(want))
    ops = sorted({n.op_type for n in model.graph.node})
    print(f"embedding model exported: input {inp.name} {inp.type} {inp.shape}, ONNX ops {' '.join(ops)}; onnxruntime vs "
          f"fathom max rel diff {err:.2e}, vs numpy {err_np:.2e}")
    if not (err <= 1e-5 and err_np <= 1e-5 and ref.shape == (5, 4) and inp.shape[0] == "batch" and
            inp.type == "tensor(int64)" and "Gather" in ops):
        print(f"FAIL: embedding model: shape {ref.shape}, input {inp.type} {inp.shape}, rel diffs {err} {err_np}")
        bad = 1
sys.exit(bad)
PY
fi
"$py" tests/onnx_export_check.py "$bin"; rc=$?
[ $fail = 0 ] || exit 1
exit $rc
