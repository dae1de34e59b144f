#!/usr/bin/env bash
# MG-WFBP paper Sec. V.C (Fig. 9) with `pipesgd simulate`: WFBP, SyncEASGD and MG-WFBP (and our
# optimal plan, dsync+optimal) on GoogLeNet and ResNet-50 from 4 to 64 simulated K80 nodes on 10GbE,
# with the paper's network model: the ring of Table II (unsegmented, --collectives model, the ideal
# network model) and its measured startup 2(N-1)·alpha = 90.52 / 271.56 / 633.64 us for 2 / 4 / 8
# nodes, i.e. alpha = 45.26 us per message. Two bandwidths: the nominal 10 Gbit/s, and 3 Gbit/s, the
# effective bandwidth at which SyncEASGD on ResNet-50 has the ~55% scaling efficiency at 64 nodes
# the paper reports (see git show d620cdd:docs/results.md for the derivation). Profiles: profiles/googlenet-aux.json
# (Caffe's GoogLeNet with its auxiliary heads, ~13 M parameters as the paper's) and
# profiles/resnet50.json, both on one K80 GPU from their FLOPs (profiles/README.md).
#
#   bash scripts/mgwfbp-figure.sh [BUILD_DIR=build]
#
# Prints, per model and bandwidth, each method's scaling efficiency per world size and the ratios
# MG-WFBP/WFBP, MG-WFBP/SyncEASGD and optimal/MG-WFBP, beside the paper's values at 64 nodes
# (GoogLeNet 1.78x and 1.35x, ResNet-50 1.75x and 1.45x; ResNet-50 WFBP and SyncEASGD ~55%).
set -euo pipefail
BUILD=${1:-build}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$BUILD/pipesgd
[ -x "$BIN" ] || { echo "mgwfbp-figure: $BIN not found (bash scripts/build.sh first)" >&2; exit 2; }
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
for model in googlenet-aux resnet50; do
  for bw in 10Gbit 3Gbit; do
    "$BIN" simulate --profile "$ROOT/profiles/$model.json" --workers 4,8,16,32,64 --net "bw=$bw,lat=45.26us" \
      --network-model ideal --collectives model --segment-bytes none --iters 10 --quiet \
      --algos wfbp,synceasgd,mgwfbp,dsync+optimal --out "$OUT/$model-$bw" >/dev/null
  done
done
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
paper = {"googlenet-aux": (1.78, 1.35, None), "resnet50": (1.75, 1.45, 0.55)}
for model in ("googlenet-aux", "resnet50"):
    for bw in ("10Gbit", "3Gbit"):
        records = json.load(open(f"{out}/{model}-{bw}/simulate.json"))
        by = {(r["method"], r["workers"]): r for r in records}
        print(f"\n{model}, {bw}/s, alpha 45.26 us (ideal model, Table II ring)")
        print(f"{'nodes':>5} {'SE wfbp':>8} {'SE synceasgd':>12} {'SE mgwfbp':>9} {'SE optimal':>10}"
              f" {'MG/WFBP':>8} {'MG/SyncEASGD':>12} {'optimal/MG':>10}")
        for n in (4, 8, 16, 32, 64):
            se = [by[(m, n)]["scaling_efficiency"] for m in ("wfbp", "synceasgd", "mgwfbp", "dsync+optimal")]
            t = {m: by[(m, n)]["throughput_samples_per_s"] for m in ("wfbp", "synceasgd", "mgwfbp", "dsync+optimal")}
            print(f"{n:>5} {se[0]:>8.3f} {se[1]:>12.3f} {se[2]:>9.3f} {se[3]:>10.3f}"
                  f" {t['mgwfbp'] / t['wfbp']:>7.2f}x {t['mgwfbp'] / t['synceasgd']:>11.2f}x"
                  f" {t['dsync+optimal'] / t['mgwfbp']:>9.3f}x")
        wf, se_, se_sync = paper[model]
        print(f"paper at 64 nodes: MG/WFBP {wf}x, MG/SyncEASGD {se_}x" +
              (f", WFBP and SyncEASGD scaling efficiency ~{se_sync:.0%}" if se_sync else ""))
PY
