#!/usr/bin/env bash
# The simulator against real runs here (git show d620cdd:docs/results.md, "Validation against real runs here"): for
# each model, its profile measured here (`pipesgd profile`), then per method the iteration time of a real run with emulated
# links (`pipesgd compare`, worker threads, --net) beside the simulated one (`pipesgd simulate` on
# that profile, the same --net with the ideal network model: the emulation's alpha-beta links).
#
#   bash scripts/validate-simulator.sh [--models mlp,cnn,resnet] [--workers 2] [--iters N]
#                                      [--net 10gbe] [--algos LIST] [--repeats R] [--cluster]
#                                      [BUILD_DIR=build]
#
# --cluster: the measured side runs on the local cluster (scripts/local-cluster.sh, which must be up
# with at least --workers hosts: as root) instead of emulated links: `compare --transport mpi` under
# mpirun, one rank per host (h1..hW), MPI over real TCP through the hosts' shaped links; --net then
# describes those links for the profile and the simulation (e.g. bw=1Gbit,lat=40us for `up --rate
# 1gbit`).
#
# The profile is measured with --workers W --in-run --net NET over 200 iterations: each layer's
# backward, the forward and the update come from W workers of a D-Sync run over the same emulated
# network (the contention of their compute threads, comm threads and links on this machine's cores,
# which W replicas side by side do not reproduce); the forward's split over the layers, the data
# time and the codecs' costs from W replicas at once. A worker's comm thread shares a core with
# compute threads, so the simulation runs with --comm-shares-core (the codecs' CPU work competes
# with compute).
# The measured side runs `compare` R times (--repeats, default 1) and takes each method's median
# iteration: on this shared machine one method's iteration time moves by more than 15% between
# runs of the same command, so a single run cannot judge a 15% agreement.
# Prints per model and method: measured (median) and simulated iteration (ms) and the simulation's
# error (simulated / measured - 1). Exit 0 when every run succeeded (it measures; the reader judges).
set -euo pipefail
MODELS=mlp,cnn,resnet
WORKERS=2
ITERS=300
NET=10gbe
ALGOS=dsync,pipe,pipe+int8,wfbp,mgwfbp,dsync+optimal,sapipe,pssync
REPEATS=1
CLUSTER=0
BUILD=build
while [ $# -gt 0 ]; do
  case $1 in
    --models) MODELS=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --net) NET=$2; shift 2 ;;
    --algos) ALGOS=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;;
    --cluster) CLUSTER=1; shift ;;
    -*) echo "validate-simulator: unknown option $1" >&2; exit 2 ;;
    *) BUILD=$1; shift ;;
  esac
done
BIN=$BUILD/pipesgd
[ -x "$BIN" ] || { echo "validate-simulator: $BIN not found (bash scripts/build.sh first)" >&2; exit 2; }
CORES=$(nproc)
OUT=${VALIDATE_OUT:-$(mktemp -d)}
mkdir -p "$OUT"
where="--net $NET"
[ "$CLUSTER" = 0 ] || where="the local cluster's hosts h1..h$WORKERS (simulated as --net $NET)"
echo "validate-simulator: models $MODELS, $WORKERS workers on $CORES cores (profiled $WORKERS at once), $where," \
     "$ITERS iterations, methods $ALGOS; profiles --in-run; files in $OUT; load average $(cut -d' ' -f1-3 /proc/loadavg)"
IFS=, read -r -a models <<<"$MODELS"
for model in "${models[@]}"; do
  # Measured as the run computes: WORKERS workers of a D-Sync run on this machine's cores.
  "$BIN" profile --model "$model" --workers "$WORKERS" --in-run --net "$NET" --iters 200 --quiet \
    --out "$OUT/$model-profile.json" >/dev/null
  for r in $(seq 1 "$REPEATS"); do
    if [ "$CLUSTER" = 1 ]; then
      hosts=$(seq -s, -f 'h%g:1' 1 "$WORKERS")
      (eval "$(scripts/local-cluster.sh env)"
       OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np "$WORKERS" -H "$hosts" "$(readlink -f "$BIN")" \
         compare --transport mpi --model "$model" --algos "$ALGOS" --iters "$ITERS" --no-eval --quiet \
         --out "$OUT/$model-measured-$r") >"$OUT/$model-measured-$r.txt"
    else
      "$BIN" compare --model "$model" --workers "$WORKERS" --net "$NET" --algos "$ALGOS" --iters "$ITERS" --no-eval \
        --quiet --out "$OUT/$model-measured-$r" >"$OUT/$model-measured-$r.txt"
    fi
  done
  "$BIN" simulate --profile "$OUT/$model-profile.json" --workers "$WORKERS" --net "$NET" --network-model ideal \
    --comm-shares-core --algos "$ALGOS" --quiet --out "$OUT/$model-simulated" \
    >"$OUT/$model-simulated.txt"
done
python3 - "$OUT" "$MODELS" "$WORKERS" "$REPEATS" <<'PY'
import json, sys
out, models, workers, repeats = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), int(sys.argv[4])
worst = 0
within = total = 0
for model in models:
    runs = [json.load(open(f"{out}/{model}-measured-{r}/compare.json")) for r in range(1, repeats + 1)]
    measured = {}
    for method in [row["method"] for row in runs[0]]:
        rows = sorted((row for run in runs for row in run if row["method"] == method), key=lambda row: row["iteration_s"])
        measured[method] = rows[len(rows) // 2]  # the median run (the upper one of an even count)
    simulated = {r["method"]: r for r in json.load(open(f"{out}/{model}-simulated/simulate.json")) if r["workers"] == workers}
    print(f"\n{model}, {workers} workers")
    print(f"{'method':<15} {'measured ms':>11} {'simulated ms':>12} {'error':>7}   {'measured compute+wait':>22}")
    for method, m in measured.items():
        s = simulated[method]
        error = s["iteration_s"] / m["iteration_s"] - 1
        worst = max(worst, abs(error))
        total += 1
        within += abs(error) <= 0.15
        b = m["breakdown"]
        compute = b["data_s"] + b["forward_s"] + b["backward_s"] + b["update_s"] + b["compensation_s"]
        print(f"{method:<15} {m['iteration_s'] * 1e3:>11.3f} {s['iteration_s'] * 1e3:>12.3f} {error:>+7.1%}"
              f"   {compute * 1e3:>9.3f} + {b['wait_s'] * 1e3:.3f}")
print(f"\nwithin 15%: {within} of {total}; largest |error|: {worst:.1%}"
      + (f" (measured: medians of {repeats} runs)" if repeats > 1 else ""))
PY
