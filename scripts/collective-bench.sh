#!/usr/bin/env bash
# Collectives of two builds, alternated run by run (old, new, old, new, ...): the ring allreduce of
# `pipesgd bench allreduce` (MPI ranks and threads) and pipesgd.torch's Horovod-style collectives
# (float32 Sum). Prints each run's figures, the ratio new/old of each pair and their median.
#
#   bash scripts/collective-bench.sh OLD_BUILD NEW_BUILD [PAIRS]      (PAIRS default 7)
#   bash scripts/collective-bench.sh --one BUILD KIND                 one run: KIND = mpi, threads or python
#
# A build is a CMake build directory with the targets pipesgd and pipesgd_python (BUILD/pipesgd,
# BUILD/python). E.g. the commit before the negotiated engine against this one:
#   git worktree add /tmp/old 3298afe
#   cmake -S /tmp/old -B /tmp/old/build -DCMAKE_BUILD_TYPE=RelWithDebInfo
#   cmake --build /tmp/old/build -j2 --target pipesgd pipesgd_python
#   bash scripts/collective-bench.sh /tmp/old/build build
# Environment: SIZE (bytes of the CLI allreduce, default 2592040 = the MLP's gradients), REPEATS (20).
set -euo pipefail
ab_lib=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib  # ab_stats.py: the A/B statistics every benchmark prints
export OMP_NUM_THREADS=1
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
SIZE=${SIZE:-2592040}
REPEATS=${REPEATS:-20}
MPIRUN=(mpirun -np 2 --oversubscribe --bind-to none -x OMP_NUM_THREADS)

python_bench() {
  cat <<'EOF'
import time
import torch
import pipesgd.torch as hvd

torch.set_num_threads(1)
hvd.init()
small = torch.ones(1024, dtype=torch.float32)
large = torch.ones(1024 * 1024, dtype=torch.float32)
many = [torch.ones(1024 * (k + 1), dtype=torch.float32) for k in range(16)]


def async16():
    handles = [hvd.allreduce_async(t, op=hvd.Sum) for t in many]
    for h in handles:
        hvd.synchronize(h)


def timed(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    hvd.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters * 1e6


figures = [("py_allreduce_1K_us", timed(lambda: hvd.allreduce(small, op=hvd.Sum), 2000, 200)),
           ("py_allreduce_1M_us", timed(lambda: hvd.allreduce(large, op=hvd.Sum), 100, 10)),
           ("py_async16_us", timed(async16, 200, 20)),
           ("py_barrier_us", timed(hvd.barrier, 2000, 200))]
if hvd.rank() == 0:
    for label, us in figures:
        print(f"FIGURE {label} {us:.2f}", flush=True)
hvd.shutdown()
EOF
}

# One run of BUILD: prints `FIGURE <name> <microseconds>` lines.
one() {
  local build kind
  build=$(cd "$1" && pwd) kind=$2
  case $kind in
    mpi | threads)
      local cmd=("$build/pipesgd" bench allreduce --algos ring --codecs none --sizes "$SIZE" --repeats "$REPEATS" --quiet)
      if [ "$kind" = mpi ]; then
        cmd=("${MPIRUN[@]}" "${cmd[@]}" --transport mpi --workers 2)
      else
        cmd=("${cmd[@]}" --transport local --workers 2)
      fi
      "${cmd[@]}" | awk -v k="$kind" '$1 == "ring" { print "FIGURE cli_" k "_ring_us", $4 }'
      ;;
    python)
      local script
      script=$(mktemp --suffix=.py)
      python_bench >"$script"
      PYTHONPATH="$build/python" "${MPIRUN[@]}" -x PYTHONPATH /usr/bin/python3 "$script" | grep '^FIGURE'
      rm -f "$script"
      ;;
    *) echo "unknown kind $kind (mpi, threads, python)" >&2; exit 2 ;;
  esac
}

if [ "${1:-}" = --one ]; then
  one "$2" "$3"
  exit
fi

old=$1 new=$2 pairs=${3:-7}
log=$(mktemp)
for kind in mpi threads python; do
  one "$old" "$kind" >/dev/null  # warm-up (page cache, first MPI start)
  for ((i = 0; i < pairs; i++)); do
    one "$old" "$kind" | sed "s/^/old $i /" >>"$log"
    one "$new" "$kind" | sed "s/^/new $i /" >>"$log"
  done
done
PYTHONPATH="$ab_lib" /usr/bin/python3 - "$log" <<'EOF'
import statistics, sys
import ab_stats
runs = {}
for line in open(sys.argv[1]):
    which, i, _, name, us = line.split()
    runs.setdefault(name, {}).setdefault(int(i), {})[which] = float(us)
print(f"{'figure':24} {'old us (median)':>16} {'new us (median)':>16} {'median new/old':>15}  ratios run by run")
for name, by_run in runs.items():
    pairs = [r for r in by_run.values() if "old" in r and "new" in r]
    ratios = ab_stats.pair_ratios([r["new"] for r in pairs], [r["old"] for r in pairs])
    print(f"{name:24} {statistics.median(r['old'] for r in pairs):16.1f} "
          f"{statistics.median(r['new'] for r in pairs):16.1f} {statistics.median(ratios):15.2f}  "
          + " ".join(f"{x:.2f}" for x in ratios))
EOF
rm -f "$log"
