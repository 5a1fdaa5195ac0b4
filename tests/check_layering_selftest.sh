#!/usr/bin/env bash
# tools/check-layering.py must fail on each kind of violation it claims to catch,
# and pass a clean tree: small synthetic trees, one fault each.
set -u
tool="$(cd "$(dirname "$0")/.." && pwd)/tools/check-layering.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

# tree NAME: a minimal clean layout (core, a backend, ops, public headers)
tree() {
    local r="$tmp/$1"
    mkdir -p "$r/include/fathom" "$r/src/core" "$r/src/backend/cpu" "$r/src/backend/cuda" "$r/src/ops" "$r/cli"
    printf '#include "fathom/error.h"\n' > "$r/include/fathom/tensor.h"
    : > "$r/include/fathom/error.h"
    printf '#include "fathom/tensor.h"\n' > "$r/include/fathom/ops.h"
    printf '#include "fathom/tensor.h"\n' > "$r/src/core/core.h"
    printf '#include "core/core.h"\n' > "$r/src/core/tensor.c"
    printf '#include "core/core.h"\n#include "fathom/ops.h"\n' > "$r/src/backend/cpu/k.c"
    printf '#include "core/core.h"\n' > "$r/src/backend/cuda/k.cu"
    printf '#include "core/core.h"\n#include "fathom/ops.h"\n' > "$r/src/ops/views.c"
    printf '#include "fathom/ops.h"\n' > "$r/cli/main.c"
    echo "$r"
}
# expect NAME RC PATTERN: the tool's exit status on tree NAME is RC and its output matches PATTERN
expect() {
    local out rc
    out=$(python3 "$tool" --root "$tmp/$1" 2>&1); rc=$?
    if [[ $rc -ne $2 ]] || ! grep -q -- "$3" <<<"$out"; then
        echo "FAIL $1: expected exit $2 and /$3/, got exit $rc:"; echo "$out"; fails=$((fails + 1))
    else
        echo "ok   $1: exit $rc, /$3/"
    fi
}

tree clean >/dev/null
expect clean 0 "point down only"

r=$(tree upward); printf '#include "ops/ops_internal.h"\n' >> "$r/src/core/tensor.c"; : > "$r/src/ops/ops_internal.h"
expect upward 1 "upward (core src/core -> ops src/ops)"

r=$(tree public_api); printf '#include "fathom/ops.h"\n' >> "$r/src/core/tensor.c"
expect public_api 1 "core includes only the core-level public headers"

r=$(tree sideways); printf '#include "backend/cuda/x.h"\n' >> "$r/src/backend/cpu/k.c"; : > "$r/src/backend/cuda/x.h"
expect sideways 1 "sideways (backends src/backend/cpu -> backends src/backend/cuda)"

r=$(tree unresolved); printf '#include "nowhere/missing.h"\n' >> "$r/src/ops/views.c"
expect unresolved 1 "matches no file in the tree"

r=$(tree cycle); printf '#include "core/b.h"\n' > "$r/src/core/a.h"; printf '#include "core/a.h"\n' > "$r/src/core/b.h"
expect cycle 1 "include cycle between files"

r=$(tree unknown_dir); mkdir -p "$r/src/newthing"; : > "$r/src/newthing/x.c"
expect unknown_dir 1 "not in any layer"

# --objects: a core object that calls a function an ops object defines
obj="$tmp/objs"; mkdir -p "$obj/src/core" "$obj/src/ops"
printf 'void fm_up(void);\nvoid fm_low(void) { fm_up(); }\n' | cc -c -x c - -o "$obj/src/core/low.c.o"
printf 'void fm_up(void) {}\n' | cc -c -x c - -o "$obj/src/ops/up.c.o"
out=$(python3 "$tool" --root "$tmp/clean" --objects "$obj" 2>&1); rc=$?
if [[ $rc -ne 1 ]] || ! grep -q "src/core/low.c: calls fm_up (ops src/ops): core calls nothing above it" <<<"$out"; then
    echo "FAIL core_call: expected exit 1 naming the call, got exit $rc:"; echo "$out"; fails=$((fails + 1))
else
    echo "ok   core_call: exit $rc, names src/core/low.c calling fm_up"
fi

if ((fails)); then echo "$fails case(s) failed"; exit 1; fi
echo "all cases behave"
