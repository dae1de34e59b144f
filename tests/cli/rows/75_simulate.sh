# shellcheck shell=bash
# `pipesgd simulate` and `pipesgd advise` (sourced by run_cli_tests.sh after 70_profile.sh, whose
# $R/profile-mlp.json they simulate; uses $R, $TMP, run, row, pycheck, help_lists_flags,
# expect_success, expect_contains):
#  - bad input: one stderr line, exit 2 (usage) or 1 (a broken profile file);
#  - simulate: the table, simulate.json (compare.json's field names, one record per method and world
#    size, speedups against the first method), the Chrome trace (spans on tracks per worker thread,
#    allreduce arguments), the same output for the same input;
#  - advise: the ranking, the recommendation with its command line, advise.json sorted by throughput.

P=$R/profile-mlp.json
printf '{"format": "pipesgd-profile", "version": 1, "model": "x", "batch": 1, "data_seconds": 0, "update_seconds": 0, "layers": []}' \
  >"$TMP/no-layers.json"
printf '{"format": "pipesgd-profile", "version": 1, "model": "x", ' >"$TMP/truncated.json"

row simulate-no-profile        2 "--profile FILE is required"            simulate --workers 2
row simulate-missing-profile   1 "profile file '$TMP/none.json': cannot open" simulate --profile "$TMP/none.json"
row simulate-truncated-profile 1 "profile file '$TMP/truncated.json': not valid JSON" simulate --profile "$TMP/truncated.json"
row simulate-profile-no-layers 1 "has no layers"                          simulate --profile "$TMP/no-layers.json"
row simulate-zero-workers      2 "--workers '0': '0' is not a world size" simulate --profile "$P" --workers 0
row simulate-unknown-topology  2 "--topology 'star': expected flat or fat-tree" simulate --profile "$P" --topology star
row simulate-small-fat-tree    2 "holds 4 hosts, fewer than the 8"        simulate --profile "$P" --workers 8 --algos dsync \
  --topology 'fat-tree:1;4;1;1'
row simulate-no-bandwidth      2 "the simulator needs a bandwidth"         simulate --profile "$P" --net none
row simulate-bad-jitter        2 "--compute-jitter 'lots'"                 simulate --profile "$P" --compute-jitter lots
row simulate-bad-model         2 "--network-model 'exact': expected ideal or simgrid" simulate --profile "$P" --network-model exact
row simulate-unknown-method    2 "unknown algorithm 'nope'"                simulate --profile "$P" --algos dsync,nope
row simulate-trace-too-large   2 "--trace records world sizes up to 16"    simulate --profile "$P" --workers 32 --trace "$TMP/t.json"
row advise-zero-workers        2 "--workers must be at least 1"            advise --profile "$P" --workers 0
row advise-unknown-method      2 "--methods: unknown method 'nope'"        advise --profile "$P" --methods nope
row advise-unknown-codec       2 "codec"                                   advise --profile "$P" --codecs int4

help_lists_flags simulate --profile --workers --net --calibration --network-model --topology --algos --iters \
  --compute-scale --compute-jitter --comm-shares-core --collectives --seed --out --trace --quiet -- simulate
help_lists_flags advise --profile --workers --net --calibration --network-model --topology --codecs --methods --top \
  --iters --compute-scale --compute-jitter --comm-shares-core --collectives --out --quiet -- advise

SIM_ARGS=(simulate --profile "$P" --workers 2,3 --algos dsync,pipe,pipe+int8,wfbp,sapipe+wp3,pssync,odsgd --iters 6 --quiet)
run "${SIM_ARGS[@]}" --out "$R/sim" --trace "$R/sim-trace.json" >"$R/sim.out" 2>"$R/sim.err"
expect_success "simulate/exit-0" $? "$R/sim.out" "$R/sim.err"
expect_contains "simulate/table" "$R/sim.out" "iteration ms" "samples/s" "scaling eff." "exposed ms" "speedup vs dsync" \
  "pipe+int8" "odsgd" "wrote $R/sim/simulate.json" "wrote $R/sim-trace.json"
pycheck "simulate/json" "$R/sim/simulate.json" <<'PY'
import json, sys
records = json.load(open(sys.argv[1]))
methods = ["dsync", "pipe", "pipe+int8", "wfbp", "sapipe+wp3", "pssync", "odsgd"]
assert [(r["method"], r["workers"]) for r in records] == [(m, w) for w in (2, 3) for m in methods], records
for r in records:
    for key in ("throughput_samples_per_s", "iteration_s", "breakdown", "speedup", "speedup_baseline", "bucket_plan",
                "scaling_efficiency", "exposed_s", "compute_s"):
        assert key in r, (key, r)
    assert set(r["breakdown"]) >= {"update_s", "compensation_s", "data_s", "forward_s", "backward_s", "wait_s",
                                   "comm_s", "iteration_s"}, r["breakdown"]
    assert r["simulated"] is True and r["speedup_baseline"] == "dsync"
    assert abs(r["throughput_samples_per_s"] * r["iteration_s"] - r["workers"] * r["batch"]) < 1e-6 * r["workers"] * r["batch"]
    assert r["iteration_s"] >= r["compute_s"] * (1 - 1e-9), r
    assert 0 < r["scaling_efficiency"] <= 1 + 1e-9, r
for w in (2, 3):
    first = [r for r in records if r["workers"] == w][0]
    assert first["speedup"] == 1.0, first
PY
pycheck "simulate/trace" "$R/sim-trace.json" <<'PY'
import json, sys
trace = json.load(open(sys.argv[1]))
events = trace["traceEvents"]
spans = [e for e in events if e["ph"] == "X"]
names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
assert "pipe, 2 workers: worker 0" in names and "pssync, 3 workers: server 0" in names, sorted(names)[:10]
threads = {(e["pid"], e["args"]["name"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
assert any(name == "comm" for _, name in threads) and any(name == "compute" for _, name in threads)
assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in spans)
allreduces = [e for e in spans if e["name"] == "allreduce"]
assert allreduces and all({"elements", "bytes", "algorithm", "codec", "tag"} <= set(e["args"]) for e in allreduces)
assert {"forward", "backward", "update"} <= {e["name"] for e in spans}
# Spans of one track never overlap (each thread does one thing at a time).
tracks = {}
for e in spans:
    tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
for key, items in tracks.items():
    items.sort()
    for (s0, e0), (s1, e1) in zip(items, items[1:]):
        assert s1 >= e0 - 1e-6, (key, (s0, e0), (s1, e1))
PY
run "${SIM_ARGS[@]}" --out "$R/sim-again" --trace "$R/sim-trace-again.json" >/dev/null 2>&1
if cmp -s "$R/sim/simulate.json" "$R/sim-again/simulate.json" && cmp -s "$R/sim-trace.json" "$R/sim-trace-again.json"; then
  pass "simulate/deterministic"
else
  fail "simulate/deterministic" "two runs of the same simulation wrote different simulate.json or traces"
fi

run advise --profile "$P" --workers 4 --iters 4 --quiet --out "$R/advise" >"$R/advise.out" 2>"$R/advise.err"
expect_success "advise/exit-0" $? "$R/advise.out" "$R/advise.err"
expect_contains "advise/ranking" "$R/advise.out" "rank" "configuration" "accuracy trade" "accuracy trades:" \
  "recommended: " "mpirun -np " "pipesgd train --transport mpi" "wrote $R/advise/advise.json"
pycheck "advise/json" "$R/advise/advise.json" <<'PY'
import json, sys
records = json.load(open(sys.argv[1]))
speeds = [r["throughput_samples_per_s"] for r in records]
# By throughput; equal ones (to a relative 1e-9) in any order (advise puts the one that trades less first).
assert all(a >= b * (1 - 1e-9) for a, b in zip(speeds, speeds[1:])), speeds
assert [r["rank"] for r in records] == list(range(1, len(records) + 1))
configurations = {r["configuration"] for r in records}
for expected in ("dsync", "dsync+int8", "pipe --staleness-k 2", "pipe+bf16 --staleness-k 3", "mgwfbp", "sapipe",
                 "pssync --servers 1", "pssync --servers 2", "odsgd --servers 2", "dcasgd --servers 1"):
    assert expected in configurations, (expected, sorted(configurations))
by = {r["configuration"]: r for r in records}
assert by["dsync"]["accuracy_costs"] == [] and by["dsync"]["speedup"] == 1.0
assert any("staleness" in c for c in by["pipe --staleness-k 2"]["accuracy_costs"])
assert any("lossy codec" in c for c in by["dsync+int8"]["accuracy_costs"])
assert by["pssync --servers 2"]["command"].startswith("mpirun -np 6 "), by["pssync --servers 2"]["command"]
PY
