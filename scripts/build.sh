#!/usr/bin/env bash
# Installs the Debian packages (idempotent) and builds pipesgd into ./build (Release with -O3 hot loops).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
