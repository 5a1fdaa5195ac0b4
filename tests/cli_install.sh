#!/usr/bin/env bash
# `cmake --install` into a temporary prefix, then build and run a program against
# the installed headers and libraries three ways: pkg-config (shared), pkg-config
# --static, and CMake's find_package(fathom) (fathom::fathom and fathom::fathom_static).
# In a CUDA build the static links need cudart and cuBLAS(Lt) from Libs.private /
# the package config: this is what catches a missing one.
set -euo pipefail
bin=$1
build=$(dirname "$bin")
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(dirname "$(find "$prefix" -name fathom.pc -path '*/pkgconfig/*')")/..
export PKG_CONFIG_PATH=$libdir/pkgconfig
# a sanitizer build's library needs the program linked with the same runtime
extra=()
if "$bin" info --json | grep -q '"sanitized": true'; then extra=(-fsanitize=address,undefined); fi
cat > "$prefix/t.c" <<'C'
#include <fathom/fathom.h>
#include <stdio.h>
int main(void) {
    fm_tensor *t = fm_tensor_arange(0, 4, 1, FM_F32), *u = fm_sum(t, 0, NULL, false);
    printf("%g\n", fm_tensor_item(u));
    fm_tensor_release_n(2, t, u);
    return 0;
}
C
# run PROGRAM WHAT SHARED|STATIC: prints 6, and needs libfathom.so only when SHARED
run() {
  [ "$("$1")" = "6" ] || { echo "$2: wrong output"; exit 1; }
  if readelf -d "$1" | grep -q 'NEEDED.*libfathom'; then
    [ "$3" = shared ] || { echo "$2: linked libfathom.so, not the static library"; exit 1; }
  else
    [ "$3" = static ] || { echo "$2: libfathom.so is not linked"; exit 1; }
  fi
  echo "$2: ok"
}
cc "${extra[@]}" "$prefix/t.c" -o "$prefix/t_shared" $(pkg-config --cflags --libs fathom) -Wl,-rpath,"$libdir"
run "$prefix/t_shared" "pkg-config (shared)" shared
# the README's static link command
cc "${extra[@]}" "$prefix/t.c" -o "$prefix/t_static" $(pkg-config --cflags fathom) "$(pkg-config --variable=libdir fathom)/libfathom.a" \
   $(pkg-config --libs --static fathom | sed 's/-lfathom\b//')
run "$prefix/t_static" "pkg-config --static" static

mkdir "$prefix/consumer"
cat > "$prefix/consumer/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.20)
project(fathom_consumer LANGUAGES C)
find_package(fathom 0.1 REQUIRED)
add_executable(t_cmake_shared ../t.c)
target_link_libraries(t_cmake_shared PRIVATE fathom::fathom)
add_executable(t_cmake_static ../t.c)
target_link_libraries(t_cmake_static PRIVATE fathom::fathom_static)
CM
cmake -S "$prefix/consumer" -B "$prefix/consumer/build" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_C_FLAGS="${extra[*]}" >"$prefix/consumer.log" 2>&1 &&
  cmake --build "$prefix/consumer/build" >>"$prefix/consumer.log" 2>&1 ||
  { cat "$prefix/consumer.log"; echo "find_package(fathom) consumer: build failed"; exit 1; }
run "$prefix/consumer/build/t_cmake_shared" "find_package fathom::fathom" shared
run "$prefix/consumer/build/t_cmake_static" "find_package fathom::fathom_static" static
echo "install + pkg-config + find_package: ok"
