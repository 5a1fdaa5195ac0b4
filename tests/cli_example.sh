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
# the build's own fathom.pc names what a static link needs (CUDA libraries in a CUDA build)
cc -std=c11 $flags -I"$src/include" -o "$tmp/tiny" "$src/examples/tiny.c" "$build/libfathom.a" \
   $(PKG_CONFIG_PATH="$build" pkg-config --define-variable=libdir="$build" --libs --static fathom | sed 's/-lfathom\b//')
"$tmp/tiny" | tee "$tmp/out"
first=$(awk '/^step/ {print $4; exit}' "$tmp/out")
last=$(awk '/^step/ {v=$4} END {print v}' "$tmp/out")
awk -v a="$first" -v b="$last" 'BEGIN { if (!(b < a / 2)) { print "loss did not fall: " a " -> " b; exit 1 } }'
# a library user with a malformed memory variable is told so on stderr (the library
# has no caller to return an error to when it reads the environment), and still runs
FATHOM_MEMORY_LIMIT=lots FATHOM_MEMORY_MODE=huge "$tmp/tiny" > /dev/null 2> "$tmp/err" ||
  { echo "tiny failed with a malformed FATHOM_MEMORY_LIMIT"; cat "$tmp/err"; exit 1; }
grep -q "FATHOM_MEMORY_LIMIT='lots' is not a size" "$tmp/err" ||
  { echo "no warning for FATHOM_MEMORY_LIMIT=lots:"; cat "$tmp/err"; exit 1; }
grep -q "FATHOM_MEMORY_MODE='huge' is not grow or preallocate" "$tmp/err" ||
  { echo "no warning for FATHOM_MEMORY_MODE=huge:"; cat "$tmp/err"; exit 1; }
echo "cli_example: ok (loss $first -> $last)"
