#!/usr/bin/env bash
# `fathom import`, `fathom compile` and `fathom quantize` on ONNX files that PyTorch's current
# exporter (torch.onnx.export, dynamo) writes for Hugging Face models: GPT-2, Llama, Qwen2 and
# BERT with random weights, batch and seq dynamic (tests/onnx_hf_export.py writes them with
# PyTorch's outputs at four shapes). Each imports with both dims kept dynamic (transformers 5's
# causal mask indexes position tables with GatherND over them), and the imported graph and the
# compiled one give PyTorch's outputs at batch x seq 1x1, 2x7, 3x13 and 1x40 within 1e-4
# relative (the compiled one also on the checked test device, where its fused attention runs
# as separate ops). The int8 dynamic graph quantized from the file runs at every shape too,
# within 0.1. The compiled graphs hold sdpa_mask nodes (fuse-masked-attention: 2 in each).
# Skipped (77), with the reason, without torch, transformers and onnxscript. About a minute
# (the four exports).
set -uo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cli_lib.sh"
cli_need_onnx_python
cli_begin fathom_cli_onnx_hf
d=$tmp
python3 "$here/onnx_hf_export.py" "$d"; rc=$?
[ $rc = 77 ] && exit 77
[ $rc = 0 ] || { echo "FAIL: exporting the models"; exit 1; }

# close TAG TOL MODEL GRAPH [DEVICE]: GRAPH run on every shape's ids against PyTorch's outputs
close() {
  local i
  for i in 0 1 2 3; do
    "$bin" run "$4" --input "input_ids=$d/$3_ids_$i.npy" --output "$d/out_$1_$i" --device "${5:-cpu}" >/dev/null 2>"$d/err" ||
      { echo "run $1 shape $i: $(cat "$d/err")"; return 1; }
  done
  python3 - "$d" "$1" "$2" "$3" <<'EOF'
import sys, numpy as np
d, tag, tol, model = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
worst = 0.0
for i in range(4):
    ref = np.load(f"{d}/{model}_ref_{i}.npy"); got = np.load(f"{d}/out_{tag}_{i}/y.npy")
    assert got.shape == ref.shape, (i, got.shape, ref.shape)
    worst = max(worst, float(np.abs(got - ref).max() / np.abs(ref).max()))
print(f"{tag}: largest |difference| / largest |PyTorch| over the 4 shapes {worst:.3g} (limit {tol})")
sys.exit(0 if worst <= tol else 1)
EOF
}

for m in gpt2 llama qwen2 bert; do
  out=$("$bin" import "$d/$m.onnx" -o "$d/$m.i" 2>&1); rc=$?
  check "$m: imported with batch and seq dynamic ($(echo "$out" | tail -1 | cut -c1-160))" \
    '[ $rc = 0 ] && [[ "$out" == *"inputs: input_ids i64 [batch, seq]"* ]]'
  check "$m: the imported graph matches PyTorch at 4 shapes" 'close "${m}_i" 1e-4 "$m" "$d/$m.i"'
  "$bin" compile "$d/$m.onnx" -o "$d/$m.c" >/dev/null 2>&1; rc=$?
  check "$m: two sdpa_mask nodes in the compiled graph" \
    '[ "$(python3 -c "import json, sys; print(sum(n[\"op\"] == \"sdpa_mask\" for n in json.load(open(sys.argv[1]))[\"nodes\"]))" "$d/$m.c/graph.json")" = 2 ]'
  check "$m: compiled (exit $rc), matches PyTorch at 4 shapes" '[ $rc = 0 ] && close "${m}_c" 1e-4 "$m" "$d/$m.c"'
  # the compiled graph's sdpa_mask nodes off the CPU run the pattern's ops again (grouped heads repeated)
  check "$m: compiled, on the check device, matches PyTorch at 4 shapes" 'close "${m}_cd" 1e-4 "$m" "$d/$m.c" check'
  "$bin" quantize "$d/$m.onnx" -o "$d/$m.q" --int8 --dynamic >/dev/null 2>&1; rc=$?
  check "$m: int8 dynamic from the file (exit $rc), within 0.1 of PyTorch at 4 shapes" '[ $rc = 0 ] && close "${m}_q" 0.1 "$m" "$d/$m.q"'
done
cli_end cli_onnx_hf_export
