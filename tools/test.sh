#!/usr/bin/env bash
# The README's test command: installs dependencies, builds (warnings are errors),
# and runs the whole test suite with ctest, including the unit tests under
# valgrind. The build is CPU-only unless FATHOM_CUDA=ON|AUTO is set: the CPU build
# is complete; .ci/run also runs this with FATHOM_CUDA=AUTO (the default
# configuration: CUDA on where the toolkit is installed), and tools/gpu-check.sh
# runs the CUDA path on a GPU.
# BUILD_DIR, BUILD_TYPE, CMAKE_ARGS and CTEST_ARGS may be set by the caller.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup-deps.sh
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} -DFATHOM_WERROR=ON \
  -DFATHOM_CUDA=${FATHOM_CUDA:-OFF} ${CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
cd "$BUILD_DIR"
ctest --output-on-failure -j"${CTEST_JOBS:-$(nproc)}" ${CTEST_ARGS:-}
