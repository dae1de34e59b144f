#!/usr/bin/env bash
# The main job: installs, builds, then compares D-Sync with Pipe-SGD (with and without in-ring
# compression) on Fashion-MNIST, 4 workers, over an emulated 10 Gbit Ethernet, and prints one table.
# Extra arguments are passed to `pipesgd compare` (e.g. --epochs 3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
export OMP_NUM_THREADS=1
exec ./build/pipesgd compare --algos dsync,dsync+int8,pipe,pipe+bf16,pipe+int8 --net 10gbe --epochs 1 \
  --out out/main-job "$@"
