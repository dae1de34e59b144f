#!/usr/bin/env bash
# Installs the Debian packages (idempotent) and builds pipesgd into ./build (Release with -O3 hot loops).
#
#   bash scripts/build.sh              everything: the CLI, the libraries, the Python module, every test
#   bash scripts/build.sh TARGET...    only these CMake targets and what they need (scripts/run.sh
#                                      builds just `pipesgd`, the CLI)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
if [ $# -eq 0 ]; then
  cmake --build build -j"$(nproc)"
else
  cmake --build build -j"$(nproc)" --target "$@"
fi
