# shellcheck shell=bash
# No silent wrong runs: count flags that would mean something else are refused; a launch of several
# MPI ranks without --transport mpi stops (simulated here by the launcher's variables; the real
# mpirun rows are in mpi_rows/20_mpi_launch.sh), and so does a torchrun-style launch of several
# processes (RANK and WORLD_SIZE without an MPI launcher); runs shorter than their method's planning or
# warm-up warn and report what ran; compare's speedup names its baseline.
# Sourced by run_cli_tests.sh (uses $R, run, row, pycheck, expect_success, expect_contains, pass, fail).

NQ=(--data synthetic --quiet --no-eval)

# exact_stderr NAME FILE LINE: FILE is exactly LINE and a newline.
exact_stderr() {
  if [ "$(cat "$2")" = "$3" ] && [ "$(wc -l <"$2")" -eq 1 ]; then
    pass "$1"
  else
    fail "$1" "stderr: $(excerpt "$2" 400) [expected: $3]"
  fi
}

# --- Count flags.
ITERS_ZERO="pipesgd: error: --iters must be in [1, 10000000], got 0; omit --iters to train whole epochs (--epochs)"
row iters-zero 2 "--iters must be in [1, 10000000], got 0" train --iters 0 "${NQ[@]}"
exact_stderr "error/iters-zero-exact-line" "$TMP/rows/iters-zero.err" "$ITERS_ZERO"
row compare-iters-zero 2 "--iters must be in [1, 10000000], got 0" compare --algos dsync,pipe --iters 0 "${NQ[@]}"
exact_stderr "error/compare-iters-zero-exact-line" "$TMP/rows/compare-iters-zero.err" "$ITERS_ZERO"
row epochs-and-iters 2 "--epochs and --iters: give one" train --epochs 2 --iters 3 "${NQ[@]}"
row epochs-zero-and-iters 2 "--epochs and --iters: give one" train --epochs 0 --iters 3 "${NQ[@]}"
row servers-zero 2 "--servers must be in [1, 1024], got 0" train --algo pssync --servers 0 --iters 3 "${NQ[@]}"
run train --help >"$R/nswr-help.out" 2>&1
expect_contains "help/iters-and-epochs-say-give-one" "$R/nswr-help.out" \
  "give --iters or --epochs, not both" "Epochs to train (>= 1); --iters replaces them" \
  "Parameter-server ranks, at least 1"
run bench allreduce --help >"$R/nswr-bench-help.out" 2>&1
expect_contains "help/bench-warmup-zero-is-none" "$R/nswr-bench-help.out" "Untimed runs first (0: none)"

# --- A launch of several ranks without --transport mpi, as mpirun's variables tell it.
LOCAL_UNDER_MPIRUN="pipesgd: error: started by mpirun with 2 ranks but --transport is local: pass --transport mpi (each rank is one worker)"
for command in "train --iters 3" "compare --iters 3" "bench allreduce --sizes 4K" "calibrate --sizes 4K,8K"; do
  name="mpirun-env-$(echo "$command" | cut -d' ' -f1-2 | tr ' ' '-' | sed 's/--.*//; s/-$//')"
  # shellcheck disable=SC2086  # the command's words
  OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 row "$name" 2 "started by mpirun with 2 ranks" $command --quiet
  exact_stderr "error/$name-exact-line" "$TMP/rows/$name.err" "$LOCAL_UNDER_MPIRUN"
done
OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 row mpirun-env-plan 2 \
  "started by mpirun with 2 ranks, but plan runs its workers as threads of one process: start it without mpirun" \
  plan --data synthetic --quiet
PMI_SIZE=3 PMI_RANK=0 row pmi-env-train 2 "started by a PMI launcher with 3 ranks but --transport is local" \
  train --iters 3 "${NQ[@]}"
PMIX_RANK=1 row pmix-env-rank1-train 2 "started by a PMIx launcher with more than one rank" train --iters 3 "${NQ[@]}"
# Rank 1 of a known size leaves quietly (rank 0 says it): exit 2, nothing on stderr.
OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=1 run train --iters 3 "${NQ[@]}" \
  >"$R/nswr-rank1.out" 2>"$R/nswr-rank1.err"
rc=$?
if [ "$rc" -eq 2 ] && [ ! -s "$R/nswr-rank1.err" ] && [ ! -s "$R/nswr-rank1.out" ]; then
  pass "error/mpirun-env-rank1-quiet"
else
  fail "error/mpirun-env-rank1-quiet" "exit $rc, stderr: $(excerpt "$R/nswr-rank1.err"), stdout: $(excerpt "$R/nswr-rank1.out")"
fi
# One rank (mpirun -np 1) runs as a plain process; so does a run with none of the variables.
OMPI_COMM_WORLD_SIZE=1 OMPI_COMM_WORLD_RANK=0 run train --iters 3 "${NQ[@]}" >"$R/nswr-np1.out" 2>"$R/nswr-np1.err"
expect_success "train/mpirun-env-one-rank-runs" $? "$R/nswr-np1.out" "$R/nswr-np1.err"
(unset OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK PMI_SIZE PMI_RANK PMIX_RANK
 run train --iters 3 "${NQ[@]}" >"$R/nswr-plain.out" 2>"$R/nswr-plain.err")
expect_success "train/plain-run-without-launcher-runs" $? "$R/nswr-plain.out" "$R/nswr-plain.err"
expect_contains "train/plain-run-without-launcher-reports" "$R/nswr-plain.out" "dsync: mlp, 4 workers"
if [ -s "$R/nswr-plain.err" ]; then
  fail "train/plain-run-without-launcher-quiet" "stderr: $(excerpt "$R/nswr-plain.err")"
else
  pass "train/plain-run-without-launcher-quiet"
fi

# --- A torchrun-style launch of several processes (RANK, WORLD_SIZE > 1, no MPI launcher): its
# processes would never join one world, each would train alone. Every process says so in one line
# (rank 1 too, a second later), whatever its --transport.
TORCHRUN_TRAIN='pipesgd: error: this process was started torchrun-style (RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500) without an MPI launcher; pipesgd'"'"'s ranks join through MPI: launch with `pipesgdrun -np 2 ...` or `mpirun -np 2 ...` and --transport mpi (the workers would otherwise train as independent jobs)'
RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 GROUP_RANK=0 TORCHELASTIC_RUN_ID=none \
  row torchrun-env-train 2 "started torchrun-style" train --iters 1 "${NQ[@]}"
exact_stderr "error/torchrun-env-train-exact-line" "$TMP/rows/torchrun-env-train.err" "$TORCHRUN_TRAIN"
if [ -s "$TMP/rows/torchrun-env-train.out" ]; then
  fail "error/torchrun-env-train-no-output" "stdout: $(excerpt "$TMP/rows/torchrun-env-train.out")"
else
  pass "error/torchrun-env-train-no-output"
fi
RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 row torchrun-env-compare-mpi 2 \
  "(RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500) without an MPI launcher; pipesgd's ranks join through MPI: launch with \`pipesgdrun -np 3 ...\`" \
  compare --algos dsync,pipe --transport mpi --iters 1 "${NQ[@]}"
RANK=0 WORLD_SIZE=2 row torchrun-env-bench 2 "(the workers would otherwise run as independent jobs)" \
  bench allreduce --sizes 4K --quiet
RANK=0 WORLD_SIZE=2 row torchrun-env-plan 2 \
  "plan runs its workers as threads of one process: start it once, without torchrun (the 2 processes would otherwise each run it)" \
  plan --data synthetic --quiet
# A torchrun of one process (WORLD_SIZE=1) runs as a plain process.
RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 run train --iters 1 "${NQ[@]}" \
  >"$R/nswr-torchrun1.out" 2>"$R/nswr-torchrun1.err"
expect_success "train/torchrun-env-one-process-runs" $? "$R/nswr-torchrun1.out" "$R/nswr-torchrun1.err"

# --- Runs that end before their method's plan or pipeline.
MGWFBP_WARNING="pipesgd: warning: the run's 5 iterations end before the mgwfbp bucket plan takes effect at iteration 18 (it is made from 10 profiled iterations after 8 start-up ones); until then it allreduces the whole gradient as one bucket (iterations 0-12), then one bucket per layer to profile (iterations 13-17); a run of 19 or more iterations reaches it"
run train --algo mgwfbp --iters 5 "${NQ[@]}" --out "$R/nswr-mgwfbp" >"$R/nswr-mgwfbp.out" 2>"$R/nswr-mgwfbp.err"
expect_success "short-run/mgwfbp-exit-0" $? "$R/nswr-mgwfbp.out" "$R/nswr-mgwfbp.err"
exact_stderr "short-run/mgwfbp-warning" "$R/nswr-mgwfbp.err" "$MGWFBP_WARNING"
expect_contains "short-run/mgwfbp-report" "$R/nswr-mgwfbp.out" \
  "Short run: the run's 5 iterations end before the mgwfbp bucket plan takes effect at iteration 18" \
  "Layer-wise communication: plan mgwfbp: not reached (it takes effect at iteration 18); the last iteration ran single: 1 bucket: [2..0]; 1 allreduce per iteration." \
  "ms predicted (Eq. 2: no plan was made)"
pycheck "short-run/mgwfbp-summary" "$R/nswr-mgwfbp/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["bucket_plan"] == "single: 1 bucket: [2..0]", s["bucket_plan"]
assert s["allreduce_calls_per_iteration"] == 1, s["allreduce_calls_per_iteration"]
assert s["planned_bucket_plan"] == "mgwfbp" and s["bucket_plan_reached"] is False, s
assert s["bucket_plan_start_iteration"] == 18 and s["predicted_non_overlapped_comm_s"] is None, s
u = s["unreached_phase"]
assert u["start_iteration"] == 18 and u["event"] == "the mgwfbp bucket plan takes effect", u
PY

SAPIPE_WARNING="pipesgd: warning: the run's 3 iterations end before SAPipe starts pipelining at iteration 18 (after 8 start-up and 10 profiling iterations, which choose the synchronous layers' optimal plan); until then every iteration runs synchronously: the whole gradient in one allreduce after backward, no layer stale; a run of 19 or more iterations reaches it"
run train --algo sapipe --stale-layers 0 --iters 3 "${NQ[@]}" --out "$R/nswr-sapipe" \
  >"$R/nswr-sapipe.out" 2>"$R/nswr-sapipe.err"
expect_success "short-run/sapipe-exit-0" $? "$R/nswr-sapipe.out" "$R/nswr-sapipe.err"
exact_stderr "short-run/sapipe-warning" "$R/nswr-sapipe.err" "$SAPIPE_WARNING"
expect_contains "short-run/sapipe-report" "$R/nswr-sapipe.out" \
  "SAPipe partial staleness: never pipelined (it would start at iteration 18): every iteration ran synchronously, the whole gradient in one allreduce after backward, no layer stale (compensation wp3 never applied)." \
  "Synchronous layers: (never pipelined: the whole gradient in one allreduce after backward); 1 allreduce per iteration." \
  "This method's timing model is Eq. 2;"
pycheck "short-run/sapipe-summary" "$R/nswr-sapipe/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
r = s["sapipe"]
assert r["pipelined"] is False and r["stale_layers"] == 0 and r["pipeline_start_iteration"] == 18, r
assert s["allreduce_calls_per_iteration"] == 1, s["allreduce_calls_per_iteration"]
assert s["predicted_iteration_s"] == s["predicted_dsync_eq2_s"], (s["predicted_iteration_s"], s["predicted_dsync_eq2_s"])
assert s["unreached_phase"]["start_iteration"] == 18, s["unreached_phase"]
PY
# Long enough (the plan made from 2 profiled iterations takes effect at 10): no warning, the plan.
run train --algo mgwfbp --profile-iters 2 --iters 11 "${NQ[@]}" --out "$R/nswr-mgwfbp-planned" \
  >"$R/nswr-mgwfbp-planned.out" 2>"$R/nswr-mgwfbp-planned.err"
expect_success "short-run/planned-exit-0" $? "$R/nswr-mgwfbp-planned.out" "$R/nswr-mgwfbp-planned.err"
if [ -s "$R/nswr-mgwfbp-planned.err" ] || grep -qF "Short run" "$R/nswr-mgwfbp-planned.out"; then
  fail "short-run/planned-no-warning" "stderr: $(excerpt "$R/nswr-mgwfbp-planned.err")"
else
  pass "short-run/planned-no-warning"
fi
pycheck "short-run/planned-summary" "$R/nswr-mgwfbp-planned/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["bucket_plan"].startswith("mgwfbp: "), s["bucket_plan"]
assert s["bucket_plan_reached"] is True and s["unreached_phase"] is None, s
PY

# --- compare names the baseline of its speedup.
run compare --algos pipe,dsync,mgwfbp --iters 3 "${NQ[@]}" --out "$R/nswr-compare" \
  >"$R/nswr-compare.out" 2>"$R/nswr-compare.err"
expect_success "compare/baseline-exit-0" $? "$R/nswr-compare.out" "$R/nswr-compare.err"
if grep -E '^method +samples/s' "$R/nswr-compare.out" | grep -qE 'speedup vs pipe$'; then
  pass "compare/header-names-baseline"
else
  fail "compare/header-names-baseline" "header: $(grep -E '^method' "$R/nswr-compare.out" | head -1)"
fi
expect_contains "compare/short-run-line" "$R/nswr-compare.out" \
  "mgwfbp: the run's 3 iterations end before the mgwfbp bucket plan takes effect at iteration 18"
pycheck "compare/json-names-baseline" "$R/nswr-compare/compare.json" <<'PY'
import json, sys
records = json.load(open(sys.argv[1]))
assert [r["method"] for r in records] == ["pipe", "dsync", "mgwfbp"], records
assert all(r["speedup_baseline"] == "pipe" for r in records), [r["speedup_baseline"] for r in records]
assert records[0]["speedup"] == 1, records[0]["speedup"]
assert records[0]["unreached_phase"] is None and records[2]["unreached_phase"]["start_iteration"] == 18, records
PY
