#!/usr/bin/env bash
# The whole test suite: installs, builds, runs every test (unit, LibTorch oracle, CLI) under ctest,
# then fuzzes every decoder of untrusted bytes for a few seconds (scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
export OMP_NUM_THREADS=1
(cd build && ctest --output-on-failure --timeout 900 -j2)
# The public C++ API as a user gets it: install the package, build examples/cpp_api against it (a
# project of its own, find_package(pipesgd)) and train its convnet with pipe+int8 for 40 iterations.
rm -rf build/install build/example
cmake --install build --prefix build/install >/dev/null
cmake -S examples/cpp_api -B build/example -DCMAKE_PREFIX_PATH="$PWD/build/install" >/dev/null
cmake --build build/example -j2 >/dev/null
build/example/fashion_convnet 40
# A short bounded libFuzzer run of every fuzz target (fuzz/README.md): clang build + 15 s each.
bash scripts/fuzz.sh 15
