#!/usr/bin/env bash
# An op's attribute struct larger than fm_node.attrs (FM_NODE_ATTR_BYTES) must not
# compile, through either way ops reach the room (FM_NODE_SET_ATTRS, FM_NODE_ATTRS):
# an overflow there once clobbered grad_acc (src/autograd/node.h). A struct that fits
# compiles, so the check itself is shown to pass what it should.
# Usage: bash tests/node_attrs_can_fail.sh C_COMPILER
set -uo pipefail
cc=${1:?usage: node_attrs_can_fail.sh C_COMPILER}
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
snippet() { # BYTES USE: a translation unit storing / reading a BYTES-sized struct
  printf '#include "autograd/node.h"\ntypedef struct { unsigned char b[%d]; } big;\n' "$1"
  printf 'void f(fm_node *n, big *v);\nvoid f(fm_node *n, big *v) { %s }\n' "$2"
}
build() { "$cc" -std=c11 -fsyntax-only -I"$src/include" -I"$src/src" -x c "$1" >"$tmp/out" 2>&1; }
for use in 'FM_NODE_SET_ATTRS(n, *v);' '*v = *FM_NODE_ATTRS(n, big);'; do
  snippet 320 "$use" >"$tmp/fits.c"
  if build "$tmp/fits.c"; then echo "ok: 320 bytes compile ($use)"; else echo "FAIL: 320 bytes refused ($use)"; cat "$tmp/out"; fails=$((fails + 1)); fi
  snippet 321 "$use" >"$tmp/big.c"
  if build "$tmp/big.c"; then echo "FAIL: 321 bytes compiled ($use)"; fails=$((fails + 1)); else echo "ok: 321 bytes refused ($use)"; fi
done
grep -q "FM_NODE_ATTR_BYTES 320" "$src/src/autograd/node.h" || { echo "FAIL: the room is no longer 320 bytes: update this test"; fails=$((fails + 1)); }
((fails)) && { echo "node_attrs_can_fail: $fails failure(s)"; exit 1; }
echo "node_attrs_can_fail: all passed"
