#!/usr/bin/env bash
# The whole test suite: installs, builds, runs every test (unit, LibTorch oracle, CLI) under ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
export OMP_NUM_THREADS=1
cd build
ctest --output-on-failure --timeout 900 -j2
