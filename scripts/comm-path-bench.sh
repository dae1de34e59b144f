#!/usr/bin/env bash
# How close Pipe-SGD comes to its limit here (git show d620cdd:docs/results.md, "Close to the limit"): per model,
# 2 workers (one per core), emulated 10GbE, rounds of
#   compare  pipesgd compare --algos <rotated: nocomm,dsync,pipe,pipe+int8> --workers 2 --net 10gbe
#            --model M --iters ITERS --no-eval --out ...
#   bench    pipesgd bench allreduce --workers 2 --net 10gbe --algos ring --codecs none,int8
#            --segment-bytes <pipe's> --sizes <the model's gradient bytes> --out ...
# and per round, from compare.json and allreduce.json:
#   pipe / dsync        Pipe-SGD's throughput over D-Sync's in the same compare (target >= 1.75 on mlp)
#   pipe / limit        Pipe-SGD's iteration over max(compute alone, allreduce alone): compute alone =
#                       nocomm's iteration in the same compare (the same workers, no communication),
#                       allreduce alone = the bench's ring time for the gradient, segmented as
#                       pipe's allreduce was (its summary.json; target <= 1.10)
#   int8 / limit        the same for pipe+int8 (its allreduce alone: the int8 row)
#   int8 / pipe         pipe+int8's throughput over pipe's (>= 1 where communication dominates)
#   stretch             each method's compute over nocomm's (compare's stretch column)
#   CPU ns/B            each method's gradient allreduce CPU time per allreduced byte
# Medians over the rounds (and the min and max). The order of the compared methods rotates from round
# to round so that a drift of the machine's speed hits each alike. Needs nothing else running.
#
#   bash scripts/comm-path-bench.sh [--rounds N] [--iters N] [--models mlp,cnn,resnet] [--smoke] [BUILD_DIR=build]
set -euo pipefail

rounds=5
iters=600
models=mlp,cnn,resnet
build=build
while [[ $# -gt 0 ]]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --smoke) rounds=1; iters=40; shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    -*) echo "comm-path-bench: unknown option $1" >&2; exit 2 ;;
    *) build=$1; shift ;;
  esac
done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "comm-path-bench: --rounds needs a positive integer" >&2; exit 2; }
[[ $iters =~ ^[1-9][0-9]*$ ]] || { echo "comm-path-bench: --iters needs a positive integer" >&2; exit 2; }
bin=$build/pipesgd
[[ -x $bin ]] || { echo "comm-path-bench: $bin not found (build first: bash scripts/build.sh)" >&2; exit 2; }
python=/usr/bin/python3
out=${COMM_PATH_BENCH_OUT:-$(mktemp -d)}
mkdir -p "$out"
echo "comm-path-bench: $rounds rounds x $iters iterations per model ($models); runs in $out" >&2

orders=("nocomm,dsync,pipe,pipe+int8" "dsync,pipe,pipe+int8,nocomm" "pipe,pipe+int8,nocomm,dsync" "pipe+int8,nocomm,dsync,pipe")
IFS=, read -ra model_list <<< "$models"
for model in "${model_list[@]}"; do
  for ((r = 1; r <= rounds; r++)); do
    dir=$out/$model/round$r
    mkdir -p "$dir"
    order=${orders[$(((r - 1) % 4))]}
    echo "  $model round $r of $rounds: compare $order" >&2
    "$bin" compare --algos "$order" --workers 2 --net 10gbe --model "$model" --iters "$iters" --no-eval --quiet \
      --out "$dir/compare" > "$dir/compare.txt"
    # The gradient's bytes, and the segments pipe's allreduce used (its summary: "640 KiB",
    # "unsegmented", "N B"), as --segment-bytes.
    read -r bytes segments < <("$python" -c 'import glob, json, os, sys
runs = {r["method"]: r for r in json.load(open(os.path.join(sys.argv[1], "compare.json")))}
pipe = json.load(open(glob.glob(os.path.join(sys.argv[1], "*-pipe", "summary.json"))[0]))
text = pipe["allreduce_segments"]
flag = "none" if text == "unsegmented" else text.replace(" KiB", "K").replace(" B", "")
print(int(round(runs["dsync"]["breakdown"]["comm_bytes"] / 4)) * 4, flag)' "$dir/compare")
    "$bin" bench allreduce --workers 2 --net 10gbe --algos ring --codecs none,int8 --segment-bytes "$segments" \
      --sizes "$bytes" --repeats 10 --quiet --out "$dir/bench" > "$dir/bench.txt"
  done
done

"$python" - "$out" "$rounds" "$models" <<'EOF'
import json, statistics, sys
out, rounds, models = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")

def spread(values):
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"

methods = ["nocomm", "dsync", "pipe", "pipe+int8"]
for model in models:
    figures = {}
    def add(name, value):
        figures.setdefault(name, []).append(value)
    for r in range(1, rounds + 1):
        base = f"{out}/{model}/round{r}"
        runs = {x["method"]: x for x in json.load(open(f"{base}/compare/compare.json"))}
        bench = {x["codec"]: x for x in json.load(open(f"{base}/bench/allreduce.json"))
                 if x["algorithm"] == "ring"}
        alone = runs["nocomm"]["iteration_s"]
        add("compute alone ms", alone * 1e3)
        add("allreduce alone ms (none)", bench["none"]["time_s"] * 1e3)
        add("allreduce alone ms (int8)", bench["int8"]["time_s"] * 1e3)
        for m in methods:
            add(f"{m} iteration ms", runs[m]["iteration_s"] * 1e3)
        add("pipe / dsync throughput", runs["pipe"]["throughput_samples_per_s"] / runs["dsync"]["throughput_samples_per_s"])
        add("pipe+int8 / dsync throughput", runs["pipe+int8"]["throughput_samples_per_s"] / runs["dsync"]["throughput_samples_per_s"])
        add("pipe / max(compute, allreduce)", runs["pipe"]["iteration_s"] / max(alone, bench["none"]["time_s"]))
        add("pipe+int8 / max(compute, allreduce int8)", runs["pipe+int8"]["iteration_s"] / max(alone, bench["int8"]["time_s"]))
        add("pipe+int8 / pipe throughput", runs["pipe+int8"]["throughput_samples_per_s"] / runs["pipe"]["throughput_samples_per_s"])
        for m in methods[1:]:
            add(f"{m} compute stretch", runs[m]["compute_stretch"])
            add(f"{m} comm CPU ns/B", runs[m]["comm_cpu_ns_per_byte"])
        add("bench CPU ns/B (none)", bench["none"]["cpu_ns_per_byte"])
        add("bench CPU ns/B (int8)", bench["int8"]["cpu_ns_per_byte"])
    print(f"\n{model}, 2 workers, 10gbe: median (min-max) of {rounds} rounds")
    width = max(len(k) for k in figures)
    for name, values in figures.items():
        print(f"  {name:<{width}}  {spread(values)}")
EOF
