#!/usr/bin/env bash
# The quickstart: from a fresh checkout to a trained Fashion-MNIST classifier.
#   1. installs the build dependencies and dataset-fashion-mnist if missing (needs root),
#   2. builds fathom (Release, CPU),
#   3. trains the built-in fashion-cnn recipe (saving the model in runs/fashion-cnn),
#   4. evaluates the saved model on the 10k test images and prints a short result.
# Usage: bash tools/quickstart.sh [BUILD_DIR]   (default: build-quickstart)
# Environment: FATHOM_QUICKSTART_RECIPE (default fashion-cnn), FATHOM_QUICKSTART_OUT (default runs/<recipe>).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-quickstart}
recipe=${FATHOM_QUICKSTART_RECIPE:-fashion-cnn}
out=${FATHOM_QUICKSTART_OUT:-runs/$recipe}
t0=$(date +%s)

echo "== checking dependencies (installs what is missing: dataset-fashion-mnist, compilers, libraries)"
if [[ $(id -u) -ne 0 ]] && ! bash tools/setup-deps.sh --check; then
  echo "quickstart: dependencies missing; run as root or: sudo bash tools/setup-deps.sh" >&2
  exit 1
fi
bash tools/setup-deps.sh

echo "== building fathom in $build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DFATHOM_CUDA=OFF >/dev/null
cmake --build "$build" -j"$(nproc)" --target fathom_cli >/dev/null
t_build=$(date +%s)

echo "== training $recipe (model -> $out)"
mkdir -p "$out"
"$build/fathom" train "$recipe" --out "$out" --overwrite --logdir "$out/logs" --profile "$out/trace.json"
t_train=$(date +%s)

echo "== evaluating $out on the 10k test images"
result=$("$build/fathom" eval "$out" --json)
acc=$(echo "$result" | sed -n 's/.*"test_accuracy":\([0-9.eE+-]*\).*/\1/p')
t_end=$(date +%s)
awk -v acc="$acc" -v b=$((t_build - t0)) -v t=$((t_train - t_build)) -v e=$((t_end - t_train)) -v all=$((t_end - t0)) -v out="$out" 'BEGIN {
  printf "\nquickstart: test accuracy %.2f%% on Fashion-MNIST (10000 images)\n", 100 * acc
  printf "quickstart: model saved in %s (model.safetensors)\n", out
  printf "quickstart: %d s in all (build %d s, train %d s, eval %d s)\n", all, b, t, e
  printf "quickstart: TensorBoard logs in %s/logs (fathom plot %s/logs -o curves.svg)\n", out, out
  printf "quickstart: profiler trace in %s/trace.json (fathom profile %s/trace.json, or ui.perfetto.dev)\n", out, out
}'
echo "try: $build/fathom predict $out /usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz | head"
