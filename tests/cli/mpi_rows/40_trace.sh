# shellcheck shell=bash
# --trace under mpirun (sourced by run_mpi_cli_tests.sh; uses mpi_run, S, R, expect_success,
# pycheck): every rank records its own and rank 0 writes one file, each rank's clock aligned with
# rank 0's, so that the two halves of one ring allreduce (which neither rank can finish alone)
# overlap in time on the merged timeline; parameter servers get a process of their own.
d=$R/mpi-trace
mkdir -p "$d"
mpi_run 2 -- train --transport mpi --algo pipe --data synthetic --iters 30 --quiet --no-eval --trace "$d/pipe.json" \
  >"$d/pipe.out" 2>"$d/pipe.err"
expect_success "trace/mpi-pipe-exit-0" $? "$d/pipe.out" "$d/pipe.err"
pycheck "trace/mpi-one-file-clocks-aligned" "$d/pipe.json" <<'PYEOF'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
if processes != {0: "worker 0", 1: "worker 1"}: print("processes", processes)
spans = {}
for e in events:
    if e["ph"] == "X" and e["name"] == "allreduce":
        spans.setdefault(e["args"]["iteration"], {})[e["pid"]] = (e["ts"], e["ts"] + e["dur"])
both = [t for t, by in spans.items() if len(by) == 2]
if len(both) < 20: print("allreduces on both ranks", len(both))
apart = [t for t in both if spans[t][0][1] < spans[t][1][0] or spans[t][1][1] < spans[t][0][0]]
if apart: print("allreduces of one iteration that do not overlap across ranks:", apart[:5])
PYEOF

mpi_run 3 -- train --transport mpi --algo pssync --servers 1 --workers 2 --data synthetic --iters 10 --quiet --no-eval \
  --trace "$d/ps.json" >"$d/ps.out" 2>"$d/ps.err"
expect_success "trace/mpi-pssync-exit-0" $? "$d/ps.out" "$d/ps.err"
pycheck "trace/mpi-server-has-a-process" "$d/ps.json" <<'PYEOF'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
if processes != {0: "worker 0", 1: "worker 1", 2: "server 0"}: print("processes", processes)
pushes = [e for e in events if e["ph"] == "X" and e["pid"] == 2 and e["name"] == "push"]
if len(pushes) != 20: print("server pushes", len(pushes))
PYEOF
