# shellcheck shell=bash
# --trace FILE / --trace-iters (sourced by run_cli_tests.sh; uses $R, $TMP, run, row, pycheck, pass,
# fail, expect_success): usage errors at the start; a comparison's one file with a process per method
# and worker that Perfetto's JSON importer takes (traceEvents with ph/ts/pid/tid, flows paired); a
# window; a crashed run's trace written up to the crash with the failure in it.
TQ=(--data synthetic --quiet --no-eval)
row trace-iters-without-trace 2 "--trace-iters needs --trace FILE" train --iters 3 --trace-iters 1:2 "${TQ[@]}"
row trace-iters-malformed 2 "--trace-iters '5': expected A:B" train --iters 3 --trace "$TMP/t.json" --trace-iters 5 "${TQ[@]}"
row trace-iters-empty 2 "--trace-iters '4:4': the window is empty" train --iters 3 --trace "$TMP/t.json" --trace-iters 4:4 "${TQ[@]}"
: >"$TMP/trace-not-a-directory"
row trace-directory-is-a-file 2 "--trace" train --iters 3 --trace "$TMP/trace-not-a-directory/t.json" "${TQ[@]}"

d=$R/trace
mkdir -p "$d"
run compare --algos dsync,pipe+int8,wfbp --workers 2 --net 10gbe --iters 30 --trace "$d/cmp.json" --out "$d/cmp" \
  "${TQ[@]}" >"$d/cmp.out" 2>"$d/cmp.err"
expect_success "trace/compare-exit-0" $? "$d/cmp.out" "$d/cmp.err"
pycheck "trace/compare-one-file-every-method" "$d/cmp.json" "$d/cmp.out" <<'PYEOF'
import json, sys
path, out = sys.argv[1:3]
events = json.load(open(path))["traceEvents"]
processes = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
want = {f"{m}: worker {w}" for m in ("dsync", "pipe+int8", "wfbp") for w in (0, 1)}
if set(processes.values()) != want: print("processes", sorted(processes.values()))
for e in events:
    if e["ph"] in "XisfM" and not {"ph", "pid"} <= e.keys(): print("malformed", e); break
    if e["ph"] == "X" and (e["dur"] < 0 or "ts" not in e): print("bad span", e); break
allreduces = [e for e in events if e["ph"] == "X" and e["name"] == "allreduce"]
codecs = {processes[e["pid"]].split(":")[0]: e["args"].get("codec") for e in allreduces}
if codecs != {"dsync": "none", "pipe+int8": "int8", "wfbp": "none"}: print("codecs", codecs)
if any(e["args"].get("bytes", 0) <= 0 or e["args"].get("algorithm") != "ring" for e in allreduces): print("allreduce args")
starts = sorted(e["id"] for e in events if e["ph"] == "s")
ends = sorted(e["id"] for e in events if e["ph"] == "f")
if not starts or starts != ends: print("flows", len(starts), len(ends))
if f"wrote {path}" not in open(out).read(): print("no 'wrote' line")
PYEOF

run train --algo pipe --workers 2 --iters 20 --trace "$d/window.json" --trace-iters 5:8 "${TQ[@]}" \
  >"$d/window.out" 2>"$d/window.err"
expect_success "trace/window-exit-0" $? "$d/window.out" "$d/window.err"
pycheck "trace/window-keeps-its-iterations" "$d/window.json" <<'PYEOF'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
seen = {e["args"]["iteration"] for e in events if e["ph"] in "Xi"}
if seen != {5, 6, 7}: print("iterations", sorted(seen))
PYEOF

# Worker 1 crashes at iteration 6: the others time out; the trace is written up to the failure.
run train --algo pipe --workers 2 --iters 20 --inject-fault rank=1,iter=6,kind=crash --comm-timeout 2 \
  --trace "$d/crash.json" "${TQ[@]}" >"$d/crash.out" 2>"$d/crash.err"
rc=$?
if [ "$rc" -eq 1 ]; then pass "trace/crash-exit-1"; else fail "trace/crash-exit-1" "exit $rc [stderr: $(excerpt "$d/crash.err")]"; fi
pycheck "trace/crash-written-up-to-the-failure" "$d/crash.json" "$d/crash.out" <<'PYEOF'
import json, sys
trace = json.load(open(sys.argv[1]))
failure = trace["otherData"].get("failure", "")
if "at iteration" not in failure: print("failure", failure)
events = trace["traceEvents"]
faults = [e for e in events if e["ph"] == "i" and e["name"] == "injected fault"]
if len(faults) != 1 or faults[0]["args"]["iteration"] != 6: print("fault instants", faults)
# Worker 0 goes on until it waits for the gradient of iteration 6 (pipe, K = 2: in iteration 8).
last = max(e["args"]["iteration"] for e in events if e["ph"] == "X" and e["name"] == "forward")
if not 5 <= last <= 8: print("last forward", last)
if "up to where it stopped" not in open(sys.argv[2]).read(): print("no line on stdout")
PYEOF
