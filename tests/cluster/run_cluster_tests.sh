#!/usr/bin/env bash
# End-to-end tests on a real small cluster on this machine (scripts/local-cluster.sh): hosts as
# network namespaces with their own host names and shaped links, ranks started by mpirun through the
# cluster's remote agent, MPI over real TCP between hosts.
#
#   tests/cluster/run_cluster_tests.sh path/to/pipesgd
#
# Prints one line per check (`ok <name>` or `FAIL <name>: why`) and, last, one summary line
# `N passed, M failed`; exits 0 only if nothing failed. Where this machine cannot host the cluster
# (not root, no network namespaces, no mpirun) it prints `skipped: <reason>` and exits 77 (ctest:
# skipped). It brings the cluster up (3 hosts, 1gbit) and takes it down at the end, whatever happens;
# ctest runs it alone (RESOURCE_LOCK local_cluster).
#
# CLUSTER_TESTS=faults runs only the fault runs, each FAULT_REPEATS times (default 1), for the counts
# in docs/results.md: FAULT_REPEATS=20 CLUSTER_TESTS=faults tests/cluster/run_cluster_tests.sh build/pipesgd
set -u

# shellcheck source=../cli/cli_test_lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../cli/cli_test_lib.sh"
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER=$ROOT/scripts/local-cluster.sh

skip() {
  echo "skipped: $1"
  exit 77
}
[ "$(id -u)" -eq 0 ] || skip "not root: the local cluster needs root (network namespaces, links)"
command -v ip >/dev/null && command -v tc >/dev/null || skip "iproute2 (ip, tc) not installed"
command -v mpirun >/dev/null || skip "mpirun not found"
unshare --net true 2>/dev/null || skip "network namespaces are not permitted here (unshare --net failed)"

ONLY=${CLUSTER_TESTS:-all}
REPEATS=${FAULT_REPEATS:-1}
case $ONLY in all|faults) ;; *) echo "CLUSTER_TESTS must be all or faults, not '$ONLY'" >&2; exit 2 ;; esac
cli_test_setup pipesgd-cluster-tests "$@"
PIPESGDRUN=$(dirname "$BIN")/python/bin/pipesgdrun  # the build tree's launcher (its package has the extension)
R=$TMP/runs
mkdir -p "$R"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cli_test_cleanup() {
  "$CLUSTER" down >/dev/null 2>&1
}
trap 'exit 130' INT
trap 'exit 143' TERM

# ---------------------------------------------------------------------------------------------------
# 1. The cluster itself: bad arguments are one line (exit 2); up is idempotent; down leaves nothing.

# one_line_error NAME EXPECTED ARGS...: local-cluster.sh ARGS fails (exit 2) with exactly one stderr line
# containing EXPECTED and nothing on stdout.
one_line_error() {
  local name=$1 expected=$2
  shift 2
  "$CLUSTER" "$@" >"$R/$name.out" 2>"$R/$name.err"
  local rc=$? lines
  lines=$(wc -l <"$R/$name.err")
  if [ "$rc" -eq 2 ] && [ "$lines" -eq 1 ] && [ ! -s "$R/$name.out" ] && grep -qF -- "$expected" "$R/$name.err"; then
    pass "cluster/bad-arguments/$name"
  else
    fail "cluster/bad-arguments/$name" "exit $rc, $lines stderr line(s): $(head -c 300 "$R/$name.err")"
  fi
}
if [ "$ONLY" = all ]; then
one_line_error zero-hosts "--hosts must be a whole number from 1 to 32, not '0'" up --hosts 0
one_line_error many-hosts "--hosts must be a whole number from 1 to 32, not '99'" up --hosts 99
one_line_error bad-rate "--rate must be a tc rate such as 1gbit, 10gbit or 500mbit, not 'fast'" up --rate fast
one_line_error unknown-command "unknown command 'start'" start
one_line_error unknown-option "up: unknown argument '--size'" up --size 3
one_line_error no-such-host "no host 'h9' in the local cluster" link h9 down
# Not root: refused in one line (a copy of the script where another user can read it).
if command -v setpriv >/dev/null; then
  nobody_dir=$(mktemp -d /tmp/pipesgd-cluster-nobody.XXXXXX)
  chmod 755 "$nobody_dir"
  cp "$CLUSTER" "$nobody_dir/local-cluster.sh"
  chmod 755 "$nobody_dir/local-cluster.sh"
  setpriv --reuid=65534 --regid=65534 --clear-groups "$nobody_dir/local-cluster.sh" up --hosts 2 \
    >"$R/not-root.out" 2>"$R/not-root.err"
  rc=$?
  rm -rf "$nobody_dir"
  if [ $rc -eq 2 ] && [ "$(wc -l <"$R/not-root.err")" -eq 1 ] && [ ! -s "$R/not-root.out" ] &&
     grep -qx "local-cluster: must run as root (it makes network namespaces, links and /etc/hosts entries)" "$R/not-root.err"; then
    pass "cluster/bad-arguments/not-root"
  else
    fail "cluster/bad-arguments/not-root" "exit $rc: $(head -c 300 "$R/not-root.err")"
  fi
fi
fi

# What exists of the cluster: namespaces, links, bridge, /etc/hosts lines (one word per thing).
cluster_things() {
  {
    ip netns list | awk '{ print "netns:" $1 }' | grep '^netns:pipesgd-'
    ip -o link show | awk -F': ' '{ print "link:" $2 }' | sed 's/@.*//' | grep '^link:pipesgd-'
    grep -c 'pipesgd local-cluster\|^10\.88\.0\.' /etc/hosts | sed 's/^/hosts-lines:/'
  } | sort
}
"$CLUSTER" down >/dev/null 2>&1  # a cluster left by an interrupted run
before=$(cluster_things)
"$CLUSTER" up --hosts 3 --rate 1gbit >"$R/up1.out" 2>&1
rc1=$?
first=$(cluster_things)
[ "$ONLY" = all ] && "$CLUSTER" up --hosts 3 --rate 1gbit >"$R/up2.out" 2>&1
rc2=$?
second=$(cluster_things)
[ $rc1 -eq 0 ] || cli_test_abort "local-cluster.sh up failed: $(tail -3 "$R/up1.out")"
if [ "$ONLY" = all ]; then
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ "$first" = "$second" ] && grep -q "(0 made, 3 kept, 0 removed)" "$R/up2.out" &&
   [ "$(grep -c '^10\.88\.0\.1[1-3] h[1-3]$' /etc/hosts)" -eq 3 ] &&
   [ "$(grep -c '^netns:' <<<"$first")" -eq 3 ]; then
  pass "cluster/up-twice-is-one-cluster"
else
  fail "cluster/up-twice-is-one-cluster" "exit $rc1/$rc2 [$(tr '\n' ' ' <<<"$first")] vs [$(tr '\n' ' ' <<<"$second")] $(tail -1 "$R/up2.out")"
fi
"$CLUSTER" up --hosts 2 >"$R/up-shrink.out" 2>&1 && "$CLUSTER" up --hosts 3 >"$R/up-grow.out" 2>&1
if grep -q "(0 made, 2 kept, 1 removed)" "$R/up-shrink.out" && grep -q "(1 made, 2 kept, 0 removed)" "$R/up-grow.out" &&
   [ "$(cluster_things)" = "$first" ]; then
  pass "cluster/up-resizes"
else
  fail "cluster/up-resizes" "$(tail -1 "$R/up-shrink.out") | $(tail -1 "$R/up-grow.out")"
fi
"$CLUSTER" exec h2 hostname >"$R/hostname.out" 2>&1
"$CLUSTER" exec h2 ip -4 -o addr show dev eth0 >"$R/address.out" 2>&1
"$CLUSTER" exec h3 ip route >"$R/route.out" 2>&1
if [ "$(cat "$R/hostname.out")" = h2 ] && grep -q "inet 10.88.0.12/24" "$R/address.out" &&
   [ "$(grep -c . "$R/route.out")" -eq 1 ] && grep -q "^10.88.0.0/24 dev eth0" "$R/route.out"; then
  pass "cluster/a-host-has-its-name-address-and-only-the-bridge-route"
else
  fail "cluster/a-host-has-its-name-address-and-only-the-bridge-route" \
    "$(cat "$R/hostname.out") | $(cat "$R/address.out") | $(tr '\n' ';' <"$R/route.out")"
fi
# The agent plays ssh's part: a session killed under it (the host killed) ends the agent with a line
# naming the host and exit 255, as ssh's "Connection to h2 closed by remote host."; a command's own
# status passes through.
AGENT=$(dirname "$CLUSTER")/local-cluster-agent.sh
"$AGENT" -x h2 sleep 60 >"$R/agent-killed.out" 2>"$R/agent-killed.err" &
agent_pid=$!
for _ in $(seq 1 50); do [ -n "$(ip netns pids pipesgd-h2)" ] && break; sleep 0.1; done
"$CLUSTER" kill h2 >/dev/null 2>&1
wait $agent_pid
rc_killed=$?
"$AGENT" h2 'exit 3' >/dev/null 2>"$R/agent-exit3.err"
rc_exit3=$?
if [ $rc_killed -eq 255 ] && [ $rc_exit3 -eq 3 ] && [ ! -s "$R/agent-exit3.err" ] &&
   grep -qx "local-cluster-agent: connection to host h2 closed (its session was killed by signal 9)" "$R/agent-killed.err"; then
  pass "cluster/agent-names-a-host-whose-session-was-killed"
else
  fail "cluster/agent-names-a-host-whose-session-was-killed" \
    "exit $rc_killed (killed), $rc_exit3 (exit 3): $(head -c 300 "$R/agent-killed.err") $(head -c 200 "$R/agent-exit3.err")"
fi

fi  # ONLY = all

# ---------------------------------------------------------------------------------------------------
# 2. Training across hosts: the start-up line names each peer's route, and the weights are those of
# the same run as threads.
eval "$("$CLUSTER" env)"
# cluster_run NAME TIMEOUT HOSTS -- pipesgd ARGS: mpirun of one rank per listed slot into the cluster.
cluster_run() {
  local name=$1 limit=$2 hosts=$3
  shift 4
  local np
  np=$(tr ',' '\n' <<<"$hosts" | awk -F: '{ n += $2 } END { print n }')
  timeout -k 5 "$limit" mpirun -np "$np" -H "$hosts" "$BIN" "$@" >"$R/$name.out" 2>"$R/$name.err"
}

if [ "$ONLY" = all ]; then
cluster_run route 60 h1:2,h2:1 -- train --transport mpi --algo dsync --iters 3 --data synthetic --no-eval
expect_success "route/exit-0" $? "$R/route.out" "$R/route.err"
expect_contains "route/start-up-line-names-each-peer" "$R/route.out" \
  "the 2 ranks of this host through shared memory; 2 hosts; rank 0 on h1 reaches rank 1 on h1 through shared memory, rank 2 on h2 through MPI over TCP)"

E=(--iters 30 --quiet --no-eval)  # Fashion-MNIST (the default data)
checksum_equal() {  # NAME DIR_A DIR_B
  pycheck "$1" "$2/summary.json" "$3/summary.json" <<'EOF'
import json, sys
a, b = (json.load(open(path)) for path in sys.argv[1:3])
ca, cb = a.get("weights_checksum"), b.get("weights_checksum")
assert ca and cb, f"weights_checksum missing: {ca!r}, {cb!r}"
assert ca == cb, f"weights_checksum {ca} (threads) != {cb} (hosts)"
assert a.get("iterations") == b.get("iterations") == 30, f"iterations {a.get('iterations')}, {b.get('iterations')}"
EOF
}
# across_hosts NAME HOSTS WORKERS [--servers S] METHOD ARGS: threads vs one rank per host.
across_hosts() {
  local name=$1 hosts=$2 workers=$3
  shift 3
  local servers=()
  if [ "$1" = --servers ]; then
    servers=(--servers "$2")
    shift 2
  fi
  run train --workers "$workers" "${servers[@]}" "$@" "${E[@]}" --out "$R/threads-$name" \
    >"$R/threads-$name.out" 2>"$R/threads-$name.err"
  expect_success "weights/$name-threads-exit-0" $? "$R/threads-$name.out" "$R/threads-$name.err"
  cluster_run "hosts-$name" 120 "$hosts" -- train --transport mpi "${servers[@]}" "$@" "${E[@]}" --out "$R/hosts-$name"
  expect_success "weights/$name-hosts-exit-0" $? "$R/hosts-$name.out" "$R/hosts-$name.err"
  checksum_equal "weights/$name-across-hosts-equals-threads" "$R/threads-$name" "$R/hosts-$name"
}
# MG-WFBP plans from measured times, which differ between runs, and with 3 ranks another plan sums
# in another order: its allreduce cost comes from a calibration file instead, one whose start-up
# cost (0.5 s) makes Algorithm 1 merge every layer whatever backward measures. (It still profiles,
# plans and probes over the run's transport.)
for n in 2 3; do
  printf '{"format": "pipesgd-allreduce-calibration/1", "transport": "local none", "world_size": %d, "link": {"alpha": 0.5, "beta": 1e-9, "gamma": 0.0}, "measured": {"ring": {"a": 0.5, "b": 1e-9}}}\n' \
    "$n" >"$R/startup-cost-$n.json"
done
for method in "dsync" "pipe" "pipe+int8" "mgwfbp --profile-iters 4 --calibration $R/startup-cost-N.json" \
              "sapipe+wp3 --stale-layers 2 --buckets wfbp"; do
  read -r algo options <<<"$method"
  # shellcheck disable=SC2086  # options are words
  across_hosts "$algo-2-hosts" h1:1,h2:1 2 --algo "$algo" ${options//-N.json/-2.json}
  # shellcheck disable=SC2086
  across_hosts "$algo-3-hosts" h1:1,h2:1,h3:1 3 --algo "$algo" ${options//-N.json/-3.json}
done
pycheck "weights/mgwfbp-3-hosts-plan" "$R/hosts-mgwfbp-3-hosts/summary.json" <<'EOF'
import json, sys
plan = json.load(open(sys.argv[1])).get("bucket_plan")
assert plan == "mgwfbp: 1 bucket: [2..0]", f"bucket_plan {plan!r}"
EOF
# OD-SGD with its server on a host of its own (the last rank serves: h3).
across_hosts odsgd-server-own-host h1:1,h2:1,h3:1 2 --servers 1 --algo odsgd --warmup-iters 10 --local-updater dcasgd-c
expect_contains "weights/odsgd-server-own-host-route" "$R/hosts-odsgd-server-own-host.out" \
  "3 hosts; rank 0 on h1 reaches rank 1 on h2 through MPI over TCP, rank 2 on h3 through MPI over TCP"

# pipesgdrun across hosts, unchanged: each rank on its own host, local rank 0 on each.
timeout -k 5 120 "$PIPESGDRUN" -np 2 -H h1:1,h2:1 /usr/bin/python3 -c '
import socket, pipesgd.torch as hvd
hvd.init()
print(f"rank {hvd.rank()} of {hvd.size()} on {socket.gethostname()} local {hvd.local_rank()}/{hvd.local_size()}", flush=True)
' >"$R/pipesgdrun.out" 2>"$R/pipesgdrun.err"
rc=$?
# (mpirun forwards each rank's output as it comes: one rank's line may end after the other's began.)
if [ $rc -eq 0 ] && grep -qF "rank 0 of 2 on h1 local 0/1" "$R/pipesgdrun.out" &&
   grep -qF "rank 1 of 2 on h2 local 0/1" "$R/pipesgdrun.out"; then
  pass "pipesgdrun/across-hosts"
else
  fail "pipesgdrun/across-hosts" "exit $rc: $(head -c 300 "$R/pipesgdrun.out") $(head -c 300 "$R/pipesgdrun.err")"
fi

fi  # ONLY = all

# ---------------------------------------------------------------------------------------------------
# 3. Faults a real network has, on 3 hosts of one rank each (rank R on host h(R+1)), D-Sync training
# with checkpoints every 20 iterations and --comm-timeout T. Each run ends, every survivor with one
# error line naming what it waited for, and the newest complete checkpoint set resumes.
T=4
FAULT_ITERS=1000  # far beyond iteration 40, where the fault comes; a resumed run finishes them
# fault_run NAME FAULT...: starts training, and once rank 0 has written the checkpoint set of
# iteration 40 applies `local-cluster.sh FAULT h2 ...` to h2 (rank 1). Records the fault's time
# (DIR/fault), mpirun's exit status and end, what is left running in the hosts 1 s later (DIR/left),
# and each rank's stderr in DIR/rankR.err (written by the rank: OpenMPI forwards nothing of a rank it
# is killing). The test's own time limit says so in mpirun.err (timeout --verbose: "timeout: sending
# signal ..."): mpirun's exit status alone cannot, since mpirun exits 137 itself when it learns that
# a rank was killed by SIGKILL.
# shellcheck disable=SC2016  # expanded by each rank's sh
RANK_STDERR='d=$1; shift; exec "$@" 2>"$d/rank$OMPI_COMM_WORLD_RANK.err"'
fault_run() {
  local name=$1
  shift
  local d=$R/$name
  mkdir -p "$d"
  timeout --verbose -k 5 120 mpirun -np 3 -H h1:1,h2:1,h3:1 sh -c "$RANK_STDERR" sh "$d" \
    "$BIN" train --transport mpi --algo dsync --iters "$FAULT_ITERS" --comm-timeout "$T" --data synthetic --no-eval \
    --checkpoint-dir "$d/ck" --checkpoint-every 20 >"$d/mpirun.out" 2>"$d/mpirun.err" &
  local mpirun_pid=$! i=0
  until [ -f "$d/ck/checkpoint-000000000040-rank0.psgd" ] || [ $i -ge 600 ] || ! kill -0 $mpirun_pid 2>/dev/null; do
    i=$((i + 1))
    sleep 0.1
  done
  date +%s.%N >"$d/fault"
  "$CLUSTER" "$1" h2 "${@:2}" >"$d/fault.out" 2>&1
  wait $mpirun_pid
  echo $? >"$d/mpirun.rc"
  date +%s.%N >"$d/end"
  # Every process of the hosts ends by itself (a partitioned rank at its own --comm-timeout): wait
  # for that up to T + 15 s after the fault, then record what is left.
  local limit
  limit=$(awk -v f="$(cat "$d/fault")" -v t="$T" 'BEGIN { printf "%.3f", f + t + 15 }')
  while [ -n "$(for host in h1 h2 h3; do ip netns pids "pipesgd-$host"; done)" ] &&
        awk -v now="$(date +%s.%N)" -v l="$limit" 'BEGIN { exit !(now < l) }'; do
    sleep 0.2
  done
  for host in h1 h2 h3; do ip netns pids "pipesgd-$host"; done >"$d/left"
  # What they are and where they wait, for the failure's message.
  local pid
  for pid in $(cat "$d/left"); do ps -o pid=,stat=,wchan:24=,etime=,args= -p "$pid"; done >"$d/left.ps" 2>/dev/null
}

# check_fault NAME DEAD_RANK LOWER_BOUND: the checks of a fault run.
check_fault() {
  local name=$1 dead=$2 lower=$3
  local d=$R/$name
  pycheck "$name/ends-without-leftovers" "$d" "$lower" <<'EOF'
import os, sys
d, lower = sys.argv[1], float(sys.argv[2])
rc = int(open(d + "/mpirun.rc").read())
took = float(open(d + "/end").read()) - float(open(d + "/fault").read())
left = open(d + "/left").read().split()
problems = []
if rc == 0:
    problems.append("mpirun exit 0 (expected the job to fail)")
if "timeout: sending signal" in open(d + "/mpirun.err").read():
    problems.append(f"mpirun stopped by the test's time limit (exit {rc})")
if took < lower:
    problems.append(f"ended {took:.1f} s after the fault, before {lower:g} s")
if left:
    problems.append(f"processes left in the hosts' namespaces: {left} ({open(d + '/left.ps').read()[:250]!r})")
if problems:  # each rank's last line says where it was (the checks below read them whole)
    for r in range(3):
        lines = open(f"{d}/rank{r}.err").read().splitlines() if os.path.exists(f"{d}/rank{r}.err") else ["(none)"]
        problems.append(f"rank {r} last: {(lines or [''])[-1][:150]!r}")
assert not problems, "; ".join(problems)
EOF
  pycheck "$name/error-lines-name-the-lost-rank" "$d" "$dead" "$T" "$CRASH_PATTERN" <<'EOF'
import re, sys
d, dead, t, crash = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
wait = r"ring allreduce: (?:send to|recv from) rank (?P<peer>\d) \(tag gradients:\d+ step \d+ segment \d+\) on rank (?P<me>\d) "
ends = (rf"timed out after {t} s(?: \(worker \d at iteration \d+\))?",
        r"aborted: the launcher is ending the job \(SIGTERM while this wait was blocked\)")
def parse(text, rank):
    """The waits a line names, its own first: [(me, peer), ...], or None if it is no documented line."""
    m = re.fullmatch(wait + r"(?P<how>.*)", text)
    if not m or int(m["me"]) != rank:
        return None
    how = m["how"]
    if any(re.fullmatch(e, how) for e in ends):
        return [(rank, int(m["peer"]))]
    f = re.fullmatch(r"aborted: rank (?P<other>\d) failed: (?P<reason>.*)", how)
    if f:
        inner = parse(f["reason"], int(f["other"]))
        return None if inner is None else [(rank, int(m["peer"]))] + inner
    return None
problems, named = [], set()
survivors = [r for r in (0, 1, 2) if r != dead] if dead >= 0 else [0, 1, 2]
for rank in survivors:
    text = open(f"{d}/rank{rank}.err").read()
    if re.search(crash, text):
        problems.append(f"rank {rank}: crash or stack trace")
    lines = [l for l in text.splitlines() if l.startswith("pipesgd: error:")]
    if len(lines) != 1:
        problems.append(f"rank {rank}: {len(lines)} error lines, expected 1: {lines[:3]}")
        continue
    m = re.fullmatch(rf"pipesgd: error: rank {rank}: (?P<rest>.*)", lines[0])
    waits = parse(m["rest"], rank) if m else None
    if waits is None:
        problems.append(f"rank {rank}: not a documented line: {lines[0]!r}")
        continue
    named |= {peer for _, peer in waits}
target = dead if dead >= 0 else 1
if not problems and target not in named:
    problems.append(f"no line names a wait on rank {target} (named: {sorted(named)})")
assert not problems, " | ".join(problems)
EOF
  # The newest complete checkpoint set (all three ranks' parts) resumes and the run finishes (once
  # per kind of fault).
  [[ $name =~ -[0-9]+$ ]] && return
  cluster_run "$name-resume" 120 h1:1,h2:1,h3:1 -- train --transport mpi --algo dsync --iters "$FAULT_ITERS" \
    --comm-timeout "$T" --data synthetic --no-eval --quiet --checkpoint-dir "$d/ck" --checkpoint-every 20 --resume
  expect_success "$name/newest-checkpoint-resumes" $? "$R/$name-resume.out" "$R/$name-resume.err"
}
# mpirun_names_the_host NAME: mpirun's output says the job ended for h2: mpirun lost h2's daemon
# ("Remote daemon: ... on node h2"), h2's daemon reported its rank killed ("process rank 1 with PID
# ... on node h2 exited on signal 9"), or h2's agent ended first (OpenMPI's "ORTE was unable to
# reliably start one or more daemons", naming no host, after the agent's "local-cluster-agent:
# connection to host h2 closed", as ssh's "Connection to h2 closed by remote host."). When the
# daemon's report and its loss cross, OpenMPI records the job as aborted by a signal (exit 137) with
# no process to name (its help text orterun:proc-aborted-signal-unknown), and names no host: accepted
# with that exit status only. Anything else fails with what mpirun said.
mpirun_names_the_host() {
  pycheck "$1/mpirun-names-the-host" "$R/$1" <<'EOF'
import sys
d = sys.argv[1]
said = " ".join(open(d + "/mpirun.err").read().split())  # OpenMPI's help texts break lines anywhere
rc = int(open(d + "/mpirun.rc").read())
unnamed = "noticed that the job aborted by signal, but has no info as to the process that caused that situation"
agent = "local-cluster-agent: connection to host h2 closed"
assert "on node h2" in said or agent in said or (rc == 137 and unnamed in said), f"exit {rc}, mpirun said: {said[:300]!r}"
EOF
}

# A partition: h2's link goes down. The cluster's agent (ssh's part) gives up on h2 after 2 s, mpirun
# ends the job, and the survivors, blocked on rank 1, say so before they go; h2's rank ends at its own
# timeout.
for i in $(seq 1 "$REPEATS"); do
  suffix=$([ "$i" = 1 ] || echo "-$i")
  fault_run "partition$suffix" link down
  "$CLUSTER" link h2 up >/dev/null
  check_fault "partition$suffix" 1 0
  expect_contains "partition$suffix/the-agent-names-the-host" "$R/partition$suffix/mpirun.err" "local-cluster-agent: lost host h2"
  if [ "$i" = 1 ]; then
    fault_run straggler rate 200kbit
    "$CLUSTER" rate h2 1gbit >/dev/null
    check_fault straggler -1 $((T - 1))
  fi
  fault_run "host-kill$suffix" kill
  check_fault "host-kill$suffix" 1 0
  mpirun_names_the_host "host-kill$suffix"
done

# commit_written DIR ITERATION RANKS: whether every part of the commit of ITERATION in DIR exists
# (shared and rank0..RANKS-1; each is renamed into place whole, so present means written). The
# shared part alone is not the commit: the other ranks may still be writing theirs, and a host lost
# then rolls back to the commit before.
commit_written() {
  local name r
  name=$1/checkpoint-$(printf %012d "$2")
  [ -f "$name-shared.psgd" ] || return 1
  for ((r = 0; r < $3; r++)); do [ -f "$name-rank$r.psgd" ] || return 1; done
}

# wait_until PID TEST...: returns once `TEST...` succeeds, at most 2 minutes, or once the job PID
# ended.
wait_until() {
  local pid=$1 i=0
  shift
  until "$@" || [ $i -ge 1200 ] || ! kill -0 "$pid" 2>/dev/null; do
    i=$((i + 1))
    sleep 0.1
  done
}

# A whole host killed under pipesgdrun --restarts 1 (train/elastic.h): Open MPI ends the job,
# pipesgdrun relaunches it on the same hosts (h2's namespace is still there, its processes gone),
# every rank resumes from the newest commit, and the run ends with the weights of the same run as
# threads, its summary recording the failed launch.
PIPESGDRUN=$(dirname "$BIN")/python/bin/pipesgdrun
K=(train --algo pipe --iters 200 --data synthetic --no-eval --quiet)
run "${K[@]}" --workers 3 --out "$R/threads-restart" >"$R/threads-restart.out" 2>"$R/threads-restart.err"
expect_success "host-kill-restart/threads-exit-0" $? "$R/threads-restart.out" "$R/threads-restart.err"
d=$R/host-kill-restart
mkdir -p "$d"
timeout -k 5 300 "$PIPESGDRUN" --restarts 1 -np 3 -H h1:1,h2:1,h3:1 "$BIN" "${K[@]}" --transport mpi \
  --comm-timeout "$T" --checkpoint-dir "$d/ck" --checkpoint-every 20 --out "$d/out" >"$d/run.out" 2>"$d/run.err" &
run_pid=$!
wait_until $run_pid commit_written "$d/ck" 60 3
"$CLUSTER" kill h2 >"$d/kill.out" 2>&1
wait $run_pid
rc=$?
expect_success "host-kill-restart/exit-0" $rc "$d/run.out" "$d/run.err"
expect_contains "host-kill-restart/relaunched" "$d/run.err" "relaunching it (restart 1 of 1)"
pycheck "host-kill-restart/resumed-exactly" "$R/threads-restart/summary.json" "$d/out/summary.json" <<'EOF'
import json, sys
a, b = (json.load(open(path)) for path in sys.argv[1:3])
assert a["weights_checksum"] == b["weights_checksum"], (a["weights_checksum"], b["weights_checksum"])
r = b["recoveries"]
assert r["count"] == 1, r
f = r["failures"][0]
assert f["rolled_back_to"] >= 60 and f["rolled_back_to"] % 20 == 0, f
assert "exit status" in f["failure"], f
EOF

# partition_h2_when PID TEST...: once `TEST...` succeeds (wait_until), cuts h2's link (a partition:
# h2 stops answering), waits for the job PID (a child of this shell), restores the link; the job's
# status in $rc, the cut's output in $d/link.out.
partition_h2_when() {
  wait_until "$@"
  "$CLUSTER" link h2 down >"$d/link.out" 2>&1
  wait "$1"
  rc=$?
  "$CLUSTER" link h2 up >/dev/null 2>&1
}

# A host lost under pipesgdrun --restarts 1 --min-np 2 with a Python hvd.elastic script: h2's link
# goes down at step 60; mpirun ends the job, pipesgdrun finds h2 silent and relaunches on h1 and h3,
# saying so, and the script resumes from its commit at the new size and finishes.
cat >"$R/elastic_shrink.py" <<'EOF'
import os, sys, time
import torch
import pipesgd.torch as hvd
hvd.init()
torch.manual_seed(1)
model = torch.nn.Linear(8, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                     named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model, optimizer, step=0)
marker = sys.argv[1]

@hvd.elastic.run
def train(state):
    if hvd.rank() == 0:
        print(f"WORLD size={hvd.size()} from step {state.step}", flush=True)
    while state.step < 160:
        x = torch.randn(16, 8)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
        state.step += 1
        state.commit()
        if state.step == 60 and hvd.rank() == 0 and hvd.size() == 3:
            open(marker, "w").close()
        time.sleep(0.02)

train(state)
if hvd.rank() == 0:
    print(f"DONE size={hvd.size()} step={state.step}", flush=True)
EOF
d=$R/min-np
mkdir -p "$d"
PIPESGD_ELASTIC_DIR="$d/commits" PIPESGD_TIMEOUT=$T timeout -k 5 300 "$PIPESGDRUN" --restarts 1 --min-np 2 -np 3 \
  -H h1:1,h2:1,h3:1 /usr/bin/python3 "$R/elastic_shrink.py" "$d/marker" >"$d/run.out" 2>"$d/run.err" &
partition_h2_when $! test -f "$d/marker"
expect_success "min-np/exit-0" $rc "$d/run.out" "$d/run.err"
expect_contains "min-np/relaunched-smaller" "$d/run.err" "relaunching it on 2 ranks (h1:1,h3:1; lost: h2) (restart 1 of 1)"
expect_contains "min-np/resumed-at-the-new-size" "$d/run.out" "WORLD size=3 from step 0" "DONE size=2 step=160"
if grep -qE "WORLD size=2 from step ([6-9][0-9]|1[0-5][0-9])" "$d/run.out"; then
  pass "min-np/resumed-from-the-commit"
else
  fail "min-np/resumed-from-the-commit" "$(excerpt "$d/run.out")"
fi

# A host replaced under pipesgdrun --restarts 1 --min-np 2 --host-discovery-script (Horovod's flag):
# the script prints the hosts in a file, h1 and h2 at first; once the job has committed iteration 60
# the file says h1 and h3, then h2 is killed. pipesgdrun runs the script again, finds h1 and h3
# answering and relaunches on them at the same size, saying so; `pipesgd train` resumes from its
# newest commit and ends with the weights of the same run as threads.
run "${K[@]}" --workers 2 --out "$R/threads-replaced" >"$R/threads-replaced.out" 2>"$R/threads-replaced.err"
expect_success "host-replaced/threads-exit-0" $? "$R/threads-replaced.out" "$R/threads-replaced.err"
d=$R/host-replaced
mkdir -p "$d"
printf 'h1\nh2\n' >"$d/hosts"
printf '#!/bin/sh\ncat "%s"\n' "$d/hosts" >"$d/discover.sh"
chmod +x "$d/discover.sh"
timeout -k 5 300 "$PIPESGDRUN" --restarts 1 --min-np 2 -np 2 --host-discovery-script "$d/discover.sh" "$BIN" \
  "${K[@]}" --transport mpi --comm-timeout "$T" --checkpoint-dir "$d/ck" --checkpoint-every 20 --out "$d/out" \
  >"$d/run.out" 2>"$d/run.err" &
run_pid=$!
wait_until $run_pid commit_written "$d/ck" 60 2
printf 'h1\nh3\n' >"$d/hosts"
"$CLUSTER" kill h2 >"$d/kill.out" 2>&1
wait $run_pid
rc=$?
expect_success "host-replaced/exit-0" $rc "$d/run.out" "$d/run.err"
expect_contains "host-replaced/relaunched-on-the-new-host" "$d/run.err" \
  "relaunching it on 2 ranks (h1:1,h3:1; lost: h2; added: h3) (restart 1 of 1)"
# Each launch's start-up line (rank 0's) names where rank 1 ran.
expect_contains "host-replaced/rank-1-on-h2-then-h3" "$d/run.out" \
  "rank 0 on h1 reaches rank 1 on h2 through MPI over TCP" "rank 0 on h1 reaches rank 1 on h3 through MPI over TCP"
pycheck "host-replaced/resumed-exactly" "$R/threads-replaced/summary.json" "$d/out/summary.json" <<'EOF'
import json, sys
a, b = (json.load(open(path)) for path in sys.argv[1:3])
assert a["weights_checksum"] == b["weights_checksum"], (a["weights_checksum"], b["weights_checksum"])
assert b["iterations"] == a["iterations"] == 200, (a["iterations"], b["iterations"])
r = b["recoveries"]
assert r["count"] == 1, r
f = r["failures"][0]
assert f["rolled_back_to"] >= 60 and f["rolled_back_to"] % 20 == 0, f
assert "exit status" in f["failure"], f
EOF

# A host lost under pipesgdrun --restarts 1 --min-np 2 with `pipesgd train` (user guide,
# "Continuing with another number of workers"): pipe on h1, h2 and h3 commits every 20 iterations;
# once it has committed iteration 60, h2's link goes down. pipesgdrun relaunches on h1 and h3, and
# train continues the newest commit of 3 workers, X, with 2, saying so once. The oracle is the same
# among threads: 3 workers crash after X and before the next commit, and --resume --workers 2
# continues X, saying the same and ending with the same weights (MPI and threads are bit-identical).
S=(train --algo pipe --epochs 2 --data synthetic --no-eval --quiet)
d=$R/train-shrinks
mkdir -p "$d"
timeout -k 5 300 "$PIPESGDRUN" --restarts 1 --min-np 2 -np 3 -H h1:1,h2:1,h3:1 "$BIN" "${S[@]}" --transport mpi \
  --comm-timeout "$T" --checkpoint-dir "$d/ck" --checkpoint-every 20 --out "$d/out" >"$d/run.out" 2>"$d/run.err" &
partition_h2_when $! commit_written "$d/ck" 60 3
expect_success "train-shrinks/exit-0" $rc "$d/run.out" "$d/run.err"
expect_contains "train-shrinks/relaunched-smaller" "$d/run.err" "relaunching it on 2 ranks (h1:1,h3:1; lost: h2) (restart 1 of 1)"
grep "^pipesgd: continuing the commit of " "$d/run.err" >"$d/continuing"
x=$(sed -n 's/^pipesgd: continuing the commit of 3 workers after iteration \([0-9][0-9]*\) with 2 workers: .*/\1/p' "$d/continuing")
if [ "$(wc -l <"$d/continuing")" -eq 1 ] && [ -n "$x" ] && [ "$x" -ge 60 ] && [ $((x % 20)) -eq 0 ]; then
  pass "train-shrinks/continues-the-commit-once"
else
  fail "train-shrinks/continues-the-commit-once" "$(wc -l <"$d/continuing") continuing lines: $(excerpt "$d/continuing" 400)"
  x=60  # the oracle still runs, for its own checks
fi
pycheck "train-shrinks/summary" "$d/out/summary.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
assert s["resumed_from_workers"] == 3, s["resumed_from_workers"]
assert abs(s["learning_rate_scale"] - 2 / 3) < 1e-12, s["learning_rate_scale"]
assert s["recoveries"]["count"] == 1, s["recoveries"]
EOF
run "${S[@]}" --workers 3 --checkpoint-dir "$d/threads-ck" --checkpoint-every 20 --comm-timeout 2 \
  --inject-fault rank=1,iter=$((x + 5)),kind=crash >"$d/threads-crash.out" 2>"$d/threads-crash.err"
rc=$?
if [ "$rc" -eq 1 ] && [ -f "$d/threads-ck/checkpoint-$(printf %012d "$x")-shared.psgd" ]; then
  pass "train-shrinks/threads-crash-exits-1-with-the-commit"
else
  fail "train-shrinks/threads-crash-exits-1-with-the-commit" "exit $rc; $(excerpt "$d/threads-crash.err")"
fi
run "${S[@]}" --workers 2 --checkpoint-dir "$d/threads-ck" --checkpoint-every 20 --resume --out "$d/threads-out" \
  >"$d/threads-resumed.out" 2>"$d/threads-resumed.err"
expect_success "train-shrinks/threads-resume-exit-0" $? "$d/threads-resumed.out" "$d/threads-resumed.err"
if [ -s "$d/continuing" ] && grep -qxF -f "$d/continuing" "$d/threads-resumed.err"; then
  pass "train-shrinks/threads-say-the-same"
else
  fail "train-shrinks/threads-say-the-same" "hosts: $(excerpt "$d/continuing" 300) threads: $(excerpt "$d/threads-resumed.err" 300)"
fi
pycheck "train-shrinks/equals-threads" "$d/threads-out/summary.json" "$d/out/summary.json" <<'EOF'
import json, sys
a, b = (json.load(open(path)) for path in sys.argv[1:3])
assert a["weights_checksum"] == b["weights_checksum"], (a["weights_checksum"], b["weights_checksum"])
assert a["iterations"] == b["iterations"], (a["iterations"], b["iterations"])
assert a["resumed_from_iteration"] == b["resumed_from_iteration"], (a["resumed_from_iteration"], b["resumed_from_iteration"])
EOF

# ---------------------------------------------------------------------------------------------------
"$CLUSTER" down >"$R/down.out" 2>&1
rc=$?
after=$(cluster_things)
if [ $rc -eq 0 ] && [ "$after" = "$before" ] && ! grep -q "pipesgd local-cluster" /etc/hosts; then
  pass "cluster/down-leaves-nothing"
else
  fail "cluster/down-leaves-nothing" "exit $rc; left: $(tr '\n' ' ' <<<"$after")"
fi
cli_test_finish
