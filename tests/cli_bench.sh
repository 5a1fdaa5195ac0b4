#!/usr/bin/env bash
# `fathom bench`: inference latency of a trained model directory, its compiled graph and
# an ONNX export, on the CPU and on the checked test device (`--device` as the other
# commands take it); the report's numbers are consistent (min <= median <= p90 <= p99,
# throughput = batch / median); bad input (no model, an unknown option, bad numbers, a
# --dim without NAME=, a model that is not one, a device this machine lacks) is refused
# with its reason and the usage exit code where it is a usage error. --profile writes a
# trace of the timed runs that `fathom profile` reads.
# Usage: bash tests/cli_bench.sh <path-to-fathom-binary>
set -uo pipefail
bin=${1:?usage: cli_bench.sh FATHOM_BIN}
. "$(dirname "$0")/cli_lib.sh"
cli_begin fathom_cli_bench

cli_images "$tmp" 64 16
cli_idx_recipe "$tmp" 1 "conv2d 4 3 padding=1" relu "maxpool2d 2" flatten "linear 4" > "$tmp/syn.ini"
"$bin" train "$tmp/syn.ini" --out "$tmp/cnn" > /dev/null 2> "$tmp/train.err" || { echo "training the CNN failed"; cat "$tmp/train.err"; exit 1; }
"$bin" compile "$tmp/cnn" -o "$tmp/cnn.graph" > /dev/null 2>&1 || bad "compile failed"

# ---- usage and bad input ----
expect 0 "usage: fathom bench" "$bin" bench --help
expect 2 "no model given" "$bin" bench
expect 2 "did you mean '--iters'" "$bin" bench "$tmp/cnn" --itres 3
expect 2 "--iters needs a whole number" "$bin" bench "$tmp/cnn" --iters 0
expect 2 "--batch needs a whole number" "$bin" bench "$tmp/cnn" --batch abc
expect 2 "--dim needs NAME=VALUE" "$bin" bench "$tmp/cnn" --dim 5
expect 2 "needs a value" "$bin" bench "$tmp/cnn" --warmup
expect 2 "more than one model" "$bin" bench "$tmp/cnn" "$tmp/cnn.graph"
expect 1 "bench: $tmp/nothing" "$bin" bench "$tmp/nothing"
if "$bin" info --json | grep -q '"cuda_built": true' && ! "$bin" info | grep -q "cuda:0 "; then
  expect 1 "cuda" "$bin" bench "$tmp/cnn" --device cuda
fi

# ---- runs: the model, its graph, its ONNX export; cpu and check ----
check_report() { # LABEL JSON BATCH
  python3 - "$2" "$3" <<'PY' && ok "$1" || bad "$1: $2"
import json, sys
r, b = json.loads(sys.argv[1]), int(sys.argv[2])
assert r["batch"] == b and r["iters"] == 7, r
assert 0 < r["min_ms"] <= r["median_ms"] <= r["p90_ms"] <= r["p99_ms"], r
assert abs(r["items_per_s"] - b / (r["median_ms"] / 1e3)) <= 1e-6 * r["items_per_s"], r
assert r["inputs"].startswith("input f32 [%d, 1, 8, 8]" % b), r
PY
}
for dev in cpu check; do
  out=$("$bin" bench "$tmp/cnn" --batch 5 --iters 7 --warmup 1 --device $dev --json 2>&1) && check_report "model on $dev" "$out" 5 || bad "model on $dev: $out"
  out=$("$bin" bench "$tmp/cnn.graph" --batch 3 --iters 7 --device $dev --json 2>&1) && check_report "graph on $dev" "$out" 3 || bad "graph on $dev: $out"
done
if "$bin" export "$tmp/cnn" -o "$tmp/cnn.onnx" > /dev/null 2>&1; then
  out=$("$bin" bench "$tmp/cnn.onnx" --batch 2 --iters 7 --json 2>&1) && check_report "ONNX export" "$out" 2 || bad "onnx: $out"
else
  bad "export to ONNX failed"
fi
expect 0 "throughput:" "$bin" bench "$tmp/cnn" --iters 3

# --profile: a trace of the timed runs only (7 runs: the conv traced 7 times, not 7 + warm-up),
# which `fathom profile` reads; a trace that cannot be written is refused by name
out=$("$bin" bench "$tmp/cnn.graph" --iters 7 --warmup 2 --profile "$tmp/b.json" 2>&1); rc=$?
check "--profile: exit 0, the trace named ($out)" '[ $rc = 0 ] && [[ "$out" == *"trace:   $tmp/b.json (the 7 timed runs"* ]]'
prof=$("$bin" profile "$tmp/b.json" 2>&1)
check "--profile: fathom profile sums 7 calls of the fused conv ($(echo "$prof" | grep -m1 conv))" \
  '[[ "$(echo "$prof" | grep -m1 -E "^conv2d" | awk "{print \$2}")" = 7 ]]'
expect 1 "--profile $tmp/none/b.json" "$bin" bench "$tmp/cnn.graph" --iters 2 --profile "$tmp/none/b.json"

cli_end cli_bench
