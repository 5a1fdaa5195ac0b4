#!/usr/bin/env bash
# Compiles the README's C example (examples/tiny.c) against the freshly built
# static library and runs it: the loss it prints must fall.
# Usage: bash tests/cli_example.sh <path-to-fathom-binary>
set -euo pipefail
bin=${1:?usage: cli_example.sh FATHOM_BIN}
build=$(cd "$(dirname "$bin")" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags=""
grep -q "FATHOM_SANITIZE:BOOL=ON" "$build/CMakeCache.txt" 2>/dev/null && flags="-fsanitize=address,undefined"
cc -std=c11 $flags -I"$src/include" -o "$tmp/tiny" "$src/examples/tiny.c" "$build/libfathom.a" \
   $(pkg-config --libs jansson inih zlib) $(pkg-config --libs libpng 2>/dev/null || true) -lpthread -lm -ldl
"$tmp/tiny" | tee "$tmp/out"
first=$(awk '/^step/ {print $4; exit}' "$tmp/out")
last=$(awk '/^step/ {v=$4} END {print v}' "$tmp/out")
awk -v a="$first" -v b="$last" 'BEGIN { if (!(b < a / 2)) { print "loss did not fall: " a " -> " b; exit 1 } }'
echo "cli_example: ok (loss $first -> $last)"
