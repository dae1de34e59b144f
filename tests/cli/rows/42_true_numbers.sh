# shellcheck shell=bash
# Every number and claim at the end of a run is true (sourced by run_cli_tests.sh; uses $R, $TMP,
# $FX, run, pycheck, pass, fail, expect_success, expect_contains, interrupted_run from 40_output.sh):
#  - the timing-model sentence claims the run follows its model only with measured / predicted
#    within 15%, and says the ratio either way;
#  - a run interrupted before it measured anything prints and writes no figures and no accuracy
#    (null in summary.json and compare.json, "interrupted" in compare's row), never zeros;
#  - --iters ending inside an epoch says so, never "epoch N/M done";
#  - report's "compute" is train's "compute" (the compute thread's busy time);
#  - pipe with momentum >= 0.5 warns once at start-up; dsync, sapipe and small momenta do not.

# 1. The timing-model sentence against the table's own measured / predicted of the model it names.
run train --algo pipe --workers 2 --data synthetic --iters 40 --quiet --no-eval >"$R/tn-model.out" 2>"$R/tn-model.err"
expect_success "true-numbers/model-exit-0" $? "$R/tn-model.out" "$R/tn-model.err"
pycheck "true-numbers/model-sentence-matches-ratio" "$R/tn-model.out" <<'PY'
import re, sys
out = open(sys.argv[1]).read()
m = re.search(r"This method's timing model is (Eq\. [24]); (the run follows it: measured (\d+\.\d\d)x its prediction "
              r"\(within 15%\)|the run does not follow it: measured (\d+\.\d\d)x the Eq\. [24] prediction "
              r"\(more than 15% off\))\.", out)
assert m, "no timing-model sentence: " + out[-600:]
assert "This method follows" not in out
name, follows = m.group(1), m.group(3) is not None
ratio = float(m.group(3) or m.group(4))
row = re.search(r"^" + re.escape(name) + r" \(.*\)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", out, re.M)
assert row, f"no {name} row"
table_ratio = float(row.group(3))
assert abs(table_ratio - ratio) < 0.006, (table_ratio, ratio)
assert follows == (0.85 <= table_ratio <= 1.15), (follows, table_ratio)
PY

# 2. Interrupted before any measured iteration (an emulated 5 Mbit/s link: each iteration takes
# longer than half a second, and the means start at iteration 10).
SLOW=(--workers 2 --data synthetic --iters 100000 --net bw=5Mbit --quiet)
interrupted_run tn-train-int INT 2 train --algo pipe "${SLOW[@]}" --out "$R/tn-train-int"
pycheck "true-numbers/interrupted-train-says-nothing-unmeasured" "$R/tn-train-int.out" "$R/tn-train-int" <<'PY'
import json, sys
out = open(sys.argv[1]).read()
s = json.load(open(sys.argv[2] + "/summary.json"))
assert s["interrupted"] and s["measured_iterations"] == 0, (s["interrupted"], s["measured_iterations"])
assert "Final train accuracy" not in out and "0.00%" not in out, out[-500:]
assert "Accuracy: not measured (interrupted before the first epoch ended)." in out, out[-500:]
assert "No timings: the run stopped after" in out and "samples/s" not in out, out[-800:]
for key in ("final_train_accuracy", "final_test_accuracy", "throughput_samples_per_s", "iteration_s", "mean",
            "compute_s", "predicted_iteration_s"):
    assert s[key] is None, (key, s[key])
PY
interrupted_run tn-compare-int INT 2 compare --algos dsync,pipe "${SLOW[@]}" --out "$R/tn-compare-int"
pycheck "true-numbers/interrupted-compare-no-fake-zeros" "$R/tn-compare-int.out" "$R/tn-compare-int" <<'PY'
import json, re, sys
out = open(sys.argv[1]).read()
rows = [line for line in out.splitlines() if line.startswith("dsync ")]
assert len(rows) == 1 and "interrupted" in rows[0], rows
assert not re.search(r"\b0\.00x|\b0\.000\b|\s0\s", rows[0]), rows[0]
assert "before its first measured iteration: no" in " ".join(out.split()), out[-500:]
records = json.load(open(sys.argv[2] + "/compare.json"))
assert [r["method"] for r in records] == ["dsync"], records
r = records[0]
for key in ("throughput_samples_per_s", "iteration_s", "speedup", "breakdown", "final_train_accuracy",
            "predicted_iteration_s", "compute_s"):
    assert r[key] is None, (key, r[key])
PY

# 3. --iters ending inside an epoch: 30 of the 240 iterations of synthetic's epoch (12000 / 2 x 25).
run train --algo dsync --workers 2 --data synthetic --iters 30 >"$R/tn-iters.out" 2>"$R/tn-iters.err"
expect_success "true-numbers/iters-exit-0" $? "$R/tn-iters.out" "$R/tn-iters.err"
if grep -qE "epoch [0-9]+/[0-9]+ done" "$R/tn-iters.err"; then
  fail "true-numbers/iters-no-epoch-done" "$(grep -E 'done' "$R/tn-iters.err" | head -1)"
else
  expect_contains "true-numbers/iters-no-epoch-done" "$R/tn-iters.err" "stopped after 30 iterations (--iters), 13% of epoch 1: "
fi

# 4. One run's "compute": the terminal's and the report page's.
run train --algo pipe --workers 2 --data-dir "$FX/good" --batch 10 --iters 30 --quiet --out "$R/tn-compute" \
  >"$R/tn-compute.out" 2>"$R/tn-compute.err"
expect_success "true-numbers/compute-train-exit-0" $? "$R/tn-compute.out" "$R/tn-compute.err"
run report "$R/tn-compute" >"$R/tn-compute-report.out" 2>"$R/tn-compute-report.err"
expect_success "true-numbers/compute-report-exit-0" $? "$R/tn-compute-report.out" "$R/tn-compute-report.err"
pycheck "true-numbers/compute-same-in-report" "$R/tn-compute.out" "$R/tn-compute/report.html" <<'PY'
import re, sys
out = open(sys.argv[1]).read()
html = open(sys.argv[2], encoding="utf-8").read()
lines = out.splitlines()
head = next(i for i, line in enumerate(lines) if line.startswith("per iteration (ms)"))
columns = re.split(r"\s{2,}", lines[head].strip())
values = re.split(r"\s{2,}", lines[head + 2].strip())
terminal = values[columns.index("compute")]
header = re.findall(r"<th>(.*?)</th>", re.search(r"<tr><th>method</th>.*?</tr>", html, re.S).group(0))
cells = re.findall(r"<td>(.*?)</td>", re.search(r"<tr><td>pipe</td>.*?</tr>", html, re.S).group(0))
assert "computation ms" not in header, header
page = cells[header.index("compute ms")]
assert page == terminal, f"report compute {page} ms, terminal compute {terminal} ms"
PY

# 5. The stale-momentum warning: once per stale method, at start-up, only where it applies.
WARN="pipesgd: warning: pipe+int8 applies gradients 1 step stale (K = 2) and momentum 0.9 amplifies them: expect lower accuracy"
run train --algo pipe+int8 --momentum 0.9 --data synthetic --iters 3 --quiet --no-eval >"$R/tn-mom.out" 2>"$R/tn-mom.err"
expect_success "true-numbers/momentum-exit-0" $? "$R/tn-mom.out" "$R/tn-mom.err"
if [ "$(wc -l <"$R/tn-mom.err")" -eq 1 ] && grep -qF "$WARN" "$R/tn-mom.err" &&
   grep -qF "use sapipe, momentum <= 0.3, or dsync" "$R/tn-mom.err"; then
  pass "true-numbers/momentum-warns-once"
else
  fail "true-numbers/momentum-warns-once" "stderr: $(excerpt "$R/tn-mom.err")"
fi
run compare --algos dsync,pipe+int8 --momentum 0.9 --data synthetic --iters 3 --quiet --no-eval \
  >"$R/tn-mom-compare.out" 2>"$R/tn-mom-compare.err"
expect_success "true-numbers/momentum-compare-exit-0" $? "$R/tn-mom-compare.out" "$R/tn-mom-compare.err"
if [ "$(grep -c "stale" "$R/tn-mom-compare.err")" -eq 1 ] && grep -qF "$WARN" "$R/tn-mom-compare.err"; then
  pass "true-numbers/momentum-compare-warns-once"
else
  fail "true-numbers/momentum-compare-warns-once" "stderr: $(excerpt "$R/tn-mom-compare.err")"
fi
quiet_ok=1
for args in "--algo dsync --momentum 0.9" "--algo pipe --momentum 0.3" "--algo pipe --staleness-k 1 --momentum 0.9"; do
  # shellcheck disable=SC2086
  run train $args --data synthetic --iters 3 --quiet --no-eval >"$R/tn-mom-none.out" 2>"$R/tn-mom-none.err" || quiet_ok=0
  if [ -s "$R/tn-mom-none.err" ]; then quiet_ok=0; echo "  ($args: $(excerpt "$R/tn-mom-none.err"))"; fi
done
if [ $quiet_ok -eq 1 ]; then pass "true-numbers/momentum-no-warning-elsewhere"; else fail "true-numbers/momentum-no-warning-elsewhere" "a warning or a failure"; fi
