#!/usr/bin/env bash
# D-Sync and Pipe-SGD in the C++ CLI against PyTorch DistributedDataParallel (gloo), 4 processes, on
# the mlp and the cnn (the target: the CLI's samples/s at least 2x DDP's). For each model
# in mlp, cnn and each method in dsync, pipe it runs
#
#   scripts/python-bench.sh --backends ddp,cli --model MODEL --method METHOD --rounds N --iters I
#
# (see that script: `mpirun -np 4 --oversubscribe` for both sides; DDP is bench/python/mlp_train.py on
# /usr/bin/python3, Debian's python3-torch; the CLI is BUILD_DIR/pipesgd train --transport mpi
# --model MODEL --algo METHOD; 1 warm-up round, then N rounds, the two runs alternated from round to
# round; one torch thread per process, batch 25 per rank, SGD lr 0.01, Fashion-MNIST, no emulated
# network), then prints a summary table: per (model, method) the per-round CLI/DDP samples/s ratios
# and their MEDIAN, the figure, against the target >= 2. Builds nothing.
#
#   bash scripts/ddp-bench.sh [--smoke] [--rounds N] [--models mlp,cnn] [--methods dsync,pipe]
#                             [BUILD_DIR=build]
#
# Before any run it checks that the Python models are the CLI's: the parameter count of each model in
# Python (mlp_train.py --count-parameters: sum of p.numel()), in total and per layer, must equal the
# CLI's (`pipesgd profile --model MODEL`: its layers' parameters); a difference is an error (exit 2).
#
# Timed iterations per run (after 50 untimed ones): mlp 800, cnn 1000. On the 2-core VM with 4 ranks
# a DDP iteration takes ~15-20 ms on mlp and ~14-15 ms on cnn, a CLI one ~5-8 ms on mlp and ~6-7 ms on
# cnn (cnn's convolutions cost more compute than mlp, but it has a tenth of the parameters to
# allreduce), plus ~2.5-3.5 s of start-up a run: runs of 6-25 s. Default 3 rounds: 2 models x 2
# methods x (1 + 3) rounds x 2 runs, about 7-8 minutes. Run it on an idle machine: other work skews
# the ratios.
# --rounds N: N counted rounds per (model, method) (default 3).
# --smoke: 1 round of 100 iterations each (plus the warm-up round), to check that the harness works
#   (under 1.5 minutes; its figures mean nothing).
# --models LIST, --methods LIST: comma-separated subsets (default mlp,cnn and dsync,pipe; a method
#   may carry options, e.g. pipe+int8).
# Exit status: 0 when every run succeeded (whether or not the targets are met: it measures, the reader
# judges), 1 if a run failed (the other pairs still run), 2 for bad arguments or missing
# prerequisites.
set -euo pipefail
ab_lib=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib  # ab_stats.py: the A/B statistics every benchmark prints

rounds=3
smoke=0
models=mlp,cnn
methods=dsync,pipe
target=2
declare -A iters=([mlp]=800 [cnn]=1000)
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$repo/build
die() { echo "ddp-bench: $*" >&2; exit 2; }
while (($#)); do
  case "$1" in
    --smoke) smoke=1 ;;
    --rounds)
      [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || die "--rounds needs a positive integer"
      rounds=$2
      shift ;;
    --models)
      [[ $# -ge 2 && $2 =~ ^(mlp|cnn)(,(mlp|cnn))*$ ]] || die "--models needs a comma-separated subset of mlp,cnn"
      models=$2
      shift ;;
    --methods)
      [[ $# -ge 2 && $2 =~ ^[a-z][a-z0-9+:._-]*(,[a-z][a-z0-9+:._-]*)*$ ]] || die "--methods needs a comma-separated list of method specs (e.g. dsync,pipe)"
      methods=$2
      shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option '$1' (expected --smoke, --rounds N, --models LIST, --methods LIST)" ;;
    *) build=$1 ;;
  esac
  shift
done
if ((smoke)); then
  rounds=1
  iters=([mlp]=100 [cnn]=100)
fi
IFS=, read -r -a model_list <<<"$models"
IFS=, read -r -a method_list <<<"$methods"

python=/usr/bin/python3
[[ -x $build/pipesgd ]] || die "$build/pipesgd not found (build it first: bash scripts/build.sh)"
"$python" -c 'import torch' 2>/dev/null || die "$python cannot import torch (Debian: python3-torch)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The Python models must be the CLI's: the same parameter count, in total and layer by layer.
for model in "${model_list[@]}"; do
  "$build/pipesgd" profile --model "$model" --out "$work/profile-$model.json" >"$work/profile.out" 2>&1 \
    || { cat "$work/profile.out" >&2; die "pipesgd profile --model $model failed"; }
  "$python" "$repo/bench/python/mlp_train.py" --model "$model" --count-parameters >"$work/count-$model.txt" \
    || die "mlp_train.py --model $model --count-parameters failed"
  "$python" - "$model" "$work/profile-$model.json" "$work/count-$model.txt" <<'EOF' || exit 2
import json, re, sys
model, profile, count = sys.argv[1:]
cli_layers = [layer["parameters"] for layer in json.load(open(profile))["layers"]]
lines = open(count).read().splitlines()
py_total = int(re.search(r"parameters=(\d+)", lines[0]).group(1))
py_layers = [int(re.search(r"parameters=(\d+)", line).group(1)) for line in lines[1:]]
same = sum(cli_layers) == py_total and cli_layers == py_layers
print(f"parameters, {model}: CLI {sum(cli_layers)} (layers {' '.join(map(str, cli_layers))}), "
      f"Python {py_total} (layers {' '.join(map(str, py_layers))}): {'equal' if same else 'DIFFERENT'}",
      file=sys.stderr)
sys.exit(0 if same else 1)
EOF
done

record=$work/record
: >"$record"
failed=()
start=$SECONDS
for model in "${model_list[@]}"; do
  for method in "${method_list[@]}"; do
    echo >&2
    echo "=== ddp-bench: model $model, method $method ($((SECONDS - start)) s so far)" >&2
    args=(--backends "ddp,cli" --model "$model" --method "$method" --iters "${iters[$model]}" --record "$record")
    ((smoke)) && args=(--smoke "${args[@]}")
    args+=(--rounds "$rounds" "$build")
    if ! bash "$repo/scripts/python-bench.sh" "${args[@]}"; then
      echo "ddp-bench: python-bench.sh ${args[*]} failed" >&2
      failed+=("$model/$method")
    fi
  done
done

echo
echo "== ddp-bench summary: C++ CLI / PyTorch DDP (gloo) samples/s, 4 processes (mpirun --oversubscribe"
echo "   on $(nproc --all) cores), batch 25 per rank; $rounds round(s), median of the per-round ratios;"
echo "   timed iterations per run:$(for m in "${model_list[@]}"; do printf " %s %s" "$m" "${iters[$m]}"; done)"
echo "   ($((SECONDS - start)) s; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg))"
((smoke == 0)) || echo "   SMOKE RUN: the figures below only show the harness works"
PYTHONPATH="$ab_lib" "$python" - "$record" "$target" "$models" "$methods" <<'EOF'
import statistics, sys
import ab_stats
record, target = sys.argv[1], float(sys.argv[2])
models, methods = sys.argv[3].split(","), sys.argv[4].split(",")
rows = ab_stats.read_records(record)
print(f"  {'model':<6} {'method':<12} {'DDP samples/s':>13} {'CLI samples/s':>13}  "
      f"{'CLI/DDP per round':<24} {'median':>7}  target >= {target:g}")
for model in models:
    for method in methods:
        runs = {b: {r["round"]: float(r["samples_per_s"]) for r in rows
                    if r["model"] == model and r["method"] == method and r["backend"] == b}
                for b in ("ddp", "cli")}
        both = sorted(set(runs["ddp"]) & set(runs["cli"]), key=int)
        if not both:
            print(f"  {model:<6} {method:<12} {'-':>13} {'-':>13}  {'(no complete round)':<24} {'-':>7}  FAILED")
            continue
        ratios = ab_stats.pair_ratios([runs["cli"][r] for r in both], [runs["ddp"][r] for r in both])
        median = statistics.median(ratios)
        print(f"  {model:<6} {method:<12} {statistics.median(runs['ddp'][r] for r in both):>13.0f} "
              f"{statistics.median(runs['cli'][r] for r in both):>13.0f}  "
              f"{' '.join(f'{x:.2f}' for x in ratios):<24} {median:>7.2f}  "
              f"{'met' if ab_stats.target_met(median, target, '>=') else 'NOT met'}")
EOF
if ((${#failed[@]})); then
  echo "ddp-bench: failed: ${failed[*]}" >&2
  exit 1
fi
