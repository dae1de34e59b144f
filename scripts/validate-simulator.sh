#!/usr/bin/env bash
# The simulator against real runs here (issue 18's validation): for each model, its profile
# measured here (`pipesgd profile`), then per method the iteration time of a real run with emulated
# links (`pipesgd compare`, worker threads, --net) beside the simulated one (`pipesgd simulate` on
# that profile, the same --net with the ideal network model: the emulation's alpha-beta links).
#
#   bash scripts/validate-simulator.sh [--models mlp,cnn,resnet] [--workers 2] [--iters N]
#                                      [--net 10gbe] [--algos LIST] [BUILD_DIR=build]
#
# The profile is measured with --workers W --in-run --net NET over 200 iterations: each layer's
# backward, the forward and the update come from W workers of a D-Sync run over the same emulated
# network (the contention of their compute threads, comm threads and links on this machine's cores,
# which W replicas side by side do not reproduce); the forward's split over the layers, the data
# time and the codecs' costs from W replicas at once. A worker's comm thread shares a core with
# compute threads, so the simulation runs with --comm-shares-core (the codecs' CPU work competes
# with compute).
# Prints per model and method: measured and simulated iteration (ms) and the simulation's error
# (simulated / measured - 1). Exit 0 when every run succeeded (it measures; the reader judges).
set -euo pipefail
MODELS=mlp,cnn,resnet
WORKERS=2
ITERS=300
NET=10gbe
ALGOS=dsync,pipe,pipe+int8,wfbp,mgwfbp,dsync+optimal,sapipe,pssync
BUILD=build
while [ $# -gt 0 ]; do
  case $1 in
    --models) MODELS=$2; shift 2 ;;
    --workers) WORKERS=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --net) NET=$2; shift 2 ;;
    --algos) ALGOS=$2; shift 2 ;;
    -*) echo "validate-simulator: unknown option $1" >&2; exit 2 ;;
    *) BUILD=$1; shift ;;
  esac
done
BIN=$BUILD/pipesgd
[ -x "$BIN" ] || { echo "validate-simulator: $BIN not found (bash scripts/build.sh first)" >&2; exit 2; }
CORES=$(nproc)
OUT=${VALIDATE_OUT:-$(mktemp -d)}
mkdir -p "$OUT"
echo "validate-simulator: models $MODELS, $WORKERS workers on $CORES cores (profiled $WORKERS at once), --net $NET," \
     "$ITERS iterations, methods $ALGOS; profiles --in-run; files in $OUT; load average $(cut -d' ' -f1-3 /proc/loadavg)"
IFS=, read -r -a models <<<"$MODELS"
for model in "${models[@]}"; do
  # Measured as the run computes: WORKERS workers of a D-Sync run on this machine's cores.
  "$BIN" profile --model "$model" --workers "$WORKERS" --in-run --net "$NET" --iters 200 --quiet \
    --out "$OUT/$model-profile.json" >/dev/null
  "$BIN" compare --model "$model" --workers "$WORKERS" --net "$NET" --algos "$ALGOS" --iters "$ITERS" --no-eval \
    --quiet --out "$OUT/$model-measured" >"$OUT/$model-measured.txt"
  "$BIN" simulate --profile "$OUT/$model-profile.json" --workers "$WORKERS" --net "$NET" --network-model ideal \
    --comm-shares-core --algos "$ALGOS" --quiet --out "$OUT/$model-simulated" \
    >"$OUT/$model-simulated.txt"
done
python3 - "$OUT" "$MODELS" "$WORKERS" <<'PY'
import json, sys
out, models, workers = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])
worst = 0
for model in models:
    measured = {r["method"]: r for r in json.load(open(f"{out}/{model}-measured/compare.json"))}
    simulated = {r["method"]: r for r in json.load(open(f"{out}/{model}-simulated/simulate.json")) if r["workers"] == workers}
    print(f"\n{model}, {workers} workers")
    print(f"{'method':<15} {'measured ms':>11} {'simulated ms':>12} {'error':>7}   {'measured compute+wait':>22}")
    for method, m in measured.items():
        s = simulated[method]
        error = s["iteration_s"] / m["iteration_s"] - 1
        worst = max(worst, abs(error))
        b = m["breakdown"]
        compute = b["data_s"] + b["forward_s"] + b["backward_s"] + b["update_s"] + b["compensation_s"]
        print(f"{method:<15} {m['iteration_s'] * 1e3:>11.3f} {s['iteration_s'] * 1e3:>12.3f} {error:>+7.1%}"
              f"   {compute * 1e3:>9.3f} + {b['wait_s'] * 1e3:.3f}")
print(f"\nlargest |error|: {worst:.1%} (target 15%)")
PY
