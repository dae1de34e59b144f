#!/usr/bin/env bash
# The whole test suite: installs, builds, runs every test (unit, LibTorch oracle, CLI) under ctest,
# then fuzzes every decoder of untrusted bytes for a few seconds (scripts/fuzz.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
export OMP_NUM_THREADS=1
(cd build && ctest --output-on-failure --timeout 900 -j2)
# A short bounded libFuzzer run of every fuzz target (fuzz/README.md): clang build + 15 s each.
bash scripts/fuzz.sh 15
