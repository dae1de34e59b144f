#!/usr/bin/env bash
# The general update path against the fused one (git show d620cdd:docs/results.md, "The user's optimizer applies the
# update"): bench/python/mlp_train.py through pipesgd.torch with plain SGD, once with the default
# general path (the method hands its gradient over as p.grad, torch.optim.SGD's step applies it) and
# once with fused_update=True (the method's own fused SGD), 2 ranks (one per core), alternated.
#
#   bash scripts/update-path-bench.sh [--rounds N] [--iters N] [--batch B] [--method SPEC] [--model mlp|cnn]
#                                     [BUILD_DIR=build]
#
# Each round runs both (the order alternates from round to round); the figure is the median over
# rounds of general / fused samples/s (mlp_train.py's own clock, start-up excluded). Target >= 0.95.
# Exit status 0 when every run succeeded (it measures; the reader judges), 1 if a run failed, 2 for
# bad arguments.
set -euo pipefail
ab_lib=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib  # ab_stats.py: the A/B statistics every benchmark prints
rounds=7
iters=1500
method=
model=mlp
batch=25
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$repo/build
while (($#)); do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --method) method=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    -*) echo "update-path-bench: unknown option $1" >&2; exit 2 ;;
    *) build=$(cd "$1" && pwd); shift ;;
  esac
done
[[ -f $build/python/pipesgd/torch/__init__.py ]] || { echo "update-path-bench: no pipesgd.torch in $build/python (build first)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 PYTHONPATH=$build/python
method_args=()
[[ -n $method ]] && method_args=(--method "$method")

run() {  # run general|fused -> samples/s
  local extra=()
  [[ $1 == fused ]] && extra=(--fused-update)
  local line
  line=$(timeout 600 mpirun -np 2 /usr/bin/python3 "$repo/bench/python/mlp_train.py" --backend pipesgd \
         --model "$model" --batch "$batch" --iters "$iters" "${method_args[@]}" "${extra[@]}" | grep '^samples_per_s=') || return 1
  line=${line#samples_per_s=}
  echo "${line%% *}"
}

ratios=()
for ((r = 0; r < rounds; ++r)); do
  if ((r % 2 == 0)); then general=$(run general) || exit 1; fused=$(run fused) || exit 1
  else fused=$(run fused) || exit 1; general=$(run general) || exit 1; fi
  ratio=$(PYTHONPATH="$ab_lib" /usr/bin/python3 -c "import ab_stats; print(f'{ab_stats.pair_ratios([$general], [$fused])[0]:.3f}')")
  ratios+=("$ratio")
  echo "round $((r + 1)): general ${general} samples/s, fused ${fused} samples/s, general/fused ${ratio}"
done
/usr/bin/python3 "$ab_lib/ab_stats.py" "general/fused samples/s" -- "${ratios[@]}"
