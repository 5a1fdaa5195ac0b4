#!/usr/bin/env bash
# The README's test command: installs dependencies, builds (warnings are errors),
# and runs the whole test suite with ctest. BUILD_DIR and CMAKE_ARGS may be set
# by the caller (CI uses them for the sanitizer build).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} -DFATHOM_WERROR=ON ${CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
cd "$BUILD_DIR"
ctest --output-on-failure -j"${CTEST_JOBS:-2}" ${CTEST_ARGS:-}
