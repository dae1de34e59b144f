# shellcheck shell=bash
# Ctrl-C under mpirun (sourced by run_mpi_cli_tests.sh; uses $R, $BIN, $PIDS, $RANK_WRAPPER,
# $MEMORY_LIMIT_KB, leftover_pipesgd, pycheck, pass, fail). mpirun answers SIGINT with SIGTERM to
# every rank (and SIGKILL 1 s later); each rank stops at its next iteration boundary, or in a wait
# when another rank that stopped tells it so; none hangs. Rank 0 writes summary.json marked
# interrupted with its own times (the ranks stopped separately: nothing more can be gathered) and
# metrics.jsonl with every iteration it completed, and prints one line.
d=$R/mpi-interrupt
mkdir -p "$d"
(ulimit -v "$MEMORY_LIMIT_KB" 2>/dev/null
 exec timeout -k 5 120 mpirun -np 3 --oversubscribe sh -c "$RANK_WRAPPER" sh "$PIDS" "" "$BIN" \
   train --transport mpi --algo pipe --data synthetic --iters 100000 --quiet --no-eval --out "$d/out") \
  >"$d/mpirun.out" 2>"$d/mpirun.err" &
timeout_pid=$!
BACKGROUND=$timeout_pid
i=0
until [ "$(cat "$d/out/metrics.jsonl" 2>/dev/null | wc -l)" -ge 20 ] || [ $i -ge 600 ] || ! kill -0 "$timeout_pid" 2>/dev/null; do
  i=$((i + 1))
  sleep 0.1
done
# Ctrl-C as a terminal sends it: SIGINT to mpirun itself. (Not through timeout(1), which follows
# the signal with SIGCONT, after which mpirun may kill the ranks at once instead of SIGTERM first.)
mpirun_pid=$(pgrep -P "$timeout_pid" -x mpirun)
[ -n "$mpirun_pid" ] && kill -INT "$mpirun_pid"
wait "$timeout_pid"
echo $? >"$d/mpirun.rc"
BACKGROUND=
pycheck "interrupt/mpi-rank0-writes-what-it-completed" "$d/mpirun.err" "$d/out" <<'PYEOF'
import json, re, sys
err, out = sys.argv[1:3]
lines = [l for l in open(err).read().splitlines() if l.startswith("pipesgd:")]
assert len(lines) == 1, f"pipesgd lines on stderr: {lines[:3]}"
m = re.fullmatch(r"pipesgd: interrupted by SIG(INT|TERM) after iteration (\d+) of 100000; wrote "
                 rf"{re.escape(out)}/summary\.json \(marked interrupted\) and {re.escape(out)}/metrics\.jsonl "
                 r"\(rank 0's times: the ranks stopped separately\)", lines[0])
assert m, f"stderr: {lines[0]}"
n = int(m.group(2))
s = json.load(open(out + "/summary.json"))
assert s["interrupted"]["at_iteration"] == n and s["interrupted"]["workers_reported"] == 1, s["interrupted"]
assert s["iterations"] == n, s["iterations"]
assert s["configuration"]["versions"]["mpi"].startswith("Open MPI"), s["configuration"]["versions"]
iterations = [r["iteration"] for r in map(json.loads, open(out + "/metrics.jsonl")) if r["type"] == "iteration"]
assert iterations == list(range(n)), f"{len(iterations)} iteration records for {n} iterations"
PYEOF
i=0
while [ -n "$(leftover_pipesgd)" ] && [ $i -lt 100 ]; do
  i=$((i + 1))
  sleep 0.1
done
left=$(leftover_pipesgd | tr '\n' ' ')
if [ -z "$left" ]; then pass "interrupt/mpi-no-rank-left"; else fail "interrupt/mpi-no-rank-left" "still running: $left"; fi
