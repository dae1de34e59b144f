#!/usr/bin/env bash
# The main job, both halves of the story in a few minutes:
#  1. measured here: D-Sync against Pipe-SGD (plain and with 8-bit in-ring quantization) training the
#     MLP on Fashion-MNIST for one epoch with 2 workers, one per core of this machine, over an
#     emulated 10 Gbit Ethernet, where the MLP's computation and its allreduce take about as long
#     (so this machine's cores are not the bottleneck and pipelining has something to hide);
#  2. simulated: the same model (its profile measured here) and methods on SimGrid at 2 to 64 nodes
#     of a 10 Gbit network, the scale this machine cannot show.
# Extra arguments go to the measured `pipesgd compare` (e.g. --epochs 3).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh pipesgd   # the CLI only: the job runs nothing else (scripts/test.sh builds the rest)
export OMP_NUM_THREADS=1
OUT=out/main-job
mkdir -p "$OUT"
echo "== 1. measured: 2 workers (one per core), MLP, emulated 10 Gbit Ethernet"
./build/pipesgd compare --algos dsync,pipe,pipe+int8 --workers 2 --net 10gbe --out "$OUT/measured" "$@"
echo
echo "== 2. simulated: the same MLP (profiled here) and methods at 2 to 64 nodes of a 10 Gbit network"
./build/pipesgd profile --model mlp --quiet --out "$OUT/mlp-profile.json" >/dev/null
exec ./build/pipesgd simulate --profile "$OUT/mlp-profile.json" --workers 2,4,8,16,32,64 --net 10gbe \
  --algos dsync,pipe,pipe+int8 --comm-shares-core --quiet --out "$OUT/simulated"
