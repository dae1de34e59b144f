#!/usr/bin/env bash
# End-to-end tests of `pipesgd ... --transport mpi` under OpenMPI's mpirun (one worker per rank).
#
#   tests/cli/run_mpi_cli_tests.sh path/to/pipesgd
#
# Prints one line per check (`ok <name>` or `FAIL <name>: why`) and, last, exactly one summary line
# `N passed, M failed`. Exits 0 only if nothing failed. Needs OpenMPI's mpirun, bash, coreutils
# `timeout`, python3 and the Fashion-MNIST files in /usr/share/datasets/fashion-mnist. As root,
# OpenMPI also wants OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 (ctest sets both).
# Runs up to 3 ranks with --oversubscribe (fine on 2 cores).
#
# Every rank started here records its process id in $PIDS; the last check asserts that none is
# left, and the exit trap resumes and kills whatever still runs (by those ids only).
set -u

# shellcheck source=cli_test_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/cli_test_lib.sh"
cli_test_setup pipesgd-mpi-cli-tests "$@"
R=$TMP/runs
mkdir -p "$R"
PIDS=$TMP/pids
: >"$PIDS"
BIN_REAL=$(readlink -f "$BIN")
BACKGROUND=  # the timeout(1) process of an mpirun running in the background

# $PIDS holds "PID START" lines, START being the process's start time (field 22 of /proc/PID/stat),
# so that a recycled id is never taken for one of ours. START_FIELD is the shell code that prints it.
# shellcheck disable=SC2016  # expanded where it runs
START_FIELD='sed "s/.*) //" /proc/$P/stat | cut -d" " -f20'
# shellcheck disable=SC2034  # P is read by START_FIELD
proc_start() { local P=$1; eval "$START_FIELD" 2>/dev/null; }
# True if process PID [START] still runs our binary (not a zombie, not a recycled id).
is_running_pipesgd() {
  local exe
  exe=$(readlink "/proc/$1/exe" 2>/dev/null) || return 1
  [ "$exe" = "$BIN_REAL" ] || [ "$exe" = "$BIN_REAL (deleted)" ] || return 1
  [ -z "${2:-}" ] || [ "$(proc_start "$1")" = "$2" ] || return 1
  [ "$(awk '/^State:/ { print $2 }' "/proc/$1/status" 2>/dev/null)" != Z ]
}
leftover_pipesgd() {
  local pid start
  while read -r pid start; do is_running_pipesgd "$pid" "$start" && echo "$pid"; done <"$PIDS"
}
cli_test_cleanup() {
  local pid
  [ -z "$BACKGROUND" ] || kill -TERM "$BACKGROUND" 2>/dev/null
  for pid in $(leftover_pipesgd); do
    kill -CONT "$pid" 2>/dev/null
    kill -KILL "$pid" 2>/dev/null
  done
}
trap 'exit 130' INT
trap 'exit 143' TERM

command -v mpirun >/dev/null || cli_test_abort "mpirun not found"

# mpi_run NP [mpirun options] -- pipesgd ARGS: pipesgd under mpirun, bounded in time (TIMEOUT,
# default 120 s) and memory. Each rank records its id in $PIDS; with RANK_DIRS set it runs in
# $RANK_DIRS/rank<R> (relative --out paths then show which ranks write).
# shellcheck disable=SC2016  # expanded by each rank's sh
RANK_WRAPPER='P=$$; echo "$P $('"$START_FIELD"')" >>"$1"; if [ -n "$2" ]; then cd "$2/rank$OMPI_COMM_WORLD_RANK" || exit 99; fi; shift 2; exec "$@"'
mpi_run() {
  local np=$1
  shift
  local options=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    options+=("$1")
    shift
  done
  shift
  (ulimit -v "$MEMORY_LIMIT_KB" 2>/dev/null
   exec timeout -k 5 "${TIMEOUT:-120}" mpirun -np "$np" --oversubscribe "${options[@]}" \
     sh -c "$RANK_WRAPPER" sh "$PIDS" "${RANK_DIRS:-}" "$BIN" "$@")
}

# mpirun must work at all (as root it needs the OMPI_ALLOW_RUN_AS_ROOT variables).
timeout 60 mpirun -np 1 --oversubscribe true >"$TMP/mpirun-check.out" 2>&1 ||
  cli_test_abort "mpirun -np 1 true failed: $(excerpt "$TMP/mpirun-check.out" 400)"

# ---------------------------------------------------------------------------------------------------
# 1. The same weights over MPI as over threads: the ranks of an MPI run and the worker threads of a
# local run compute bit-identical allreduces, so the final weights' checksums agree.
checksum_check() {  # NAME DIR_A DIR_B same|different [WORKERS, default 3]
  pycheck "$1" "$2/summary.json" "$3/summary.json" "$4" "${5:-3}" <<'EOF'
import json, sys
a, b = (json.load(open(path)) for path in sys.argv[1:3])
workers = int(sys.argv[4])
ca, cb = a.get("weights_checksum"), b.get("weights_checksum")
assert ca and cb, f"weights_checksum missing: {ca!r}, {cb!r}"
if sys.argv[3] == "same":
    assert ca == cb, f"weights_checksum {ca} (first) != {cb} (second)"
else:
    assert ca != cb, f"weights_checksum {ca} in both runs"
for s in (a, b):
    assert s.get("workers") == workers and s.get("iterations") == 30, \
        f"workers {s.get('workers')}, iterations {s.get('iterations')} (expected {workers}, 30)"
EOF
}
E=(--iters 30 --quiet --no-eval)  # Fashion-MNIST (the default data)

# local_vs_mpi NAME TRAIN_ARGS...: trains with 3 worker threads and with 3 MPI ranks.
local_vs_mpi() {
  local name=$1
  shift
  run train --workers 3 "$@" "${E[@]}" --out "$R/local-$name" >"$R/local-$name.out" 2>"$R/local-$name.err"
  expect_success "weights/$name-local-exit-0" $? "$R/local-$name.out" "$R/local-$name.err"
  mpi_run 3 -- train --transport mpi "$@" "${E[@]}" --out "$R/mpi-$name" \
    >"$R/mpi-$name.out" 2>"$R/mpi-$name.err"
  expect_success "weights/$name-mpi-exit-0" $? "$R/mpi-$name.out" "$R/mpi-$name.err"
  checksum_check "weights/$name-mpi-equals-local" "$R/local-$name" "$R/mpi-$name" same
}

# D-Sync, with each rank in its own directory and a relative --out: only rank 0 may write it.
run train --workers 3 --algo dsync "${E[@]}" --out "$R/local-dsync" >"$R/local-dsync.out" 2>"$R/local-dsync.err"
expect_success "weights/dsync-local-exit-0" $? "$R/local-dsync.out" "$R/local-dsync.err"
mkdir -p "$R/mpi-dsync/rank0" "$R/mpi-dsync/rank1" "$R/mpi-dsync/rank2"
RANK_DIRS=$R/mpi-dsync mpi_run 3 -- train --transport mpi --algo dsync "${E[@]}" --out out \
  >"$R/mpi-dsync.out" 2>"$R/mpi-dsync.err"
expect_success "weights/dsync-mpi-exit-0" $? "$R/mpi-dsync.out" "$R/mpi-dsync.err"
checksum_check "weights/dsync-mpi-equals-local" "$R/local-dsync" "$R/mpi-dsync/rank0/out" same

local_vs_mpi pipe --algo pipe
# The ranks of this host talk through shared memory by default; PIPESGD_MPI_SHARED_MEMORY=0 sends
# everything through MPI: the same weights either way, and the start-up line says which route.
PIPESGD_MPI_SHARED_MEMORY=0 mpi_run 3 -- train --transport mpi --algo pipe --iters 30 --no-eval \
  --out "$R/mpi-pipe-mpi-path" >"$R/mpi-pipe-mpi-path.out" 2>"$R/mpi-pipe-mpi-path.err"
expect_success "weights/pipe-mpi-path-exit-0" $? "$R/mpi-pipe-mpi-path.out" "$R/mpi-pipe-mpi-path.err"
checksum_check "weights/pipe-mpi-path-equals-shared-memory" "$R/mpi-pipe" "$R/mpi-pipe-mpi-path" same
mpi_run 3 -- train --transport mpi --algo pipe --iters 3 --no-eval --data synthetic \
  >"$R/mpi-pipe-shm-line.out" 2>"$R/mpi-pipe-shm-line.err"
if grep -q "^pipesgd train: .*the 3 ranks of this host through shared memory" "$R/mpi-pipe-shm-line.out" &&
   grep -q "^pipesgd train: .*same-host peers through MPI (PIPESGD_MPI_SHARED_MEMORY=0" "$R/mpi-pipe-mpi-path.out"; then
  pass "transport/start-up-line-names-the-route"
else
  fail "transport/start-up-line-names-the-route" "$(head -c 300 "$R/mpi-pipe-shm-line.out") | $(head -c 300 "$R/mpi-pipe-mpi-path.out")"
fi
local_vs_mpi halving-doubling --algo dsync --allreduce halving-doubling
# Layer-wise: wfbp's buckets are fixed (one per layer), so its weights are deterministic; the
# planning step (profile averaging, allreduce probes on Channel::kPlanning) runs over MPI too.
local_vs_mpi wfbp --algo wfbp --profile-iters 4
# Checkpoints over MPI: rank 2 killed at iteration 25 (--inject-fault crash: SIGKILL). The set
# after iteration 20 may be incomplete (rank 2's background write can die with it); the run resumed
# from the newest complete set (20 or 10) ends with the uninterrupted run's weights.
mpi_run 3 -- train --transport mpi --algo pipe "${E[@]}" --out "$R/mpi-ck-full" \
  >"$R/mpi-ck-full.out" 2>"$R/mpi-ck-full.err"
expect_success "checkpoint/mpi-full-exit-0" $? "$R/mpi-ck-full.out" "$R/mpi-ck-full.err"
mpi_run 3 -- train --transport mpi --algo pipe "${E[@]}" --checkpoint-dir "$R/mpi-ck" --checkpoint-every 10 \
  --inject-fault rank=2,iter=25,kind=crash --comm-timeout 5 >"$R/mpi-ck-crash.out" 2>"$R/mpi-ck-crash.err"
rc=$?
if [ "$rc" -ne 0 ] && [ -f "$R/mpi-ck/checkpoint-000000000010-rank2.psgd" ]; then
  pass "checkpoint/mpi-crash-exits-non-zero-with-a-complete-set"
else
  fail "checkpoint/mpi-crash-exits-non-zero-with-a-complete-set" "exit $rc; $(ls "$R/mpi-ck" 2>&1 | tr '\n' ' ')"
fi
mpi_run 3 -- train --transport mpi --algo pipe "${E[@]}" --checkpoint-dir "$R/mpi-ck" --resume \
  --out "$R/mpi-ck-resumed" >"$R/mpi-ck-resumed.out" 2>"$R/mpi-ck-resumed.err"
expect_success "checkpoint/mpi-resume-exit-0" $? "$R/mpi-ck-resumed.out" "$R/mpi-ck-resumed.err"
checksum_check "checkpoint/mpi-resume-equals-uninterrupted" "$R/mpi-ck-full" "$R/mpi-ck-resumed" same

# SAPipe with a fixed partition (2 stale layers, wfbp buckets for the others: nothing measured decides
# the weights) and weight prediction; and with --stale-layers auto, whose k comes from the profile
# averaged over the ranks (it must run; its weights depend on the measured k).
local_vs_mpi sapipe --algo sapipe+wp3 --stale-layers 2 --buckets wfbp
mpi_run 3 -- train --transport mpi --algo sapipe+dc --model cnn --data synthetic --iters 40 --profile-iters 2 --quiet \
  >"$R/mpi-sapipe-auto.out" 2>"$R/mpi-sapipe-auto.err"
expect_success "sapipe/auto-mpi-exit-0" $? "$R/mpi-sapipe-auto.out" "$R/mpi-sapipe-auto.err"
expect_contains "sapipe/auto-mpi-report" "$R/mpi-sapipe-auto.out" "SAPipe partial staleness: k = " "compensation dc"

# PS-Sync: mpirun -np 3 --servers 1 is 2 worker ranks and 1 server rank (the last); the servers sum
# in worker order on both transports, so the weights equal those of 2 worker + 1 server threads.
run train --workers 2 --servers 1 --algo pssync "${E[@]}" --out "$R/local-pssync" \
  >"$R/local-pssync.out" 2>"$R/local-pssync.err"
expect_success "weights/pssync-local-exit-0" $? "$R/local-pssync.out" "$R/local-pssync.err"
mpi_run 3 -- train --transport mpi --algo pssync --servers 1 "${E[@]}" --out "$R/mpi-pssync" \
  >"$R/mpi-pssync.out" 2>"$R/mpi-pssync.err"
expect_success "weights/pssync-mpi-exit-0" $? "$R/mpi-pssync.out" "$R/mpi-pssync.err"
checksum_check "weights/pssync-mpi-equals-local" "$R/local-pssync" "$R/mpi-pssync" same 2
expect_contains "weights/pssync-mpi-header" "$R/mpi-pssync.out" "2 workers + 1 server as mpi"

# OD-SGD: the servers are PS-Sync's and each worker's local update is its own, so the weights are
# deterministic too: 2 worker ranks + 1 server rank equal 2 worker threads + 1 server thread.
run train --workers 2 --servers 1 --algo odsgd --warmup-iters 10 --local-updater dcasgd-c "${E[@]}" \
  --out "$R/local-odsgd" >"$R/local-odsgd.out" 2>"$R/local-odsgd.err"
expect_success "weights/odsgd-local-exit-0" $? "$R/local-odsgd.out" "$R/local-odsgd.err"
mpi_run 3 -- train --transport mpi --algo odsgd --warmup-iters 10 --local-updater dcasgd-c "${E[@]}" \
  --out "$R/mpi-odsgd" >"$R/mpi-odsgd.out" 2>"$R/mpi-odsgd.err"
expect_success "weights/odsgd-mpi-exit-0" $? "$R/mpi-odsgd.out" "$R/mpi-odsgd.err"
checksum_check "weights/odsgd-mpi-equals-local" "$R/local-odsgd" "$R/mpi-odsgd" same 2
expect_contains "weights/odsgd-mpi-timing-model" "$R/mpi-odsgd.out" "OD-SGD timing model"
# OD-SGD checkpoints over MPI: worker rank 1 killed at iteration 25; the server rank writes its
# shard's part of every set; resumed from the newest complete set, the weights equal the run above.
mpi_run 3 -- train --transport mpi --algo odsgd --warmup-iters 10 --local-updater dcasgd-c "${E[@]}" \
  --checkpoint-dir "$R/mpi-ck-odsgd" --checkpoint-every 10 --inject-fault rank=1,iter=25,kind=crash --comm-timeout 5 \
  >"$R/mpi-ck-odsgd-crash.out" 2>"$R/mpi-ck-odsgd-crash.err"
rc=$?
if [ "$rc" -ne 0 ] && [ -f "$R/mpi-ck-odsgd/checkpoint-000000000010-server0.psgd" ]; then
  pass "checkpoint/mpi-odsgd-crash-exits-non-zero-with-a-server-part"
else
  fail "checkpoint/mpi-odsgd-crash-exits-non-zero-with-a-server-part" "exit $rc; $(ls "$R/mpi-ck-odsgd" 2>&1 | tr '\n' ' ')"
fi
mpi_run 3 -- train --transport mpi --algo odsgd --warmup-iters 10 --local-updater dcasgd-c "${E[@]}" \
  --checkpoint-dir "$R/mpi-ck-odsgd" --resume --out "$R/mpi-ck-odsgd-resumed" \
  >"$R/mpi-ck-odsgd-resumed.out" 2>"$R/mpi-ck-odsgd-resumed.err"
expect_success "checkpoint/mpi-odsgd-resume-exit-0" $? "$R/mpi-ck-odsgd-resumed.out" "$R/mpi-ck-odsgd-resumed.err"
checksum_check "checkpoint/mpi-odsgd-resume-equals-uninterrupted" "$R/local-odsgd" "$R/mpi-ck-odsgd-resumed" same 2

# DC-ASGD is asynchronous (the weights depend on arrival order): it must run and report, over 2
# servers.
mpi_run 4 -- train --transport mpi --algo dcasgd --servers 2 --dc-variant a "${E[@]}" \
  >"$R/mpi-dcasgd.out" 2>"$R/mpi-dcasgd.err"
expect_success "train/dcasgd-mpi-exit-0" $? "$R/mpi-dcasgd.out" "$R/mpi-dcasgd.err"
expect_contains "train/dcasgd-mpi-header" "$R/mpi-dcasgd.out" "2 workers + 2 servers as mpi"

# The control: another seed must change the checksum, or the comparisons above prove nothing.
mpi_run 3 -- train --transport mpi --algo dsync --seed 2 "${E[@]}" --out "$R/mpi-seed2" \
  >"$R/mpi-seed2.out" 2>"$R/mpi-seed2.err"
expect_success "weights/seed2-mpi-exit-0" $? "$R/mpi-seed2.out" "$R/mpi-seed2.err"
checksum_check "weights/other-seed-changes-checksum" "$R/mpi-dsync/rank0/out" "$R/mpi-seed2" different

# ---------------------------------------------------------------------------------------------------
# 2. Rank 0 alone prints and writes (the D-Sync run above).
count_lines() { grep -cE -- "$2" "$1"; }  # FILE REGEX
WHY=()
out=$R/mpi-dsync.out
for pattern in '^pipesgd train: ' '^per iteration \(ms\)' '^measured ' '^Eq\. 2 ' '^wrote out/'; do
  n=$(count_lines "$out" "$pattern")
  [ "$n" -eq 1 ] || WHY+=("$n lines match '$pattern', expected 1")
done
if [ ${#WHY[@]} -eq 0 ]; then
  pass "rank0/prints-one-header-and-one-report"
else
  fail "rank0/prints-one-header-and-one-report" "$(join_why) [stdout: $(excerpt "$out" 400)]"
fi
expect_contains "rank0/header-names-mpi" "$out" "3 workers as mpi (3 ranks, MPI_THREAD_MULTIPLE"
if [ -s "$R/mpi-dsync.err" ]; then
  fail "rank0/quiet-means-no-stderr" "stderr: $(excerpt "$R/mpi-dsync.err")"
else
  pass "rank0/quiet-means-no-stderr"
fi
if [ -f "$R/mpi-dsync/rank0/out/summary.json" ] && [ -f "$R/mpi-dsync/rank0/out/metrics.jsonl" ] &&
   [ ! -e "$R/mpi-dsync/rank1/out" ] && [ ! -e "$R/mpi-dsync/rank2/out" ]; then
  pass "rank0/only-rank0-writes-out"
else
  fail "rank0/only-rank0-writes-out" "written: $(cd "$R/mpi-dsync" && find . -path '*/out*' | tr '\n' ' ')"
fi
pycheck "rank0/metrics.jsonl" "$R/mpi-dsync/rank0/out/metrics.jsonl" <<'EOF'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
iterations = [r.get("iteration") for r in records if r.get("type") == "iteration"]
assert iterations == list(range(30)), f"iteration records {iterations[:5]}... (expected 0..29 once)"
EOF
# Progress (not --quiet): rank 0's lines only.
mpi_run 2 -- train --transport mpi --data synthetic --epochs 1 --batch 100 --no-eval \
  >"$R/mpi-progress.out" 2>"$R/mpi-progress.err"
expect_success "rank0/progress-exit-0" $? "$R/mpi-progress.out" "$R/mpi-progress.err"
n=$(count_lines "$R/mpi-progress.err" 'epoch 1/1 done')
if [ "$n" -eq 1 ]; then
  pass "rank0/progress-printed-once"
else
  fail "rank0/progress-printed-once" "$n 'epoch 1/1 done' lines [stderr: $(excerpt "$R/mpi-progress.err")]"
fi
# compare: one table from rank 0.
mpi_run 2 -- compare --transport mpi --algos dsync,pipe --iters 5 --data synthetic --quiet --no-eval \
  >"$R/mpi-compare.out" 2>"$R/mpi-compare.err"
expect_success "rank0/compare-exit-0" $? "$R/mpi-compare.out" "$R/mpi-compare.err"
n=$(count_lines "$R/mpi-compare.out" '^pipesgd compare: ')
m=$(count_lines "$R/mpi-compare.out" 'speedup')
if [ "$n" -eq 1 ] && [ "$m" -eq 1 ]; then
  pass "rank0/compare-prints-one-table"
else
  fail "rank0/compare-prints-one-table" "$n headers, $m table headings [stdout: $(excerpt "$R/mpi-compare.out" 400)]"
fi

# ---------------------------------------------------------------------------------------------------
# 3./4. Usage errors. Under mpirun every rank finds the same usage error and exits 2, and rank 0
# alone prints it; mpirun adds its own banner ("... exited with non-zero status ..."), so the
# contract is: mpirun exits 2, stderr has exactly one "pipesgd: error:" line, it contains FRAGMENT.
# mpi_usage_error NAME NP FRAGMENT ARGS...
mpi_usage_error() {
  local name=$1 np=$2 fragment=$3
  shift 3
  local out="$TMP/rows/$name.out" err="$TMP/rows/$name.err"
  TIMEOUT=60 mpi_run "$np" -- "$@" >"$out" 2>"$err"
  local rc=$?
  WHY=()
  [ "$rc" -eq 2 ] || WHY+=("mpirun exit $rc, expected 2")
  local errors with_fragment
  errors=$(grep -c '^pipesgd: error:' "$err")
  with_fragment=$(grep -cF -- "$fragment" "$err")
  [ "$errors" -eq 1 ] || WHY+=("$errors 'pipesgd: error:' lines, expected 1")
  [ "$with_fragment" -eq 1 ] || WHY+=("$with_fragment lines contain '$fragment', expected 1")
  grep '^pipesgd: error:' "$err" | grep -qF -- "$fragment" || WHY+=("the error line lacks '$fragment'")
  grep -qE "$CRASH_PATTERN" "$out" "$err" && WHY+=("crash or stack trace in the output")
  if [ ${#WHY[@]} -eq 0 ]; then
    pass "usage/$name"
  else
    fail "usage/$name" "$(join_why) [mpirun -np $np pipesgd $* -> stderr: $(excerpt "$err" 400)]"
  fi
}
S=(--data synthetic --iters 3 --quiet --no-eval)
mpi_usage_error workers-mismatch 2 "does not match the 2 MPI ranks" train --transport mpi --workers 3 "${S[@]}"
mpi_usage_error bench-workers-mismatch 2 "does not match the 2 MPI ranks" \
  bench allreduce --transport mpi --workers 3 --sizes 4K
mpi_usage_error net-under-mpi 2 "(drop --net)" train --transport mpi --net 10gbe "${S[@]}"
mpi_usage_error restarts-without-pipesgdrun 2 "--restarts under --transport mpi: launch with pipesgdrun --restarts R" \
  train --transport mpi --restarts 1 "${S[@]}"
mpi_usage_error bench-net-under-mpi 2 "drop it under --transport mpi" \
  bench allreduce --transport mpi --net 10gbe --sizes 4K
mpi_usage_error calibrate-one-rank 1 "calibrate needs at least 2 ranks" calibrate --transport mpi --sizes 4K
mpi_usage_error servers-leave-no-worker 2 "--servers 2 leaves no worker among the 2 MPI ranks" \
  train --transport mpi --algo pssync --servers 2 "${S[@]}"
mpi_usage_error servers-workers-mismatch 3 "minus 1 server(s)" train --transport mpi --algo pssync --workers 3 "${S[@]}"
mpi_usage_error servers-compare-mix 3 "compare cannot mix parameter-server methods" \
  compare --transport mpi --algos dsync,pssync "${S[@]}"
PIPESGD_MPI_SHARED_MEMORY=yes mpi_usage_error shared-memory-variable 2 \
  "PIPESGD_MPI_SHARED_MEMORY must be 0 or 1, got 'yes'" train --transport mpi "${S[@]}"
mpi_usage_error servers-too-many-segments 5 "--servers 4 exceeds the model's 3 parameter segments" \
  train --transport mpi --algo pssync --servers 4 "${S[@]}"

# Without mpirun, and unknown transports (no MPI involved: the plain error contract).
row transport-mpi-without-mpirun 2 "start pipesgd with mpirun" train --transport mpi "${S[@]}"
row bench-transport-mpi-without-mpirun 2 "start pipesgd with mpirun" bench allreduce --transport mpi --sizes 4K
row calibrate-transport-mpi-without-mpirun 2 "start pipesgd with mpirun" calibrate --transport mpi --sizes 4K
row transport-unknown 2 "--transport 'carrier-pigeon': expected local or mpi" \
  train --transport carrier-pigeon "${S[@]}"
row bench-transport-unknown 2 "expected local or mpi" bench allreduce --transport carrier-pigeon --sizes 4K

# ---------------------------------------------------------------------------------------------------
# 5./6. A rank that dies (SIGKILL) or hangs (SIGSTOP) during training.
#
# Each rank's wrapper starts pipesgd in the background (output to DIR/rank<R>.{out,err}), records its
# id, waits for it and appends "rank R exit E TIME" to DIR/status. Rank 1's wrapper first waits until
# rank 0 has printed its header (MPI is up: a rank that dies inside MPI_Init leaves the others stuck
# in MPI_Init, where no --comm-timeout applies), lets it train for 2 s, signals it and writes the
# time to DIR/signalled. With --enable-recovery mpirun lets the survivors run on (and itself exits 0
# whatever the ranks did: hence the wrappers' own records).
# shellcheck disable=SC2016  # expanded by each rank's sh
FAILURE_WRAPPER='
D=$1 BIN=$2 SIG=$3 T=$4 PIDS=$5 R=$OMPI_COMM_WORLD_RANK
"$BIN" train --transport mpi --algo dsync --iters 100000 --comm-timeout "$T" --data synthetic \
  --quiet --no-eval >"$D/rank$R.out" 2>"$D/rank$R.err" &
P=$!
echo "$P $('"$START_FIELD"')" >>"$PIDS"
echo "$P" >"$D/rank$R.pid"
if [ "$R" = 1 ]; then
  i=0
  until grep -q "^pipesgd train:" "$D/rank0.out" 2>/dev/null || [ $i -ge 600 ]; do
    i=$((i + 1))
    sleep 0.1
  done
  sleep 2
  kill -"$SIG" "$P"
  date +%s.%N >"$D/signalled"
fi
wait "$P"
E=$?
echo "rank $R exit $E $(date +%s.%N)" >>"$D/status"
exit $E'

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# failure_run NAME SIGNAL COMM_TIMEOUT [mpirun options]: 3 ranks, rank 1 gets SIGNAL. For STOP, once
# both survivors have exited (or after 60 s), rank 1 is resumed (SIGCONT; DIR/resumed) and given
# COMM_TIMEOUT + 10 s to exit by itself before it is killed (DIR/killed-by-test).
failure_run() {
  local name=$1 sig=$2 t=$3
  shift 3
  local d=$R/$name
  mkdir -p "$d"
  local start
  start=$(now)
  (ulimit -v "$MEMORY_LIMIT_KB" 2>/dev/null
   exec timeout -k 5 120 mpirun -np 3 --oversubscribe "$@" \
     sh -c "$FAILURE_WRAPPER" sh "$d" "$BIN" "$sig" "$t" "$PIDS") >"$d/mpirun.out" 2>"$d/mpirun.err" &
  local mpirun_pid=$!
  BACKGROUND=$mpirun_pid
  if [ "$sig" = STOP ]; then
    local i=0
    until [ "$(grep -c '^rank [02] exit' "$d/status" 2>/dev/null)" = 2 ] || [ $i -ge 600 ] ||
          ! kill -0 "$mpirun_pid" 2>/dev/null; do
      i=$((i + 1))
      sleep 0.1
    done
    local victim
    victim=$(cat "$d/rank1.pid" 2>/dev/null)
    if [ -n "$victim" ] && is_running_pipesgd "$victim"; then
      now >"$d/resumed"
      kill -CONT "$victim"
      i=0
      while is_running_pipesgd "$victim" && [ $i -lt $(((t + 10) * 10)) ]; do
        i=$((i + 1))
        sleep 0.1
      done
      if is_running_pipesgd "$victim"; then
        touch "$d/killed-by-test"
        kill -KILL "$victim"
      fi
    fi
  fi
  wait "$mpirun_pid"
  echo $? >"$d/mpirun.rc"
  BACKGROUND=
  now >"$d/mpirun.end"
  echo "$start" >"$d/mpirun.start"
}

# Checks of a failure run: check_failure NAME SIGNAL COMM_TIMEOUT. The messages seen (3 ranks, ring
# allreduce, rank 1 gone; rank 0 sends to rank 1 and receives from rank 2, rank 2 receives from 1):
#   rank 2: ring allreduce: recv from rank 1 (tag gradients:142 step 0 segment 0) on rank 2 timed out after 5 s
#   rank 0: ring allreduce: send to rank 1 (tag gradients:149 step 1 segment 0) on rank 0 timed out after 5 s
#   rank 0: ring allreduce: send to rank 1 (...) on rank 0 aborted: rank 2 failed: ring allreduce: recv from rank 1 (...) on rank 2 timed out after 5 s
#   rank 0: ring allreduce: recv from rank 2 (tag gradients:151 step 1 segment 0) on rank 0 timed out after 5 s
# The last: rank 0 waits on rank 2 (alive, itself stuck on rank 1) with the same timeout, and both
# expire before rank 2's failure notice lands. The race also runs the other way (seen in CI, 3
# ranks on 2 cores): rank 0's wait on rank 2 expires first, and rank 2, still waiting on rank 1,
# ends with "recv from rank 1 (...) on rank 2 aborted: rank 0 failed: ... recv from rank 2 ...
# timed out". So a survivor's line names rank 1, or rank 2's failure (which names rank 1), or times
# out on the other survivor; at least one survivor's own wait (timed out, or aborted by the other's
# failure) is a wait on rank 1: the dead rank is always named. The tag is a gradients tag, or a control tag if the signal lands at the end of
# an epoch (160 iterations here). Other stderr lines may only be OpenMPI's own ("[host:pid] ...",
# e.g. "Read -1, expected 262144, errno = 3": shared-memory reads from the dead process).
check_failure() {
  local name=$1 sig=$2 t=$3
  local d=$R/$name
  pycheck "$name/mpirun-ends-in-time" "$d" <<'EOF'
import sys
d = sys.argv[1]
rc = int(open(d + "/mpirun.rc").read())
took = float(open(d + "/mpirun.end").read()) - float(open(d + "/mpirun.start").read())
assert rc not in (124, 137), f"mpirun stopped by the test's timeout (exit {rc}) after {took:.0f} s"
assert took < 60, f"mpirun took {took:.0f} s (limit 60 s)"
EOF
  pycheck "$name/survivors-exit-1-after-the-timeout" "$d" "$t" <<'EOF'
import sys
d, t = sys.argv[1], float(sys.argv[2])
try:
    signalled = float(open(d + "/signalled").read())
except OSError:
    sys.exit("rank 1 was never signalled")
status = {}
for line in open(d + "/status"):
    _, rank, _, code, when = line.split()
    status[int(rank)] = (int(code), float(when))
problems = []
for rank in (0, 2):
    if rank not in status:
        problems.append(f"rank {rank} did not exit (no status)")
        continue
    code, when = status[rank]
    after = when - signalled
    if code != 1:
        problems.append(f"rank {rank} exit {code}, expected 1")
    if not (t - 1 <= after <= t + 15):
        problems.append(f"rank {rank} exited {after:.1f} s after the signal, expected {t:g} s + [-1, 15]")
assert not problems, "; ".join(problems)
EOF
  pycheck "$name/error-lines" "$d" "$t" "$CRASH_PATTERN" <<'EOF'
import re, sys
d, t, crash = sys.argv[1], sys.argv[2], sys.argv[3]
clause = (r"(?P<op>[a-z-]+ allreduce): (?:send to|recv from) rank (?P<peer>\d) "
          r"\(tag (?:gradients|control):\d+ step \d+ segment \d+\) on rank (?P<me>\d) ")
timed_out = f"timed out after {t} s"
def is_timeout(how):  # the trainer adds where the worker was: " (worker R at iteration T)"
    return re.fullmatch(re.escape(timed_out) + r"( \(worker \d+ at iteration \d+\))?", how) is not None
problems, own_waits_on_1 = [], 0
for rank, other in ((0, 2), (2, 0)):
    text = open(f"{d}/rank{rank}.err").read()
    lines = text.splitlines()
    errors = [l for l in lines if l.startswith("pipesgd: error:")]
    foreign = [l for l in lines if not l.startswith("pipesgd: error:") and not re.match(r"\[[^]]+\] ", l)]
    if re.search(crash, text):
        problems.append(f"rank {rank}: crash or stack trace in stderr")
    if foreign:
        problems.append(f"rank {rank}: unexpected stderr lines {foreign[:3]}")
    if len(errors) != 1:
        problems.append(f"rank {rank}: {len(errors)} 'pipesgd: error:' lines, expected 1: {errors[:3]}")
        continue
    line = errors[0]
    m = re.fullmatch(f"pipesgd: error: rank {rank}: {clause}(?P<how>.*)", line)
    if not m or int(m["me"]) != rank:
        problems.append(f"rank {rank}: line not 'rank {rank}: <op> allreduce: send to|recv from rank P "
                        f"(tag ...) on rank {rank} ...': {line!r}")
        continue
    peer, how = int(m["peer"]), m["how"]
    if peer == 1:
        own_waits_on_1 += 1
    if is_timeout(how) and peer == 1:
        pass
    elif is_timeout(how) and peer == other:
        pass  # the race described above
    elif how.startswith(f"aborted: rank {other} failed: "):
        reason = how[len(f"aborted: rank {other} failed: "):]
        r = re.fullmatch(clause + "(?P<how>.*)", reason)
        if not (r and int(r["me"]) == other and int(r["peer"]) in (1, rank) and is_timeout(r["how"])):
            problems.append(f"rank {rank}: rank {other}'s failure is not a wait on rank 1 or {rank} "
                            f"that {timed_out}: {line!r}")
    else:
        problems.append(f"rank {rank}: neither '{timed_out}' on rank 1 or {other} nor "
                        f"'aborted: rank {other} failed: ...': {line!r}")
if not problems and own_waits_on_1 == 0:
    problems.append("no survivor's own wait (timed out or aborted) is a wait on rank 1")
assert not problems, " | ".join(problems)
EOF
}

# 5. SIGKILL with --enable-recovery: the survivors' --comm-timeout (5 s) ends the run.
failure_run kill KILL 5 --enable-recovery
check_failure kill KILL 5
pycheck "kill/victim-status" "$R/kill/status" <<'EOF'
import sys
lines = [l.split() for l in open(sys.argv[1])]
codes = [int(l[3]) for l in lines if l[1] == "1"]
assert codes == [137], f"rank 1 exit statuses {codes}, expected [137] (SIGKILL)"
EOF

# Without --enable-recovery mpirun ends the whole job as soon as a rank dies (long before the 60 s
# --comm-timeout).
failure_run kill-without-recovery KILL 60
d=$R/kill-without-recovery
rc=$(cat "$d/mpirun.rc")
if [ -f "$d/signalled" ]; then
  took=$(elapsed "$(cat "$d/signalled")" "$(cat "$d/mpirun.end")")
else
  took=never-signalled
fi
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$took" != never-signalled ] &&
   awk -v s="$took" 'BEGIN { exit !(s < 20) }'; then
  pass "kill-without-recovery/mpirun-aborts-the-job"
else
  fail "kill-without-recovery/mpirun-aborts-the-job" \
    "mpirun exit $rc, ended $took s after the kill (expected non-zero, < 20 s) [$(excerpt "$d/mpirun.err" 300)]"
fi

# 6. SIGSTOP (a hung rank): the survivors time out after 3 s; resumed, rank 1 exits by itself.
failure_run stop STOP 3 --enable-recovery
check_failure stop STOP 3
pycheck "stop/resumed-rank-exits-by-itself" "$R/stop" <<'EOF'
import os, re, sys
d = sys.argv[1]
assert os.path.exists(d + "/resumed"), "rank 1 was not stopped when the survivors had exited"
assert not os.path.exists(d + "/killed-by-test"), "rank 1 still ran 13 s after SIGCONT (killed by the test)"
resumed = float(open(d + "/resumed").read())
ends = [l.split() for l in open(d + "/status") if l.split()[1] == "1"]
assert len(ends) == 1, f"rank 1 status lines: {ends}"
code, when = int(ends[0][3]), float(ends[0][4])
assert code == 1, f"rank 1 exit {code}, expected 1"
errors = [l for l in open(d + "/rank1.err").read().splitlines() if l.startswith("pipesgd: error:")]
assert len(errors) == 1 and re.match(r"pipesgd: error: rank 1: [a-z-]+ allreduce: .*(aborted: rank [02] failed|timed out after 3 s)", errors[0]), \
    f"rank 1's error lines: {errors}"
EOF

# ---------------------------------------------------------------------------------------------------
# 7. bench allreduce and calibrate under MPI (2 ranks).
mpi_run 2 -- bench allreduce --transport mpi --sizes 4K,64K --repeats 3 --codecs none,int8 \
  --out "$R/mpi-bench" >"$R/mpi-bench.out" 2>"$R/mpi-bench.err"
expect_success "bench/mpi-exit-0" $? "$R/mpi-bench.out" "$R/mpi-bench.err"
# The algorithms are whatever the build offers (at least these four), each with codecs none and int8,
# plus per size one MPI_Allreduce row and one auto row per codec.
pycheck "bench/mpi-table" "$R/mpi-bench.out" <<'EOF'
import re, sys
lines = open(sys.argv[1]).read().splitlines()
heading = [l for l in lines if l.startswith("algorithm ")]
assert len(heading) == 1 and "vs MPI" in heading[0], f"table headings {heading}"
rows = [l.split() for l in lines if re.match(r"([a-zA-Z_-]+|auto \([a-z-]+\)) +(none|int8) +\d+ ", l)]
algorithms = {r[0] for r in rows} - {"MPI_Allreduce", "auto"}
assert algorithms >= {"ring", "recursive-doubling", "halving-doubling", "tree"}, f"algorithms {sorted(algorithms)}"
expected = 2 * (1 + 2 * len(algorithms) + 2)
assert len(rows) == expected, f"{len(rows)} table rows, expected {expected} for algorithms {sorted(algorithms)}"
assert all(r[-1] == "ok" for r in rows), f"checks not ok: {[r for r in rows if r[-1] != 'ok'][:2]}"
mpi = [r for r in rows if r[0] == "MPI_Allreduce"]
assert len(mpi) == 2 and all(r[-2] == "1.00x" for r in mpi), f"MPI_Allreduce rows {mpi}"
assert all(re.fullmatch(r"\d+\.\d\dx", r[-2]) for r in rows), f"'vs MPI' column: {[r[-2] for r in rows]}"
EOF
pycheck "bench/mpi-allreduce.json" "$R/mpi-bench/allreduce.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
mpi = [r for r in rows if r.get("algorithm") == "MPI_Allreduce"]
assert sorted(r["bytes"] for r in mpi) == [4096, 65536], f"MPI_Allreduce rows: {mpi}"
assert all(r["codec"] == "none" and r["busbw_vs_mpi_allreduce"] == 1 for r in mpi), f"MPI_Allreduce rows: {mpi}"
for r in rows:
    assert r.get("ranks") == 2 and r.get("correct") is True, f"row {r}"
    assert r.get("busbw_vs_mpi_allreduce", 0) > 0, f"no busbw_vs_mpi_allreduce in {r}"
algorithms = {r["algorithm"] for r in rows} - {"MPI_Allreduce", "auto"}
expected = 2 * (1 + 2 * len(algorithms) + 2)
assert len(rows) == expected, f"{len(rows)} rows, expected {expected} for algorithms {sorted(algorithms)}"
EOF

# --out is a directory: calibration.json goes into it.
F=$R/mpi-calibration/calibration.json
mpi_run 2 -- calibrate --transport mpi --sizes 4K,64K,1M --repeats 3 --out "$R/mpi-calibration" \
  >"$R/mpi-calibrate.out" 2>"$R/mpi-calibrate.err"
expect_success "calibrate/mpi-exit-0" $? "$R/mpi-calibrate.out" "$R/mpi-calibrate.err"
pycheck "calibrate/mpi-file" "$F" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
assert c.get("transport") == "mpi" and c.get("world_size") == 2, f"transport {c.get('transport')!r}, world_size {c.get('world_size')!r}"
measured = set(c.get("measured", {}))
assert measured >= {"halving-doubling", "recursive-doubling", "ring", "tree"}, f"measured {sorted(measured)}"
samples = c.get("samples", [])
assert len(samples) == 3 * len(measured), f"{len(samples)} samples, expected {len(measured)} algorithms x 3 sizes"
assert {s["algorithm"] for s in samples} == measured, f"sampled {sorted({s['algorithm'] for s in samples})}"
EOF
run train --allreduce auto --calibration "$F" --workers 2 --iters 5 --data synthetic --quiet --no-eval \
  >"$R/calibrated-local.out" 2>"$R/calibrated-local.err"
expect_success "calibrate/file-loads-in-local-train" $? "$R/calibrated-local.out" "$R/calibrated-local.err"
mpi_run 2 -- train --transport mpi --allreduce auto --calibration "$F" --iters 5 --data synthetic --quiet \
  --no-eval >"$R/calibrated-mpi.out" 2>"$R/calibrated-mpi.err"
expect_success "calibrate/file-loads-in-mpi-train" $? "$R/calibrated-mpi.out" "$R/calibrated-mpi.err"
head -c 200 "$F" >"$R/calibration-truncated.json"
row calibration-truncated 1,2 "$R/calibration-truncated.json" \
  train --allreduce auto --calibration "$R/calibration-truncated.json" --workers 2 "${S[@]}"

# ---------------------------------------------------------------------------------------------------
# Nothing may be left running (the exit trap would kill it, but that must not be needed).
for _ in $(seq 1 50); do
  [ -z "$(leftover_pipesgd)" ] && break
  sleep 0.1
done
left=$(leftover_pipesgd | tr '\n' ' ')
if [ -z "$left" ]; then
  pass "cleanup/no-pipesgd-left"
else
  fail "cleanup/no-pipesgd-left" "still running: $left"
fi

# ---------------------------------------------------------------------------------------------------
# Further rows, one file per topic, sourced in name order (each uses $R, run, row, pycheck, ...).
for rows_file in "$(dirname "${BASH_SOURCE[0]}")"/mpi_rows/*.sh; do
  [ -e "$rows_file" ] || continue
  # shellcheck disable=SC1090
  . "$rows_file"
done

cli_test_finish
