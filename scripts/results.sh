#!/usr/bin/env bash
# The results page, regenerated: runs the measurements of docs/results.md, keeps their figures in
# docs/results/*.json and writes the page and its plots (docs/results.md, docs/images/results-*.svg)
# with scripts/results_page.py. Builds nothing: give a build directory that has pipesgd and python/.
#
#   bash scripts/results.sh [--only SECTION[,SECTION...]] [--rounds N] [--auto-models LIST] [--auto-sync-models LIST]
#                           [--auto-net NET]... [--slowed-rounds N] [--quick] [BUILD_DIR=build]
#
# Sections, in the page's order (each one's command is printed on the page beside its figures):
#   ddp       PyTorch DDP (gloo) against pipesgd: the CLI and pipesgd.torch, 4 ranks, mlp and cnn,
#             dsync and pipe (scripts/python-bench.sh, alternated; the figure is the median of the
#             per-round ratios)                                             ~6 min
#   pipe      Pipe-SGD against D-Sync, 2 workers (one per core), emulated 10GbE, mlp and cnn
#             (pipesgd compare, the methods' order rotated from round to round)   ~2 min
#   accuracy  test accuracy after 3 epochs, mlp, 2 workers, plain SGD and momentum 0.9 (deterministic) ~1 min
#   simulate  the same methods at 2 to 256 simulated nodes (SimGrid), ResNet-50 on a device 10x a K80 ~10 s
#   horovod   Horovod's own test_torch.py against pipesgd.torch at 1, 2 and 3 ranks  ~1 min
#   auto      --algo auto against every method it could have chosen: alternated rounds of one compare
#             per model and network (2 workers, 1 epoch, 10gbe and bw=1Gbit,lat=200us) of auto:any and
#             auto (policy sync) at both ends (their figure: the mean of the two) and the candidates of
#             auto:any (18: 6 per codec) between, the order reversed every other round; and a run
#             whose link is slowed 4x mid-run (--inject-fault kind=slow), auto:any
#             against each candidate (~12 min; --slowed-rounds N alternated rounds of it, default 1;
#             0 keeps the stored slowed rows).
#             --auto-models picks the models (default mlp,cnn,resnet; resnet alone is ~30 min per
#             network and round, 22 runs of ~80 s; the stored rows of the other models are kept);
#             --auto-net NET (once
#             per network, 10gbe or bw=1Gbit,lat=200us; default both) picks the networks (the stored
#             rows of the others are kept); --auto-sync-models
#             LIST: of those, the models measured with auto (policy sync) and its 4 candidates only
#             (resnet: ~10 min per network and round)
#                                                                   ~19 min a round (mlp, cnn)
#   cluster   the local cluster (scripts/local-cluster.sh: hosts as network namespaces, real TCP, links
#             at 1 Gbit/s; root only): ring allreduce against MPI_Allreduce at 2 and 4 hosts, the
#             simulator against measured runs at 2 and 4 hosts (mlp, cnn; dsync, pipe), and partition
#             and host-kill runs repeated 20 times (tests/cluster)           ~15 min
# --only LIST: run these sections; the others keep their stored figures (docs/results/*.json), and
#   the page is written from all of them. With no section run (--only none) the page is only redrawn.
# --rounds N: alternated rounds of the timed sections (default 5; ddp 3; auto 3).
# --quick: one short round of everything into /tmp/pipesgd-results-quick/ (the figures mean nothing;
#   it checks the harness). docs/ is not touched.
# Run it on an idle machine: other work skews the timed figures (the machine has 2 cores).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
build=$repo/build
only=ddp,pipe,accuracy,simulate,horovod,auto,cluster
rounds=5
rounds_given=0
slowed_rounds=1
auto_models=mlp,cnn,resnet
auto_sync_models=
auto_networks=(10gbe bw=1Gbit,lat=200us)  # the networks auto is measured on (--auto-net picks)
auto_nets=()
quick=0
die() { echo "results: $*" >&2; exit 2; }
while [[ $# -gt 0 ]]; do
  case $1 in
    --only) [[ $# -ge 2 ]] || die "--only needs a list"; only=$2; shift 2 ;;
    --rounds) [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || die "--rounds needs a positive count"; rounds=$2; rounds_given=1; shift 2 ;;
    --auto-models) [[ $# -ge 2 && $2 =~ ^[a-z]+(,[a-z]+)*$ ]] || die "--auto-models needs a list of models"
      auto_models=$2; shift 2 ;;
    --auto-sync-models) [[ $# -ge 2 && $2 =~ ^[a-z]+(,[a-z]+)*$ ]] || die "--auto-sync-models needs a list of models"
      auto_sync_models=$2; shift 2 ;;
    --auto-net) [[ $# -ge 2 && " ${auto_networks[*]} " == *" $2 "* ]] ||
        die "--auto-net needs one of the measured networks:$(printf " '%s'" "${auto_networks[@]}")"
      auto_nets+=("$2"); shift 2 ;;
    --slowed-rounds) [[ $# -ge 2 && $2 =~ ^[0-9]+$ ]] || die "--slowed-rounds needs a count (0: keep the stored rows)"
      slowed_rounds=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option '$1' (expected --only LIST, --rounds N, --auto-models LIST, --auto-sync-models LIST, --auto-net NET, --slowed-rounds N, --quick)" ;;
    *) build=$(cd "$1" && pwd); shift ;;
  esac
done
[[ -x $build/pipesgd ]] || die "no $build/pipesgd: build first (bash scripts/build.sh)"
for section in ${only//,/ }; do
  case $section in ddp|pipe|accuracy|simulate|horovod|auto|cluster|none) ;; *) die "unknown section '$section'" ;; esac
done
for model in ${auto_sync_models//,/ }; do
  [[ ,$auto_models, == *,$model,* ]] || die "--auto-sync-models: $model is not in --auto-models ($auto_models)"
done
((${#auto_nets[@]})) || auto_nets=("${auto_networks[@]}")
selected() { [[ ",$only," == *",$1,"* ]]; }

export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
python=/usr/bin/python3
pipesgd=$build/pipesgd
work=$(mktemp -d /tmp/pipesgd-results.XXXXXX)
trap 'rm -rf "$work"' EXIT
if ((quick)); then
  quick_dir=${TMPDIR:-/tmp}/pipesgd-results-quick
  rm -rf "$quick_dir"; data=$quick_dir/data; page=$quick_dir/results.md; images=$quick_dir/images; rounds=1
else data=$repo/docs/results; page=$repo/docs/results.md; images=$repo/docs/images; fi
mkdir -p "$data" "$images"
machine="$(nproc --all) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'))"
today=$(date -u +%Y-%m-%d)
# The commit measured (with "+changes" when the tree differs from it, the figures this script writes
# aside: a run started after another one's figures were written measures the same code), stored with
# each section.
commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
[[ -z $(git -C "$repo" status --porcelain --untracked-files=no -- . ':!docs/results.md' ':!docs/results' \
  ':!docs/images/results-*' 2>/dev/null) ]] || commit+="+changes"
log() { echo "== results: $*" >&2; }

# Writes DATA/NAME.json from a JSON document on stdin, adding the date, the machine and the command.
store() {  # NAME COMMAND
  "$python" -c 'import json, sys
d = json.load(sys.stdin); d.update(date=sys.argv[2], machine=sys.argv[3], command=sys.argv[4], commit=sys.argv[5])
json.dump(d, open(sys.argv[1], "w"), indent=1, sort_keys=True)' "$data/$1.json" "$today" "$machine" "$2" "$commit"
}

if selected ddp; then
  ddp_rounds=$((quick ? 1 : (rounds > 3 ? 3 : rounds)))
  iters=$((quick ? 100 : 800))
  records=$work/ddp.records
  : >"$records"
  for model in mlp cnn; do
    for method in dsync pipe; do
      log "ddp: $model $method ($ddp_rounds rounds)"
      bash "$repo/scripts/python-bench.sh" --backends ddp,pipesgd,cli --model "$model" --method "$method" \
        --rounds "$ddp_rounds" --iters "$iters" --record "$records" "$build" >/dev/null
    done
  done
  "$python" - "$records" <<'EOF' | store ddp "bash scripts/python-bench.sh --backends ddp,pipesgd,cli --model MODEL --method METHOD --rounds $ddp_rounds --iters $iters"
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    f = dict(kv.split("=", 1) for kv in line.split())
    runs.setdefault((f["model"], f["method"], f["round"]), {})[f["backend"]] = float(f["samples_per_s"])
rows = {}
for (model, method, _), by in runs.items():
    r = rows.setdefault((model, method), {"model": model, "method": method, "ddp": [], "cli": [], "python": [],
                                          "cli_over_ddp": [], "python_over_ddp": []})
    r["ddp"].append(by["ddp"]); r["cli"].append(by["cli"]); r["python"].append(by["pipesgd"])
    r["cli_over_ddp"].append(by["cli"] / by["ddp"]); r["python_over_ddp"].append(by["pipesgd"] / by["ddp"])
out = []
for r in rows.values():
    out.append({k: (statistics.median(v) if isinstance(v, list) else v) for k, v in r.items()}
               | {"rounds": len(r["ddp"]), "cli_over_ddp_all": r["cli_over_ddp"], "python_over_ddp_all": r["python_over_ddp"]})
json.dump({"rows": out, "ranks": 4, "batch": 25}, sys.stdout)
EOF
fi

if selected pipe; then
  iters=$((quick ? 100 : 1000))
  : >"$work/pipe.records"
  orders=(dsync,pipe,pipe+int8 pipe,pipe+int8,dsync pipe+int8,dsync,pipe)
  for model in mlp cnn; do
    for ((round = 0; round < rounds; round++)); do
      algos=${orders[round % 3]}
      log "pipe: $model round $((round + 1))/$rounds ($algos)"
      rm -rf "$work/cmp"
      "$pipesgd" compare --model "$model" --algos "$algos" --workers 2 --net 10gbe --iters "$iters" --no-eval \
        --quiet --out "$work/cmp" >/dev/null
      "$python" -c 'import json, sys
for r in json.load(open(sys.argv[1])): print(sys.argv[2], sys.argv[3], r["method"], r["throughput_samples_per_s"], r["iteration_s"], r["compute_s"], r["breakdown"]["comm_s"], r["breakdown"]["wait_s"])' \
        "$work/cmp/compare.json" "$model" "$round" >>"$work/pipe.records"
    done
  done
  "$python" - "$work/pipe.records" <<'EOF' | store pipe "pipesgd compare --model MODEL --algos dsync,pipe,pipe+int8 --workers 2 --net 10gbe --iters $iters --no-eval"
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    model, rnd, method, tput, it, comp, comm, wait = line.split()
    runs.setdefault((model, rnd), {})[method] = dict(tput=float(tput), iteration_ms=float(it) * 1e3,
        compute_ms=float(comp) * 1e3, comm_ms=float(comm) * 1e3, wait_ms=float(wait) * 1e3)
rows = []
for model in dict.fromkeys(m for m, _ in runs):
    rounds = [by for (m, _), by in runs.items() if m == model]
    for method in ("dsync", "pipe", "pipe+int8"):
        ratios = [by[method]["tput"] / by["dsync"]["tput"] for by in rounds]
        med = lambda key: statistics.median(by[method][key] for by in rounds)
        rows.append(dict(model=model, method=method, samples_per_s=med("tput"), iteration_ms=med("iteration_ms"),
                         compute_ms=med("compute_ms"), comm_ms=med("comm_ms"), exposed_ms=med("wait_ms"),
                         over_dsync=statistics.median(ratios), over_dsync_all=ratios, rounds=len(rounds)))
json.dump({"rows": rows, "workers": 2, "net": "10gbe"}, sys.stdout)
EOF
fi

if selected accuracy; then
  epochs=$((quick ? 1 : 3))
  : >"$work/accuracy.records"
  for setting in "plain SGD|" "momentum 0.9, lr 0.05|--momentum 0.9 --lr 0.05"; do
    name=${setting%%|*} flags=${setting#*|}
    log "accuracy: $name"
    rm -rf "$work/acc"
    length=(--epochs "$epochs")
    ((quick)) && length=(--iters 60)
    # shellcheck disable=SC2086
    "$pipesgd" compare --algos dsync,pipe,pipe+int8,sapipe --workers 2 "${length[@]}" $flags \
      --quiet --out "$work/acc" >/dev/null 2>"$work/acc.err" ||
      { cat "$work/acc.err" >&2; exit 1; }
    for dir in "$work"/acc/*/; do
      "$python" -c 'import json, sys
s = json.load(open(sys.argv[1] + "summary.json"))
print(json.dumps(dict(setting=sys.argv[2], flags=sys.argv[3], method=s["method"],
      test_accuracy=[e.get("test_accuracy") for e in s.get("epochs", [])],
      final_test_accuracy=s.get("final_test_accuracy"))))' "$dir" "$name" "$flags" >>"$work/accuracy.records"
    done
  done
  "$python" -c 'import json, sys
json.dump({"rows": [json.loads(l) for l in open(sys.argv[1])], "epochs": int(sys.argv[2]), "workers": 2}, sys.stdout)' \
    "$work/accuracy.records" "$epochs" |
    store accuracy "pipesgd compare --algos dsync,pipe,pipe+int8,sapipe --workers 2 --epochs $epochs [--momentum 0.9 --lr 0.05]"
fi

if selected simulate; then
  workers=2,4,8,16,32,64,128,256
  ((quick)) && workers=2,8
  log "simulate: ResNet-50 at $workers nodes"
  rm -rf "$work/sim"
  cmd=(simulate --profile profiles/resnet50.json --compute-scale 0.1 --workers "$workers" --net 10gbe
       --algos dsync,dsync+optimal,pipe,pipe+int8,sapipe --collectives model)
  (cd "$repo" && "$pipesgd" "${cmd[@]}" --quiet --out "$work/sim" >/dev/null)
  "$python" -c 'import json, sys
rows = [dict(workers=r["workers"], method=r["method"], iteration_ms=r["iteration_s"] * 1e3,
             samples_per_s=r["throughput_samples_per_s"], scaling_efficiency=r["scaling_efficiency"],
             exposed_ms=r["exposed_s"] * 1e3, speedup=r["speedup"]) for r in json.load(open(sys.argv[1]))]
json.dump({"rows": rows}, sys.stdout)' "$work/sim/simulate.json" |
    store simulate "pipesgd ${cmd[*]}"
fi

if selected horovod; then
  log "horovod: Horovod's test_torch.py at 1, 2 and 3 ranks"
  bash "$repo/scripts/horovod-conformance.sh" --ranks 1,2,3 --build "$build" --out "$work/hc" >"$work/hc.txt" 2>&1 || true
  "$python" - "$work/hc" <<'EOF' | store horovod "bash scripts/horovod-conformance.sh --ranks 1,2,3"
import glob, json, os, re, sys
import xml.etree.ElementTree as ET
rows = []
for ranks in (1, 2, 3):
    tests = {}
    for xml in sorted(glob.glob(os.path.join(sys.argv[1], f"ranks-{ranks}", "rank-*.xml"))):
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = case.get("name")
            outcome = "skipped" if case.find("skipped") is not None else (
                "failed" if case.find("failure") is not None or case.find("error") is not None else "passed")
            # A test passes when it passes on every rank.
            prev = tests.get(name)
            tests[name] = outcome if prev in (None, outcome) else ("failed" if "failed" in (prev, outcome) else prev)
    count = lambda o: sum(1 for v in tests.values() if v == o)
    rows.append(dict(ranks=ranks, passed=count("passed"), failed=count("failed"), skipped=count("skipped"),
                     failing=sorted(n for n, v in tests.items() if v == "failed")))
json.dump({"rows": rows}, sys.stdout)
EOF
fi

if selected auto; then
  length=(--epochs 1)
  ((quick)) && length=(--iters 60)
  # list_candidates SPEC: the candidates auto (SPEC: auto or auto:POLICY) chooses from, as its
  # summary.json lists them, comma-separated (pipe's K is its default, 2).
  list_candidates() {
    rm -rf "$work/auto-list"
    "$pipesgd" train --algo "$1" --workers 2 --data synthetic --iters 20 --no-eval --quiet --out "$work/auto-list" \
      >/dev/null 2>&1 || die "auto: the listing run of $1 failed"
    "$python" -c 'import json, sys
labels = json.load(open(sys.argv[1]))["auto"]["candidates"]
assert all(" " not in l or l.endswith(" K=2") for l in labels), labels
print(",".join(l.split(" ")[0] for l in labels))' "$work/auto-list/summary.json"
  }
  candidates=$(list_candidates auto:any)
  candidate_count=$(tr ',' '\n' <<<"$candidates" | wc -l)
  sync_candidates=$(list_candidates auto)  # for --auto-sync-models
  sync_candidate_count=$(tr ',' '\n' <<<"$sync_candidates" | wc -l)
  : >"$work/auto.records"
  auto_rounds=$rounds
  ((rounds_given)) || auto_rounds=3
  ((quick)) && auto_rounds=1 slowed_rounds=1
  # in_round_order ROUND LIST: the comma list as it is in even rounds, reversed in odd ones (each
  # method runs early in one round and late in the next, against the machine's drift).
  in_round_order() {
    if (($1 % 2 == 0)); then echo "$2"; else tr ',' '\n' <<<"$2" | tac | paste -sd, -; fi
  }
  # One record per run of a compare (its DIR/*/summary.json): KIND steady counts samples per second
  # after the run's start-up, slowed over the whole run (samples / train_s) and, from metrics.jsonl,
  # the seconds of the iterations before and from the slowed iteration SLOWED_AT (what an oracle that
  # ran the best method of each side would take: the ceiling of any choosing).
  record_runs() {  # DIR KIND ROUND [SLOWED_AT]
    for dir in "$1"/*/; do
      "$python" -c 'import json, sys
s, kind, rnd = json.load(open(sys.argv[1] + "summary.json")), sys.argv[2], int(sys.argv[3])
a = s.get("auto")
over_run = s["iterations"] * s["workers"] * s["batch_per_worker"] / s["train_s"]
sides = {}
if kind == "slowed":
    at = int(sys.argv[4])
    its = [r for r in map(json.loads, open(sys.argv[1] + "metrics.jsonl")) if r.get("type") == "iteration"]
    assert len(its) == s["iterations"], (len(its), s["iterations"])
    sides = dict(slowed_at=at, iterations=s["iterations"],
                 before_s=sum(r["iteration_s"] for r in its if r["iteration"] < at),
                 after_s=sum(r["iteration_s"] for r in its if r["iteration"] >= at))
print(json.dumps(dict(kind=kind, round=rnd, position=int(sys.argv[1].rstrip("/").split("/")[-1].split("-")[0]),
    model=s["model"], net=s["network"], method=s["method"], **sides,
    samples_per_s=s["throughput_samples_per_s"] if kind == "steady" else over_run,
    test_accuracy=s["final_test_accuracy"],
    phases=[dict(start=p["start_iteration"], method=p["method"], kind=p["kind"]) for p in a["phases"]] if a else None,
    candidates=[c.split(" ")[0] for c in a["candidates"]] if a else None,
    startup_cost_fraction=a["startup_cost_fraction"] if a else None,
    profiling_cost_fraction=a["profiling_cost_fraction"] if a else None)))' "$dir" "$2" "$3" "${4:-0}" >>"$work/auto.records"
    done
  }
  for model in ${auto_models//,/ }; do
    for net in "${auto_nets[@]}"; do
      for ((round = 0; round < auto_rounds; round++)); do
        # auto runs at both ends of the round (the list reads the same reversed), its samples per
        # second the mean of the two: against the machine's drift through a round, as the rounds'
        # alternation is for the candidates.
        if [[ ,$auto_sync_models, == *,$model,* ]]; then
          algos="auto,$sync_candidates,auto"
          what="auto at both ends and its $sync_candidate_count candidates (policy sync only)"
        else
          algos="auto:any,auto,$candidates,auto,auto:any"
          what="auto:any and auto at both ends and the $candidate_count candidates"
        fi
        log "auto: $model, $net, round $((round + 1)) of $auto_rounds: $what, ${length[*]}"
        rm -rf "$work/auto-cmp"
        "$pipesgd" compare --model "$model" --algos "$(in_round_order $round "$algos")" --workers 2 \
          --net "$net" "${length[@]}" --quiet --out "$work/auto-cmp" >/dev/null 2>"$work/auto-cmp.err" ||
          { cat "$work/auto-cmp.err" >&2; exit 1; }
        record_runs "$work/auto-cmp" steady $round
      done
    done
  done
  # A link slowed 4x halfway: throughput over the whole run (start-up, the slow-down and any re-plan
  # included): samples / train_s of each run's summary.json.
  slow_model=mlp slow_net=bw=1Gbit,lat=200us
  iterations=$((quick ? 60 : 60000 / 50))
  slow="rank=1,iter=$((iterations / 2)),kind=slow,factor=4"
  for ((round = 0; round < slowed_rounds; round++)); do
    log "auto: $slow_model, $slow_net slowed 4x at iteration $((iterations / 2)), round $((round + 1)) of $slowed_rounds:" \
      "auto:any and the $candidate_count candidates"
    rm -rf "$work/auto-slow"
    "$pipesgd" compare --model "$slow_model" --algos "$(in_round_order $round "auto:any,$candidates")" --workers 2 \
      --net "$slow_net" --iters "$iterations" --inject-fault "$slow" --no-eval --quiet --out "$work/auto-slow" \
      >/dev/null 2>"$work/auto-slow.err" || { cat "$work/auto-slow.err" >&2; exit 1; }
    record_runs "$work/auto-slow" slowed $round $((iterations / 2))
  done
  commands=$(printf '%s\n' \
    "pipesgd compare --model MODEL --algos auto:any,auto,$candidates,auto,auto:any --workers 2 --net NET ${length[*]}" \
    ${auto_sync_models:+"pipesgd compare --model MODEL --algos auto,$sync_candidates,auto --workers 2 --net NET ${length[*]} (MODEL: $auto_sync_models)"} \
    "pipesgd compare --model $slow_model --algos auto:any,$candidates --workers 2 --net $slow_net --iters $iterations --inject-fault $slow --no-eval")
  # The stored steady rows of the models and networks not measured now are kept (--auto-models mlp
  # keeps cnn's, --auto-net 10gbe the other network's),
  # and the stored slowed rows with --slowed-rounds 0, each with the date, machine and commit it was
  # measured on (measured_on).
  kept=/dev/null
  if ((!quick)) && [[ -f $data/auto.json ]]; then kept=$data/auto.json; fi
  "$python" -c 'import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
measured = {(r["model"], r["net"]) for r in rows if r["kind"] == "steady"}
old = json.load(open(sys.argv[4])) if sys.argv[4] != "/dev/null" else {"rows": []}
keep_slowed = not any(r["kind"] == "slowed" for r in rows)
kept = [dict(r, measured_on=r.get("measured_on") or {k: old[k] for k in ("date", "machine", "commit") if k in old})
        for r in old["rows"]
        if (r["kind"] == "steady" and (r["model"], r["net"]) not in measured) or (r["kind"] == "slowed" and keep_slowed)]
json.dump({"rows": kept + rows, "workers": 2, "slowed": sys.argv[2],
           "rounds": int(sys.argv[3])}, sys.stdout)' \
    "$work/auto.records" "$slow" "$auto_rounds" "$kept" | store auto "$commands"
fi

if selected cluster && [[ $(id -u) -ne 0 ]]; then
  log "cluster: skipped: the local cluster needs root (its stored figures stay)"
elif selected cluster; then
  cluster=$repo/scripts/local-cluster.sh
  repeats=$((quick ? 1 : 3)) fault_repeats=$((quick ? 2 : 20)) iters=$((quick ? 60 : 300))
  "$cluster" up --hosts 4 --rate 1gbit >/dev/null
  for hosts in 2 4; do
    log "cluster: allreduce at $hosts hosts"
    (eval "$("$cluster" env)"
     mpirun -np "$hosts" -H "$(seq -s, -f 'h%g:1' 1 "$hosts")" "$pipesgd" bench allreduce --transport mpi --algos ring \
       --codecs none --sizes 1M,4M,16M --repeats $((quick ? 2 : 20)) --quiet --out "$work/bench-$hosts" >/dev/null)
    log "cluster: simulator against $hosts hosts ($repeats runs per model)"
    (cd "$repo" && VALIDATE_OUT=$work/sim-$hosts bash scripts/validate-simulator.sh --cluster --workers "$hosts" \
       --models mlp,cnn --algos dsync,pipe --net bw=1Gbit,lat=40us --iters "$iters" --repeats "$repeats" "$build" \
       >"$work/sim-$hosts.txt")
  done
  log "cluster: partition and host kill, $fault_repeats runs each"
  mkdir -p "$work/faults-tmp"
  TMPDIR=$work/faults-tmp KEEP_TMP=1 FAULT_REPEATS=$fault_repeats CLUSTER_TESTS=faults \
    bash "$repo/tests/cluster/run_cluster_tests.sh" "$pipesgd" >"$work/faults.txt" 2>&1 || true
  "$cluster" down >/dev/null
  commands=$(printf '%s\n' \
    "scripts/local-cluster.sh up --hosts 4 --rate 1gbit; eval \"\$(scripts/local-cluster.sh env)\"" \
    "mpirun -np HOSTS -H h1:1,...,hHOSTS pipesgd bench allreduce --transport mpi --algos ring --codecs none --sizes 1M,4M,16M --repeats 20" \
    "bash scripts/validate-simulator.sh --cluster --workers HOSTS --models mlp,cnn --algos dsync,pipe --net bw=1Gbit,lat=40us --iters $iters --repeats $repeats" \
    "FAULT_REPEATS=$fault_repeats CLUSTER_TESTS=faults tests/cluster/run_cluster_tests.sh build/pipesgd")
  "$python" - "$work" <<'EOF' | store cluster "$commands"
import glob, json, os, re, sys
work = sys.argv[1]
allreduce = []
for hosts in (2, 4):
    rows = json.load(open(f"{work}/bench-{hosts}/allreduce.json"))
    mpi = {r["bytes"]: r for r in rows if r["algorithm"] == "MPI_Allreduce"}
    for r in rows:
        if r["algorithm"] == "ring" and r["codec"] == "none":
            allreduce.append(dict(hosts=hosts, bytes=r["bytes"], ring_ms=r["time_s"] * 1e3,
                                  mpi_ms=mpi[r["bytes"]]["time_s"] * 1e3, busbw_gbit=r["busbw_bytes_per_s"] * 8e-9,
                                  over_mpi=mpi[r["bytes"]]["time_s"] / r["time_s"]))
simulator = []
for hosts in (2, 4):
    d = f"{work}/sim-{hosts}"
    for model in ("mlp", "cnn"):
        runs = [json.load(open(p)) for p in sorted(glob.glob(f"{d}/{model}-measured-*/compare.json"))]
        sim = {r["method"]: r for r in json.load(open(f"{d}/{model}-simulated/simulate.json")) if r["workers"] == hosts}
        for method in ("dsync", "pipe"):
            measured = sorted(row["iteration_s"] for run in runs for row in run if row["method"] == method)
            m = measured[len(measured) // 2]
            simulator.append(dict(hosts=hosts, model=model, method=method, measured_ms=m * 1e3,
                                  measured_all_ms=[x * 1e3 for x in measured],
                                  simulated_ms=sim[method]["iteration_s"] * 1e3, error=sim[method]["iteration_s"] / m - 1))
text = open(f"{work}/faults.txt").read()
kept = glob.glob(f"{work}/faults-tmp/pipesgd-cluster-tests.*/runs")
faults = []
for fault in ("partition", "host-kill"):
    names = sorted({m.group(1) for m in re.finditer(rf"^(?:ok|FAIL) ({fault}(?:-\d+)?)/", text, re.M)})
    passed = [n for n in names if not re.search(rf"^FAIL {re.escape(n)}/", text, re.M)]
    seconds = []
    for n in names:
        for runs in kept:
            try:
                seconds.append(float(open(f"{runs}/{n}/end").read()) - float(open(f"{runs}/{n}/fault").read()))
            except OSError:
                pass
    faults.append(dict(fault=fault, runs=len(names), passed=len(passed), failed=[n for n in names if n not in passed],
                       seconds_min=min(seconds) if seconds else None, seconds_max=max(seconds) if seconds else None))
json.dump({"allreduce": allreduce, "simulator": simulator, "faults": faults, "rate": "1 Gbit/s", "comm_timeout_s": 4},
          sys.stdout)
EOF
fi

"$python" "$repo/scripts/results_page.py" --data "$data" --images "$images" --out "$page"
log "wrote $page"
