#!/usr/bin/env bash
# Compiles every .cu file in the tree for sm_90 (+ PTX), as CI requires, even on a
# machine without a GPU. The full CUDA build (FATHOM_CUDA=ON) links them into libfathom.
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
mapfile -t files < <(find src -name '*.cu' | sort)
if ((${#files[@]} == 0)); then echo "no .cu files"; exit 0; fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for f in "${files[@]}"; do
  echo "nvcc $f"
  "$NVCC" -std=c++17 -O2 -Werror all-warnings -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
    -Iinclude -Isrc -DFATHOM_HAVE_CUDA=1 -c "$f" -o "$out/$(basename "$f").o"
done
echo "compiled ${#files[@]} .cu files"
