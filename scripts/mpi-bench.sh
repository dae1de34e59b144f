#!/usr/bin/env bash
# The allreduce family measured over MPI on this machine: for 2 and 4 ranks (4 oversubscribe the 2 cores),
# calibrate the allreduce cost model, then benchmark every algorithm against MPI_Allreduce with
# `auto` choosing from that calibration. Outputs go to out/mpi-bench/ (git show d620cdd:docs/results.md quotes them).
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -x build/pipesgd ]] || bash scripts/build.sh
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
out=out/mpi-bench
mkdir -p "$out"
for ranks in 2 4; do
  echo "== $ranks ranks: calibrate" >&2
  mpirun -np "$ranks" --oversubscribe build/pipesgd calibrate --transport mpi --repeats "${CALIBRATE_REPEATS:-21}" \
    --out "$out/calibration-$ranks" | tee "$out/calibrate-$ranks.txt"
  echo "== $ranks ranks: bench allreduce" >&2
  mpirun -np "$ranks" --oversubscribe build/pipesgd bench allreduce --transport mpi --codecs none \
    --repeats "${REPEATS:-41}" --calibration "$out/calibration-$ranks/calibration.json" --out "$out/bench-$ranks" \
    | tee "$out/bench-$ranks.txt"
done
