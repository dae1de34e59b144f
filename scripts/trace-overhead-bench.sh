#!/usr/bin/env bash
# The cost of --trace (git show d620cdd:docs/results.md, "Trace overhead"). Builds nothing:
# give the build directory that has pipesgd.
#
#   bash scripts/trace-overhead-bench.sh [--smoke] [--runs N] [--algo SPEC] [--model M] [BUILD_DIR=build]
#
# The same run, `pipesgd train --algo SPEC --model M --workers 2 --net 10gbe --iters N --no-eval`,
# with --trace (A) and without (B), alternated A B A B ... after one untimed pair; the figure is
# each pair's ratio of throughput (summary.json throughput_samples_per_s, the run's own: the file's
# writing after the run is not in it), B / A - 1 = the traced run's loss of throughput; min, median
# and max over the pairs are printed and the MEDIAN is the figure. Target: <= 2%. The traced run
# records every iteration (no --trace-iters), its worst case. Writing the file is timed apart.
# --smoke: a few iterations and 2 pairs, to check the harness (its figures mean nothing).
set -euo pipefail
ab_lib=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib  # ab_stats.py: the A/B statistics every benchmark prints

runs=7
iters=1500
algo=pipe
model=mlp
build=build
while (($#)); do
  case $1 in
    --smoke) runs=2; iters=60; shift ;;
    --runs) runs=$2; shift 2 ;;
    --algo) algo=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    -*) echo "trace-overhead-bench: unknown option $1" >&2; exit 2 ;;
    *) build=$1; shift ;;
  esac
done
pipesgd=$build/pipesgd
[[ -x $pipesgd ]] || { echo "trace-overhead-bench: no $pipesgd (build first: bash scripts/build.sh)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run() {  # run NAME [extra flags...]: one run into $work/NAME; prints its throughput
  local name=$1; shift
  rm -rf "${work:?}/$name"
  "$pipesgd" train --algo "$algo" --model "$model" --workers 2 --net 10gbe --iters "$iters" --no-eval --quiet \
    --out "$work/$name" "$@" > "$work/$name.log" 2>&1 || { cat "$work/$name.log" >&2; exit 1; }
  /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["throughput_samples_per_s"])' \
    "$work/$name/summary.json"
}

echo "trace-overhead-bench: $algo on $model, 2 workers, --net 10gbe, $iters iterations, $runs pairs (traced first); load $(cut -d' ' -f1-3 /proc/loadavg)"
run warm-traced --trace "$work/warm.json" > /dev/null
run warm-plain > /dev/null
ratios=()
for ((r = 1; r <= runs; r++)); do
  traced=$(run traced --trace "$work/t.json")
  plain=$(run plain)
  ratio=$(PYTHONPATH="$ab_lib" /usr/bin/python3 -c "import sys, ab_stats; print(f'{ab_stats.pair_ratios([sys.argv[2]], [sys.argv[1]])[0] - 1:+.4f}')" "$traced" "$plain")
  ratios+=("$ratio")
  printf 'pair %d: traced %.0f samples/s, untraced %.0f samples/s, loss of throughput %s\n' "$r" "$traced" "$plain" "$ratio"
done
size=$(stat -c %s "$work/t.json")
/usr/bin/python3 "$ab_lib/ab_stats.py" --change "loss of throughput with --trace" -- "${ratios[@]}"
echo "trace file: $((size / 1024)) KiB for $iters iterations"
