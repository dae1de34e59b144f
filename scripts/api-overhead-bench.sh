#!/usr/bin/env bash
# The C++ API's overhead (git show d620cdd:docs/results.md, "C++ API overhead"). Builds nothing:
# give the build directory of a RelWithDebInfo (or Release) build that has pipesgd and
# pipesgd_api_bench (the default build makes both).
#
#   bash scripts/api-overhead-bench.sh [--smoke] [--runs N] [BUILD_DIR=build]
#
# Two comparisons, each as alternated runs A B A B ... (one pair of warm-up runs first, not
# counted), the ratio taken pair by pair so that a drift of the machine's speed cancels; min, median
# and max of the per-pair ratios are printed, and the MEDIAN is the figure:
#
# (a) one worker: `pipesgd_api_bench api --workers 1 --method dsync` (A) against
#     `pipesgd_api_bench bare` (B), the same LeNet (the CLI's --model cnn), the same fixed synthetic
#     batches of 25, SGD lr 0.01, one torch thread, and glibc malloc keeping freed memory in the heap
#     (the API's default, WorldOptions::keep_freed_memory; the bare loop makes the same mallopt
#     calls). Figure: A's median step time / B's (per-step overhead of DistributedOptimizer over
#     torch::optim::SGD). Target <= 1.03.
# (b) four workers: `pipesgd_api_bench api --workers 4 --method dsync` (A) against
#     `pipesgd train --model cnn --algo dsync --workers 4 --data synthetic --iters N --no-eval` (B).
#     Figure: B's iteration_s (summary.json) / A's step_mean_ms, i.e. the API's steady-state speed
#     relative to the CLI's. Target >= 0.95. Fair because both run the same architecture, 4 thread
#     workers with batch 25 each, synthetic data, SGD lr 0.01, no evaluation, one torch thread; both
#     loops compute forward, cross-entropy, the correct count, loss.item() and backward; and both
#     figures are the same definition: the mean over workers and iterations [min(10, N/10), N) of
#     the time from one iteration's start to the next's. Whole-process wall times are NOT the
#     figure here: the CLI's start-up generates its 14000-example synthetic data set and writes its
#     report, fixed costs the API's loop does not have (it uses pre-generated batches). Their ratio
#     is printed for information only.
# Every command runs with OMP_NUM_THREADS=1 (both sides also set torch's threads to 1 themselves).
#
# --smoke: few iterations and runs, to check that the harness works (its figures mean nothing).
# Exit status: 0 when every run succeeded (whether or not the targets are met: it measures, the
# reader judges), 1 if a run failed, 2 for bad arguments.
set -euo pipefail
ab_lib=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib  # ab_stats.py: the A/B statistics every benchmark prints

runs=7
iters_one=3000   # (a): ~5 ms a step: ~15 s a run
iters_four=600   # (b): ~20 ms an iteration on 2 cores: ~12 s a run
build=build
smoke=0
while (($#)); do
  case "$1" in
    --smoke) smoke=1 runs=3 iters_one=200 iters_four=60 ;;
    --runs)
      [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || { echo "api-overhead-bench: --runs needs a positive integer" >&2; exit 2; }
      runs=$2
      shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "api-overhead-bench: unknown option '$1' (expected --smoke, --runs N)" >&2; exit 2 ;;
    *) build=$1 ;;
  esac
  shift
done
for binary in pipesgd pipesgd_api_bench; do
  [[ -x $build/$binary ]] || { echo "api-overhead-bench: $build/$binary not found (build it first: cmake --build $build)" >&2; exit 2; }
done
export OMP_NUM_THREADS=1
python=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run NAME KIND COMMAND...: runs COMMAND once, appends "wall_s=SECONDS FIGURES" to $work/NAME.
# KIND bench: FIGURES is the benchmark's own line; KIND cli: the CLI's summary.json as KEY=VALUE.
run() {
  local name=$1 kind=$2
  shift 2
  local out=$work/out start end
  rm -rf "$out"
  start=$EPOCHREALTIME
  if [[ $kind == cli ]]; then
    "$@" --out "$out" >"$work/stdout" 2>"$work/stderr" || { echo "api-overhead-bench: failed: $*" >&2; cat "$work/stderr" >&2; exit 1; }
  else
    "$@" >"$work/stdout" 2>"$work/stderr" || { echo "api-overhead-bench: failed: $*" >&2; cat "$work/stderr" >&2; exit 1; }
  fi
  end=$EPOCHREALTIME
  local figures
  if [[ $kind == cli ]]; then
    figures=$("$python" -c 'import json, sys; s = json.load(open(sys.argv[1]))
print("iteration_s=%.9f samples_per_s=%.1f measured=%d" % (s["iteration_s"], s["throughput_samples_per_s"], s["measured_iterations"]))' "$out/summary.json")
  else
    figures=$(tail -n 1 "$work/stdout")
  fi
  echo "wall_s=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.4f", b - a }') $figures" >>"$work/$name"
}

# compare LABEL: alternates the commands in arrays A and B (KIND in A_KIND, B_KIND), one warm-up
# pair then $runs pairs; leaves the counted runs' lines in $work/LABEL.A and $work/LABEL.B.
compare() {
  local label=$1 k
  echo "== $label: $runs alternated pairs (+1 warm-up pair)" >&2
  for ((k = 0; k <= runs; ++k)); do
    run "$label.A" "$A_KIND" "${A[@]}"
    run "$label.B" "$B_KIND" "${B[@]}"
    if ((k == 0)); then : >"$work/$label.A"; : >"$work/$label.B"; fi  # the warm-up pair
  done
}

# summarize LABEL NAME KEY_A KEY_B DIRECTION TARGET SENSE: min/median/max of the per-pair ratio of
# A's KEY_A to B's KEY_B (DIRECTION "A/B", or its inverse "B/A"), and the median against TARGET
# (SENSE "<=" or ">="; TARGET "-": none).
summarize() {
  PYTHONPATH="$ab_lib" "$python" - "$work" "$@" <<'EOF'
import sys
import ab_stats
work, label, name, key_a, key_b, direction, target, sense = sys.argv[1:9]
a, b = ab_stats.read_records(f"{work}/{label}.A"), ab_stats.read_records(f"{work}/{label}.B")
def scale(key):  # the CLI's iteration_s against the benchmark's milliseconds
    return 1e3 if key == "iteration_s" else 1.0
values_a = [float(r[key_a]) * scale(key_a) for r in a]
values_b = [float(r[key_b]) * scale(key_b) for r in b]
ratios = ab_stats.pair_ratios(values_a, values_b) if direction == "A/B" else ab_stats.pair_ratios(values_b, values_a)
print(ab_stats.summary(name, ratios, None if target == "-" else float(target), sense))
EOF
}

show_runs() {  # show_runs LABEL: every counted run's line, for the record
  local side
  for side in A B; do sed "s/^/  $side: /" "$work/$1.$side"; done
}

# (a) one worker: the API with dsync against a bare LibTorch loop.
A=("$build/pipesgd_api_bench" api --workers 1 --method dsync --iters "$iters_one"); A_KIND=bench
B=("$build/pipesgd_api_bench" bare --iters "$iters_one"); B_KIND=bench
compare one
# (b) four workers: the API against the CLI.
A=("$build/pipesgd_api_bench" api --workers 4 --method dsync --iters "$iters_four"); A_KIND=bench
B=("$build/pipesgd" train --model cnn --algo dsync --workers 4 --batch 25 --lr 0.01 --data synthetic
   --iters "$iters_four" --no-eval --quiet); B_KIND=cli
compare four

echo
((smoke == 0)) || echo "SMOKE RUN ($runs pairs, $iters_one / $iters_four iterations): the figures below only show the harness works"
echo "(a) 1 worker, dsync, LeNet, batch 25, $iters_one steps: A = API, B = bare LibTorch loop"
show_runs one
summarize one "per-step overhead A/B (median step time)" step_median_ms step_median_ms A/B 1.03 "<="
summarize one "the step's part after backward A/B (optimizer_median_ms)" optimizer_median_ms optimizer_median_ms A/B - "<="
summarize one "whole-process wall A/B" wall_s wall_s A/B - "<="
echo "(b) 4 workers, dsync, LeNet, batch 25 per worker, $iters_four iterations: A = API, B = CLI"
show_runs four
summarize four "API speed relative to CLI B/A (CLI iteration_s / API step_mean)" step_mean_ms iteration_s B/A 0.95 ">="
summarize four "whole-process wall B/A (CLI start-up included)" wall_s wall_s B/A - ">="
