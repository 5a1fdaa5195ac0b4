#!/usr/bin/env bash
# tools/check-exports.py (the ctest public_exports) must fail on each kind of leak:
# a public prototype without FM_API, an FM_API declaration the library does not
# export, and an exported name that is undeclared or not fm_.
# Usage: bash tests/public_exports_can_fail.sh <path-to-libfathom.so>
set -euo pipefail
lib=${1:?usage: public_exports_can_fail.sh LIBFATHOM_SO}
src=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
check() { python3 "$src/tools/check-exports.py" "$@" >"$tmp/out" 2>&1; }
expect_fail() { # WHAT PATTERN ARGS...
  local what=$1 pattern=$2; shift 2
  if check "$@"; then echo "FAIL: check-exports passed with $what"; cat "$tmp/out"; exit 1; fi
  grep -q -- "$pattern" "$tmp/out" || { echo "FAIL: $what not named"; cat "$tmp/out"; exit 1; }
  echo "ok: $what is caught"
}
check "$lib" "$src/include/fathom" || { echo "FAIL: the real library and headers do not pass"; cat "$tmp/out"; exit 1; }

cp -r "$src/include/fathom" "$tmp/inc"
sed -i 's/^FM_API fm_tensor \*fm_neg(/fm_tensor *fm_neg(/' "$tmp/inc/ops.h"
grep -q '^fm_tensor \*fm_neg(' "$tmp/inc/ops.h" || { echo "FAIL: could not unmark fm_neg in ops.h"; exit 1; }
expect_fail "an unmarked prototype" "fm_neg is declared without FM_API" "$lib" "$tmp/inc"

cp "$src/include/fathom/ops.h" "$tmp/inc/ops.h"
printf '#include "fathom/export.h"\nFM_API void fm_not_defined_anywhere(void);\n' >"$tmp/inc/extra.h"
expect_fail "a declaration the library lacks" "fm_not_defined_anywhere is declared FM_API" "$lib" "$tmp/inc"

# a small library of our own that leaks a helper and an undeclared fm_ name
mkdir "$tmp/h"
printf '#include "fathom/export.h"\nFM_API int fm_declared(void);\n' >"$tmp/h/api.h"
printf 'int helper(void) { return 1; }\nint fm_undeclared(void) { return 2; }\nint fm_declared(void) { return helper() + fm_undeclared(); }\n' >"$tmp/leak.c"
cc -shared -fPIC "$tmp/leak.c" -o "$tmp/libleak.so"
expect_fail "a non-fm_ export" "helper: exported, and not an fm_ name" "$tmp/libleak.so" "$tmp/h"
expect_fail "an undeclared fm_ export" "fm_undeclared: exported but not declared" "$tmp/libleak.so" "$tmp/h"
echo "public_exports_can_fail: ok"
