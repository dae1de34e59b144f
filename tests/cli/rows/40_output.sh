# shellcheck shell=bash
# Output that is never lost or misleading (sourced by run_cli_tests.sh; uses $R, $TMP, run, row,
# pycheck, pass, fail, expect_success, expect_contains):
#  - SIGINT / SIGTERM stop a run at an iteration boundary: exit 128 + signal, one stderr line,
#    summary.json marked interrupted, metrics.jsonl with every completed iteration; compare stops
#    the current method and starts no other;
#  - an --out where nothing can be written fails at the start with one line;
#  - a run crashed and resumed reports what the run never interrupted reports (every summary field
#    that is not a timing) and its metrics.jsonl holds only the iterations it ran.

# interrupted_run NAME SIGNAL SECONDS ARGS...: pipesgd ARGS, sent SIGNAL SECONDS after it has installed
# its handler for SIGNAL (read from /proc, so a loaded machine cannot deliver it before the run starts).
# The signal goes through coreutils timeout, which signals the process and then its process group: the
# second delivery must not count as a second Ctrl-C. Leaves $R/NAME.{out,err,rc}.
interrupted_run() {
  local name=$1 signal=$2 seconds=$3
  shift 3
  (ulimit -v "$MEMORY_LIMIT_KB" 2>/dev/null
   exec timeout -k 30 --preserve-status -s "$signal" 100000 "$BIN" "$@") >"$R/$name.out" 2>"$R/$name.err" &
  local watcher=$! child="" waited=0 stat line parent mask
  local bit=$((1 << ($(kill -l "$signal") - 1)))
  while [ "$waited" -lt 1200 ] && kill -0 "$watcher" 2>/dev/null; do
    if [ -z "$child" ]; then
      for stat in /proc/[0-9]*/stat; do  # fields after the command name: state, parent pid
        line=$(cat "$stat" 2>/dev/null) || continue
        read -r _ parent _ <<<"${line##*) }"
        if [ "$parent" = "$watcher" ]; then child=${stat#/proc/}; child=${child%/stat}; break; fi
      done
    fi
    if [ -n "$child" ]; then
      mask=$(sed -n 's/^SigCgt:[[:space:]]*//p' "/proc/$child/status" 2>/dev/null)
      if [ -n "$mask" ] && [ $((16#$mask & bit)) -ne 0 ]; then break; fi
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  sleep "$seconds"
  kill -s "$signal" "$watcher" 2>/dev/null
  wait "$watcher"
  echo $? >"$R/$name.rc"
}

# check_interrupted NAME SIGNAL EXIT OUT_DIR: the run stopped by SIGNAL exited EXIT with one stderr
# line naming the signal, the iteration and the files; summary.json is marked interrupted at that
# iteration; metrics.jsonl parses and holds the iterations [0, N) in order, with the epoch records.
check_interrupted() {
  local name=$1 signal=$2 want=$3 out=$4
  local rc
  rc=$(cat "$R/$name.rc")
  if [ "$rc" = "$want" ]; then pass "interrupt/$name-exit-$want"; else fail "interrupt/$name-exit-$want" "exit $rc [stderr: $(excerpt "$R/$name.err")]"; fi
  pycheck "interrupt/$name-one-line-summary-metrics" "$R/$name.err" "$out" "$signal" <<'PYEOF'
import json, re, sys
err, out, signal = sys.argv[1:4]
lines = open(err).read().splitlines()
assert len(lines) == 1, f"stderr has {len(lines)} lines: {lines[:3]}"
m = re.fullmatch(rf"pipesgd: interrupted by {signal} after iteration (\d+) of 100000; wrote "
                 rf"{re.escape(out)}/summary\.json \(marked interrupted\) and {re.escape(out)}/metrics\.jsonl", lines[0])
assert m, f"stderr: {lines[0]}"
n = int(m.group(1))
assert n > 0, "interrupted before the first iteration: the run did not start in time"
s = json.load(open(out + "/summary.json"))
assert s["interrupted"] == {"signal": signal, "at_iteration": n, "of_iterations": 100000, "workers_reported": 2}, s["interrupted"]
assert s["iterations"] == n and s["timing_iterations"][1] == n, (s["iterations"], s["timing_iterations"])
assert s["configuration"]["command_line"][1] == "train", s["configuration"]["command_line"]
records = [json.loads(line) for line in open(out + "/metrics.jsonl")]
iterations = [r["iteration"] for r in records if r["type"] == "iteration"]
assert iterations == list(range(n)), f"{len(iterations)} iteration records for {n} iterations"
assert all(r["type"] in ("iteration", "epoch") for r in records), {r["type"] for r in records}
assert all(r["iteration_s"] > 0 for r in records if r["type"] == "iteration"), "an iteration record is not a measurement"
PYEOF
}

L=(--workers 2 --data synthetic --iters 100000 --quiet)  # minutes long: always interrupted
interrupted_run sigint INT 4 train --algo pipe "${L[@]}" --out "$R/sigint"
check_interrupted sigint SIGINT 130 "$R/sigint"
interrupted_run sigterm TERM 4 train --algo dsync "${L[@]}" --out "$R/sigterm"
check_interrupted sigterm SIGTERM 143 "$R/sigterm"

# compare: the method running when the signal comes stops; those after it never start.
interrupted_run compare-sigint INT 5 compare --algos dsync,pipe,sapipe --workers 2 --data synthetic --iters 100000 \
  --quiet --out "$R/compare-sigint"
rc=$(cat "$R/compare-sigint.rc")
if [ "$rc" = 130 ]; then pass "interrupt/compare-exit-130"; else fail "interrupt/compare-exit-130" "exit $rc [stderr: $(excerpt "$R/compare-sigint.err")]"; fi
pycheck "interrupt/compare-stops-and-says-so" "$R/compare-sigint.err" "$R/compare-sigint" <<'PYEOF'
import json, os, re, sys
err, out = sys.argv[1:3]
lines = open(err).read().splitlines()
assert len(lines) == 1, f"stderr has {len(lines)} lines: {lines[:3]}"
m = re.fullmatch(rf"pipesgd: dsync \(method 1 of 3\) interrupted by SIGINT after iteration (\d+) of 100000; the methods "
                 rf"after it did not run; wrote {re.escape(out)}/compare\.json and {re.escape(out)}/1-dsync/summary\.json "
                 rf"\(marked interrupted\)", lines[0])
assert m, f"stderr: {lines[0]}"
n = int(m.group(1))
records = json.load(open(out + "/compare.json"))
assert [r["method"] for r in records] == ["dsync"], [r["method"] for r in records]
assert records[0]["interrupted"]["at_iteration"] == n, records[0]["interrupted"]
assert json.load(open(out + "/1-dsync/summary.json"))["interrupted"]["at_iteration"] == n
assert not os.path.exists(out + "/2-pipe"), "pipe started after the interrupt"
PYEOF

# A signal after the last iteration (here during the final evaluation, which this model makes last
# seconds: its eval-mode forward spins, and runs once per kEvaluationChunkRows (100) rows of the
# synthetic test set) finds the work done: the run completes and writes its results,
# but still exits 130, so that the script that sent the Ctrl-C stops too. The signal goes when the
# progress line of iteration 1 of 2 appears; one that lands before iteration 2 ends stops the run
# there instead (the early-stop rows above), and that attempt is repeated (at most 3 times).
cat >"$TMP/slow_eval.py" <<'PYEOF'
import sys, torch
class SlowEval(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(784, 10)
    def forward(self, x):
        y = self.fc(x.flatten(1))
        if not self.training:
            for _ in range(15000):
                y = y * 1.0
        return y
torch.jit.save(torch.jit.script(SlowEval()), sys.argv[1])
PYEOF
/usr/bin/python3 "$TMP/slow_eval.py" "$TMP/slow-eval.pt" >"$R/slow-eval.log" 2>&1  # TorchScript reads the source file
for attempt in 1 2 3; do
  rm -rf "$R/late-sigint"
  (ulimit -v "$MEMORY_LIMIT_KB" 2>/dev/null
   exec timeout -k 5 120 "$BIN" train --model "$TMP/slow-eval.pt" --data synthetic --iters 2 --workers 2 \
     --out "$R/late-sigint") >"$R/late-sigint.out" 2>"$R/late-sigint.err" &
  late_pid=$!
  for _ in $(seq 1 1200); do
    grep -q "1/2 iterations" "$R/late-sigint.err" 2>/dev/null && break
    kill -0 "$late_pid" 2>/dev/null || break
    sleep 0.05
  done
  kill -INT "$late_pid" 2>/dev/null
  wait "$late_pid"
  echo $? >"$R/late-sigint.rc"
  grep -q "interrupted by SIGINT after iteration 1 of 2" "$R/late-sigint.err" || break
done
rc=$(cat "$R/late-sigint.rc")
if [ "$rc" = 130 ]; then pass "interrupt/after-last-iteration-exit-130"; else fail "interrupt/after-last-iteration-exit-130" "exit $rc [stderr: $(excerpt "$R/late-sigint.err")]"; fi
pycheck "interrupt/after-last-iteration-complete-and-says-so" "$R/late-sigint.err" "$R/late-sigint" <<'PYEOF'
import json, os, sys
err, out = sys.argv[1:3]
last = open(err).read().splitlines()[-1]
assert last == "pipesgd: interrupted by SIGINT after the last iteration: the results above are complete", last
s = json.load(open(out + "/summary.json"))
assert s.get("interrupted") is None and s["iterations"] == 2, (s.get("interrupted"), s["iterations"])
assert s["final_test_accuracy"] is not None, "no final evaluation"
assert os.path.getsize(out + "/model.pt") > 0
PYEOF

# An --out where no file can be created (as root too: /proc takes none) fails before any work.
row out-unwritable-train   2 "--out '/proc': cannot write in it" train --data synthetic --iters 3 --quiet --out /proc
row out-unwritable-compare 2 "--out '/proc': cannot write in it" compare --algos dsync,pipe --data synthetic --iters 3 \
  --quiet --out /proc

# Crashed (--inject-fault) at 37 and resumed from the checkpoint of 30, each method's run reports
# what the same command never interrupted reports: every summary field but the timings (which say
# the iterations they cover), the resume itself and the flags that differ; metrics.jsonl holds a
# resume record and the iterations 30..59, each a measurement, with the uninterrupted run's losses.
resume_matches() {  # NAME ALGO_ARGS...
  local name=$1
  shift
  local A=(train "$@" --data synthetic --iters 60 --checkpoint-every 10 --quiet --no-eval)
  run "${A[@]}" --checkpoint-dir "$R/$name-ck-full" --out "$R/$name-full" >"$R/$name-full.out" 2>"$R/$name-full.err"
  expect_success "resume/$name-uninterrupted-exit-0" $? "$R/$name-full.out" "$R/$name-full.err"
  run "${A[@]}" --checkpoint-dir "$R/$name-ck" --inject-fault rank=1,iter=37,kind=crash --comm-timeout 2 \
    >"$R/$name-crash.out" 2>"$R/$name-crash.err"
  local rc=$?
  if [ "$rc" -eq 1 ]; then pass "resume/$name-crash-exit-1"; else fail "resume/$name-crash-exit-1" "exit $rc"; fi
  run "${A[@]}" --checkpoint-dir "$R/$name-ck" --resume --out "$R/$name-resumed" >"$R/$name-resumed.out" 2>"$R/$name-resumed.err"
  expect_success "resume/$name-resumed-exit-0" $? "$R/$name-resumed.out" "$R/$name-resumed.err"
  pycheck "resume/$name-summary-equals-uninterrupted" "$R/$name-full" "$R/$name-resumed" <<'PYEOF'
import json, sys
full, resumed = sys.argv[1:3]
a, b = (json.load(open(d + "/summary.json")) for d in (full, resumed))
# Timings (they cover other iterations: timing_iterations), and what differs by design.
TIMING = {"compute_s", "other_compute_thread_s", "throughput_samples_per_s", "iteration_s", "train_s",
          "predicted_iteration_s", "predicted_dsync_eq2_s", "predicted_pipe_eq4_s", "measured_iterations",
          "timing_iterations", "non_overlapped_comm_s", "od_sgd_model",
          "scaling_efficiency_eq7", "predicted_pipe_eq5_s", "comm_cpu_ns_per_byte"}
# comm_bytes too: which of a comm thread's allreduces finish within the timed iterations is timing.
MEAN_TIMING = {"update_s", "compensation_s", "data_s", "forward_s", "backward_s", "wait_s", "comm_s", "iteration_s",
               "checkpoint_s", "comm_cpu_s", "comm_bytes"}
# SAPipe's program and timeline run on the measured layer profile: a timing, like the profile itself.
SAPIPE_TIMING = {"cost_a_s", "cost_b_s_per_byte", "predicted_iteration_s", "forward_s", "backward_s",
                 "paper_program_stale_layers", "timeline_stale_layers", "predicted_stall"}
BY_DESIGN = {"resumed_from_iteration"}
differences = []
def compare(x, y, path):
    key = path[-1] if path else None
    if (len(path) == 1 and key in TIMING | BY_DESIGN) or (path[:1] == ["mean"] and key in MEAN_TIMING):
        return
    if path[:1] == ["epochs"] and key == "elapsed_s":
        return
    if path[:1] == ["sapipe"] and (key in SAPIPE_TIMING or key in ("stall_fraction", "cost_scale")):
        return
    if path[:1] == ["configuration"] and (key == "command_line" or path[1:2] == ["reliability"]):
        return
    if isinstance(x, dict) and isinstance(y, dict):
        for k in sorted(set(x) | set(y)):
            compare(x.get(k), y.get(k), path + [k])
    elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        for i, (u, v) in enumerate(zip(x, y)):
            compare(u, v, path + [i])
    elif x != y:
        differences.append(f"{'.'.join(map(str, path))}: {x} vs {y}")
compare(a, b, [])
assert not differences, "; ".join(differences[:6])
assert b["resumed_from_iteration"] == 30 and a["resumed_from_iteration"] == -1
assert a["timing_iterations"][1] == b["timing_iterations"][1] == 60
assert b["timing_iterations"][0] >= 30, f"the resumed run's timings cover {b['timing_iterations']}"
assert b["bytes_sent_per_iteration"] > 0 and b["mean"]["loss"] > 0
records = [json.loads(line) for line in open(resumed + "/metrics.jsonl")]
assert records[0] == {"type": "resume", "from_iteration": 30}, records[0]
steps = [r for r in records[1:] if r["type"] == "iteration"]
assert [r["iteration"] for r in steps] == list(range(30, 60)), [r["iteration"] for r in steps][:5]
assert all(r["iteration_s"] > 0 for r in steps), "an iteration record is not a measurement"
full_loss = {r["iteration"]: r["loss"] for r in map(json.loads, open(full + "/metrics.jsonl")) if r["type"] == "iteration"}
assert all(r["loss"] == full_loss[r["iteration"]] for r in steps), "a resumed iteration's loss differs"
PYEOF
}
resume_matches dsync --algo dsync
resume_matches pipe --algo pipe
# k pinned: --stale-layers auto picks k from measured times, which two runs need not measure alike.
resume_matches sapipe --algo sapipe --stale-layers 1
resume_matches odsgd --algo odsgd --servers 2 --warmup-iters 5
