#!/usr/bin/env bash
# `cmake --install` into a temporary prefix, then build and run a program against
# the installed headers and libfathom found through pkg-config (shared and static).
set -euo pipefail
bin=$1
build=$(dirname "$bin")
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
# a sanitizer build's library needs the program linked with the same runtime
extra=()
if "$bin" info --json | grep -q '"sanitized": true'; then extra=(-fsanitize=address,undefined); fi
cat > "$prefix/t.c" <<'C'
#include <fathom/fathom.h>
#include <stdio.h>
int main(void) {
    int64_t s[1] = {4};
    fm_tensor *t = fm_tensor_arange(0, 4, 1, FM_F32), *u = fm_sum(t, 0, NULL, false);
    printf("%g\n", fm_tensor_item(u));
    fm_tensor_release_n(2, t, u);
    (void)s;
    return 0;
}
C
cc "${extra[@]}" "$prefix/t.c" -o "$prefix/t_shared" $(pkg-config --cflags --libs fathom) -Wl,-rpath,"$prefix/lib"
[ "$("$prefix/t_shared")" = "6" ] || { echo "shared link: wrong output"; exit 1; }
cc "${extra[@]}" "$prefix/t.c" -o "$prefix/t_static" $(pkg-config --cflags fathom) "$prefix/lib/libfathom.a" $(pkg-config --libs --static fathom | sed 's/-lfathom//')
[ "$("$prefix/t_static")" = "6" ] || { echo "static link: wrong output"; exit 1; }
echo "install + pkg-config: ok"
