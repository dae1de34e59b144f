#!/usr/bin/env bash
# The Python front end's speed (docs/results.md, "Against PyTorch DDP"; scripts/results.sh runs it): one PyTorch training script,
# bench/python/mlp_train.py (the MLP, or with --model cnn the LeNet CNN), with 4 ranks through
# pipesgd.torch against the same script on PyTorch DistributedDataParallel (gloo), and against the C++
# CLI on the same model. Builds nothing: give the build directory that holds pipesgd (the CLI) and
# python/ (the pipesgd.torch package). scripts/ddp-bench.sh runs this for mlp and cnn, dsync and pipe.
#
#   bash scripts/python-bench.sh [--smoke] [--rounds N] [--iters N] [--method SPEC] [--model mlp|cnn]
#                                [--backends ddp,pipesgd,cli] [--record FILE] [BUILD_DIR=build]
#
# Three runs per round, each `mpirun -np 4 --oversubscribe` (the same launch for all three; as root
# with OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1):
#   ddp      /usr/bin/python3 bench/python/mlp_train.py --backend ddp --model MODEL
#   pipesgd  PYTHONPATH=BUILD_DIR/python /usr/bin/python3 bench/python/mlp_train.py --backend pipesgd
#            --model MODEL [--method SPEC]
#   cli      BUILD_DIR/pipesgd train --transport mpi --model MODEL --algo SPEC|dsync --net none
#            --data fashion-mnist --batch 25 --lr 0.01 --iters WARMUP+ITERS --no-eval --quiet
# The same model (--model mlp, the default: the 784-500-500-10 MLP with ReLU; --model cnn: the CLI's
# LeNet, 2 conv + 3 linear layers, inputs [B, 1, 28, 28]; both default init, cross-entropy), plain
# SGD lr 0.01, batch 25 per rank, Fashion-MNIST training images in memory as floats in [0, 1], one
# torch thread per rank (OMP_NUM_THREADS=1 too), no evaluation, no emulated network (real MPI / gloo
# over loopback and shared memory). Figures, all measured inside the processes so that start-up is excluded:
#   python: samples/s over ITERS timed iterations after 50 untimed ones, the wall clock between two
#           barriers on rank 0 (mlp_train.py's last line);
#   cli:    throughput_samples_per_s of its summary.json: global batch / the mean over workers and
#           iterations [10, N) of the time from one iteration's start to the next's.
# pipesgd.torch is given no method by default (its default, Horovod's synchronous averaging), and the
# CLI runs dsync; --method SPEC passes SPEC to both (method=SPEC and --algo SPEC).
#
# One warm-up round (not counted), then N rounds (default 5); the order of the three runs rotates
# from round to round (ddp pipesgd cli, pipesgd cli ddp, cli ddp pipesgd, ...) so a drift of the
# machine's speed hits each the same. Ratios are taken within a round; min, median and max of the
# per-round ratios are printed and the MEDIAN is the figure:
#   pipesgd.torch / DDP samples/s   target >= 1.8
#   pipesgd.torch / CLI samples/s   target >= 0.9
#
# --backends LIST: run only these (comma-separated subset of ddp,pipesgd,cli; ratios whose two sides
#   both ran are printed, and every run's samples/s median). By default all three run, and a missing
#   pipesgd.torch package is an error (exit 2), never skipped.
# --iters N: timed iterations per run (default 1500, either model: measured on 2 cores, DDP takes ~15
#   ms an iteration on cnn and ~15-20 ms on mlp, the CLI ~6-7 ms on cnn and ~5-8 ms on mlp).
# --model mlp|cnn: the model of every run (default mlp).
# --record FILE: also append one line per counted run (not the warm-up round) to FILE:
#   "model=MODEL method=SPEC|- backend=B round=R wall_s=... samples_per_s=... iteration_ms=..."
#   (scripts/ddp-bench.sh reads these).
# --smoke: 1 round of 200 iterations, to check that the harness works (its figures mean nothing).
# Exit status: 0 when every run succeeded (whether or not the targets are met: it measures, the reader
# judges), 1 if a run failed, 2 for bad arguments or missing prerequisites.
set -euo pipefail
ab_lib=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib  # ab_stats.py: the A/B statistics every benchmark prints

rounds=5
iters=1500  # ~5-8 ms an iteration for the CLI, ~15-20 ms for DDP on 2 cores (mlp or cnn): 7-30 s a run
warmup=50
model=mlp
record=
run_timeout=600  # seconds a run may take before it counts as hung
method=
backends=ddp,pipesgd,cli
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$repo/build
smoke=0
die() { echo "python-bench: $*" >&2; exit 2; }
while (($#)); do
  case "$1" in
    --smoke) smoke=1 rounds=1 iters=200 ;;
    --rounds|--iters)
      [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || die "$1 needs a positive integer"
      if [[ $1 == --rounds ]]; then rounds=$2; else iters=$2; fi
      shift ;;
    --method)
      [[ $# -ge 2 && -n $2 ]] || die "--method needs a method spec (e.g. pipe+int8)"
      method=$2
      shift ;;
    --model)
      [[ $# -ge 2 && $2 =~ ^(mlp|cnn)$ ]] || die "--model needs mlp or cnn"
      model=$2
      shift ;;
    --record)
      [[ $# -ge 2 && -n $2 ]] || die "--record needs a file"
      record=$2
      shift ;;
    --backends)
      [[ $# -ge 2 && $2 =~ ^(ddp|pipesgd|cli)(,(ddp|pipesgd|cli))*$ ]] || die "--backends needs a comma-separated subset of ddp,pipesgd,cli"
      backends=$2
      shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option '$1' (expected --smoke, --rounds N, --iters N, --method SPEC, --model mlp|cnn, --backends LIST, --record FILE)" ;;
    *) build=$1 ;;
  esac
  shift
done
has() { [[ ,$backends, == *,$1,* ]]; }
selected=()
for b in ddp pipesgd cli; do has "$b" && selected+=("$b"); done

# Prerequisites (checked, never built or installed here).
python=/usr/bin/python3
command -v mpirun >/dev/null || die "mpirun not found (Debian: openmpi-bin)"
"$python" -c 'import torch, numpy' 2>/dev/null || die "$python cannot import torch and numpy (Debian: python3-torch)"
[[ -r /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]] || die "Fashion-MNIST not found in /usr/share/datasets/fashion-mnist (Debian: dataset-fashion-mnist)"
if has cli; then
  [[ -x $build/pipesgd ]] || die "$build/pipesgd not found (build it first: bash scripts/build.sh)"
fi
if has pipesgd; then
  [[ -d $build/python ]] || die "$build/python not found: the pipesgd.torch package is not built (build it first, or leave pipesgd out with --backends ddp,cli)"
  err=$(PYTHONPATH=$build/python "$python" -c 'import importlib.util, sys
sys.exit(0 if importlib.util.find_spec("pipesgd.torch") else 1)' 2>&1) \
    || die "pipesgd.torch is not importable with PYTHONPATH=$build/python${err:+: $err} (build it first, or leave pipesgd out with --backends ddp,cli)"
fi

export OMP_NUM_THREADS=1
if [[ $(id -u) -eq 0 ]]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
launch=(mpirun -np 4 --oversubscribe)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

free_port() {
  "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# run BACKEND ROUND: one run; appends "round=ROUND wall_s=SECONDS samples_per_s=... ..." to
# $work/BACKEND (ROUND 0 is the warm-up round).
run() {
  local backend=$1 round=$2 start end figures
  local -a cmd
  case $backend in
    ddp) cmd=(env MASTER_PORT="$(free_port)" "${launch[@]}" "$python" "$repo/bench/python/mlp_train.py" --backend ddp
              --model "$model" --iters "$iters" --warmup "$warmup") ;;
    pipesgd) cmd=(env PYTHONPATH="$build/python" "${launch[@]}" "$python" "$repo/bench/python/mlp_train.py"
                  --backend pipesgd --model "$model" --iters "$iters" --warmup "$warmup" ${method:+--method "$method"}) ;;
    cli) rm -rf "$work/cli-out"
         cmd=("${launch[@]}" "$build/pipesgd" train --transport mpi --model "$model" --algo "${method:-dsync}"
              --net none --data fashion-mnist --batch 25 --lr 0.01 --iters $((warmup + iters)) --no-eval
              --quiet --out "$work/cli-out") ;;
  esac
  start=$EPOCHREALTIME
  # A run that hangs (a rank stuck at exit, a lost peer) fails after $run_timeout s: SIGTERM, which
  # mpirun forwards to the ranks (not SIGINT: see docs/user-guide.md), then SIGKILL 10 s later.
  timeout -k 10 "$run_timeout" "${cmd[@]}" >"$work/stdout" 2>"$work/stderr" || {
    local status=$?
    echo "python-bench: failed (exit status $status$( ((status == 124)) && echo ", timed out after $run_timeout s")): ${cmd[*]}" >&2
    cat "$work/stdout" "$work/stderr" >&2; exit 1; }
  end=$EPOCHREALTIME
  if [[ $backend == cli ]]; then
    figures=$("$python" -c 'import json, sys; s = json.load(open(sys.argv[1]))
print("samples_per_s=%.1f iteration_ms=%.4f measured=%d" % (s["throughput_samples_per_s"], s["iteration_s"] * 1e3, s["measured_iterations"]))' "$work/cli-out/summary.json")
  else
    figures=$(grep '^samples_per_s=' "$work/stdout" | tail -n 1)
    [[ -n $figures ]] || { echo "python-bench: no samples_per_s line from: ${cmd[*]}" >&2; cat "$work/stdout" "$work/stderr" >&2; exit 1; }
  fi
  local line
  line="round=$round wall_s=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.2f", b - a }') $figures"
  echo "$line" >>"$work/$backend"
  if [[ -n $record ]] && ((round > 0)); then
    local f keep=()
    for f in $line; do [[ $f =~ ^(round|wall_s|samples_per_s|iteration_ms)= ]] && keep+=("$f"); done
    echo "model=$model method=${method:--} backend=$backend ${keep[*]}" >>"$record"
  fi
  printf '  %-8s %s\n' "$backend" "$line" >&2
}

echo "== python-bench: ${selected[*]}, 4 ranks, $model batch 25, $iters timed iterations (+$warmup), method ${method:-default (CLI: dsync)}; 1 warm-up round + $rounds" >&2
echo "load average at the start: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine skews these figures)" >&2
n=${#selected[@]}
for ((round = 0; round <= rounds; ++round)); do
  echo "round $round$( ((round == 0)) && echo ' (warm-up, not counted)')" >&2
  for ((k = 0; k < n; ++k)); do
    run "${selected[(round + k) % n]}" "$round"
  done
done

echo
((smoke == 0)) || echo "SMOKE RUN ($rounds round, $iters iterations): the figures below only show the harness works"
case $model in
  mlp) model_text="MLP 784-500-500-10" ;;
  cnn) model_text="CNN (the CLI's LeNet: conv 6, conv 16, 120-84-10)" ;;
esac
echo "4 ranks (mpirun --oversubscribe on $(nproc --all) cores), $model_text, batch 25 per rank, SGD lr 0.01,"
echo "$iters timed iterations;$(has pipesgd && echo " pipesgd.torch method: ${method:-default};")$(has cli && echo " CLI --algo ${method:-dsync};") load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
PYTHONPATH="$ab_lib" "$python" - "$work" "$method" "${selected[@]}" <<'EOF'
import statistics, sys
import ab_stats
work, method, backends = sys.argv[1], sys.argv[2], sys.argv[3:]
runs = {}
for b in backends:
    rows = ab_stats.read_records(f"{work}/{b}")
    runs[b] = [r for r in rows if r["round"] != "0"]  # round 0: the warm-up round
names = {"ddp": "DDP (gloo)", "pipesgd": "pipesgd.torch", "cli": "C++ CLI"}
for b in backends:
    s = [float(r["samples_per_s"]) for r in runs[b]]
    ms = [float(r["iteration_ms"]) for r in runs[b]]
    print(f"  {names[b]:<14} samples/s per round " + " ".join(f"{v:.0f}" for v in s)
          + f"   median {statistics.median(s):.0f} (iteration {statistics.median(ms):.3f} ms)")
for num, den, target in (("pipesgd", "ddp", 1.8), ("pipesgd", "cli", 0.9), ("cli", "ddp", None)):
    if num not in runs or den not in runs:
        continue
    ratios = ab_stats.pair_ratios([a["samples_per_s"] for a in runs[num]], [b["samples_per_s"] for b in runs[den]])
    print(ab_stats.summary(f"{names[num]} / {names[den]} samples/s", ratios, target, ">=", per="per-round"))
EOF
