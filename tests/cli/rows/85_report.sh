# shellcheck shell=bash
# `pipesgd report` and compare's time to accuracy (sourced by run_cli_tests.sh; uses $R, $TMP, $FX,
# run, row, pycheck, pass, fail, expect_success, expect_contains, check_error_contract,
# help_lists_flags):
#  - bad input: one stderr line, exit 2 (a directory that is not an --out directory, a bad
#    --target-accuracy) or 1 (a malformed file, gnuplot missing or failing);
#  - compare prints "time to X% test" and compare.json records the target and each method's time to
#    it: the elapsed_s of the first epoch at or above it (the default target: the best test accuracy
#    every method reached; --target-accuracy replaces it);
#  - report writes one self-contained page: 6 inline SVG plots (4 and "not evaluated" without
#    accuracy), the table with the time to the target, no script, no other file.

REPORT_RUN=(--workers 2 --data-dir "$FX/good" --batch 10 --quiet)  # 10 iterations an epoch (200 examples)

# report_row_with_path NAME PATH EXIT FRAGMENT ARGS...: as `row`, with PATH replaced.
report_row_with_path() {
  local name=$1 path=$2 want=$3 fragment=$4
  shift 4
  local out="$TMP/rows/$name.out" err="$TMP/rows/$name.err"
  (ulimit -v "$MEMORY_LIMIT_KB" 2>/dev/null; exec timeout -k 5 60 env PATH="$path" "$BIN" "$@") >"$out" 2>"$err"
  local rc=$?
  WHY=()
  check_error_contract "$rc" "$want" "$fragment" "$out" "$err"
  if [ ${#WHY[@]} -eq 0 ]; then pass "error/$name"; else fail "error/$name" "$(join_why) [stderr: $(excerpt "$err")]"; fi
}

mkdir -p "$TMP/report-empty" "$TMP/report-broken"
printf '[{"method": ' >"$TMP/report-broken/compare.json"
row report-no-dir            2 "DIR is required"                                   report
row report-missing-dir       2 "report: '$TMP/none': no such directory"            report "$TMP/none"
row report-not-an-out-dir    2 "'$TMP/report-empty' holds neither compare.json"     report "$TMP/report-empty"
row report-malformed-json    1 "compare results '$TMP/report-broken/compare.json': not valid JSON" report "$TMP/report-broken"
row report-target-percent    2 "--target-accuracy must be a fraction in (0, 1], e.g. 0.85 for 85%, got 85" \
  report "$TMP/report-empty" --target-accuracy 85
row report-target-zero       2 "--target-accuracy must be a fraction in (0, 1]"   report "$TMP/report-empty" --target-accuracy 0
row report-target-word       2 "--target-accuracy"                                 report "$TMP/report-empty" --target-accuracy high
row compare-target-percent   2 "--target-accuracy must be a fraction in (0, 1], e.g. 0.85 for 85%, got 85" \
  compare --algos dsync --target-accuracy 85 --data synthetic --iters 3 --quiet
row compare-target-above-one 2 "got 1.5" compare --algos dsync --target-accuracy 1.5 --data synthetic --iters 3 --quiet
help_lists_flags report --out --target-accuracy -- report

# A compare of 3 epochs, each ending with the test accuracy on the fixture's 50 test images.
run compare --algos dsync,pipe --iters 30 "${REPORT_RUN[@]}" --out "$R/report-compare" \
  >"$R/report-compare.out" 2>"$R/report-compare.err"
expect_success "report/compare-exit-0" $? "$R/report-compare.out" "$R/report-compare.err"
expect_contains "report/compare-table-has-time-to-accuracy" "$R/report-compare.out" "time to " "% test"
# TIME_TO_TARGET (python): the time to `target` by the epoch records of summary.json, as compare and
# report take it.
TIME_TO_TARGET='
import json, os, sys
def runs(directory):
    records = json.load(open(os.path.join(directory, "compare.json")))
    return [(r, json.load(open(os.path.join(directory, str(i + 1) + "-" + r["method"], "summary.json"))))
            for i, r in enumerate(records)]
def time_to(summary, target):
    for e in summary["epochs"]:
        if e["test_accuracy"] >= 0 and e["test_accuracy"] >= target:
            return e["elapsed_s"]
    return None
'
pycheck "report/compare-json-time-to-default-target" "$R/report-compare" <<EOF
$TIME_TO_TARGET
pairs = runs(sys.argv[1])
assert [len(s["epochs"]) for _, s in pairs] == [3, 3], [len(s["epochs"]) for _, s in pairs]
best = min(max(e["test_accuracy"] for e in s["epochs"]) for _, s in pairs)
for record, summary in pairs:
    assert record["target_accuracy"] == {"accuracy": best, "of": "test", "given": False}, record["target_accuracy"]
    expected = time_to(summary, best)
    assert expected is not None and record["time_to_target_accuracy_s"] == expected, (record["time_to_target_accuracy_s"], summary["epochs"])
EOF
pycheck "report/compare-prints-the-times" "$R/report-compare" "$R/report-compare.out" <<EOF
$TIME_TO_TARGET
pairs = runs(sys.argv[1])
table = open(sys.argv[2]).read().splitlines()
best = pairs[0][0]["target_accuracy"]["accuracy"]
header = [line for line in table if line.startswith("method ")][0]
assert f"time to {best * 100:.2f}% test" in header, header
for record, _ in pairs:
    row = [line for line in table if line.startswith(record["method"] + " ")][0]
    assert f"{record['time_to_target_accuracy_s']:.2f} s" in row, (row, record["time_to_target_accuracy_s"])
EOF

run report "$R/report-compare" >"$R/report.out" 2>"$R/report.err"
expect_success "report/exit-0" $? "$R/report.out" "$R/report.err"
if [ "$(cat "$R/report.out")" = "wrote $R/report-compare/report.html" ] && [ ! -s "$R/report.err" ]; then
  pass "report/says-what-it-wrote"
else
  fail "report/says-what-it-wrote" "stdout: $(excerpt "$R/report.out") stderr: $(excerpt "$R/report.err")"
fi
# REPORT_PAGE (python): the page's checks shared by the reports below.
REPORT_PAGE='
import json, os, re, sys
def page(path, svgs):
    html = open(path, encoding="utf-8").read()
    assert html.startswith("<!DOCTYPE html>"), html[:40]
    found = re.findall(r"<svg\b.*?</svg>", html, re.S)
    assert len(found) == svgs, f"{len(found)} <svg> elements, expected {svgs}"
    for svg in found:
        assert len(re.findall(r"<path\b", svg)) >= 5, "an SVG with fewer than 5 paths"
    assert "<script" not in html, "a script"
    assert not re.search(r"(src|href)=[\"\x27](?!#)", html), "a reference to another file"
    return html
'
pycheck "report/compare-page" "$R/report-compare" <<EOF
$REPORT_PAGE
$TIME_TO_TARGET
html = page(os.path.join(sys.argv[1], "report.html"), 6)
pairs = runs(sys.argv[1])
best = pairs[0][0]["target_accuracy"]["accuracy"]
assert f"<th>time to {best * 100:.2f}% test</th>" in html, "no time-to-accuracy column"
assert "<th>speedup vs dsync</th>" in html
for record, _ in pairs:
    cells = f"<td>{record['speedup']:.2f}x</td>"
    assert cells in html, cells
    assert f"<td>{record['time_to_target_accuracy_s']:.2f} s</td>" in html
EOF
# --target-accuracy 1 (the fixture's 50 test images are not all learnt in 30 iterations, but the
# check does not assume it) and --out FILE.
run report "$R/report-compare" --target-accuracy 1 --out "$R/report-target.html" >"$R/report-target.out" 2>"$R/report-target.err"
expect_success "report/target-exit-0" $? "$R/report-target.out" "$R/report-target.err"
pycheck "report/target-accuracy-given" "$R/report-compare" "$R/report-target.html" <<EOF
$REPORT_PAGE
$TIME_TO_TARGET
html = page(sys.argv[2], 6)
assert "<th>time to 100.00% test</th>" in html, "no 100% column"
for record, summary in runs(sys.argv[1]):
    seconds = time_to(summary, 1.0)
    cell = "-" if seconds is None else f"{seconds:.2f} s"
    row = re.search(r"<tr><td>" + re.escape(record["method"]) + r"</td>.*?</tr>", html).group(0)
    assert row.endswith(f"<td>{cell}</td></tr>"), (row, cell)
assert "given by --target-accuracy" in html
EOF

# compare --target-accuracy: the given target in compare.json, reached after the first epoch.
run compare --algos dsync --iters 20 "${REPORT_RUN[@]}" --target-accuracy 0.01 --out "$R/report-compare-given" \
  >"$R/report-compare-given.out" 2>"$R/report-compare-given.err"
expect_success "report/compare-target-exit-0" $? "$R/report-compare-given.out" "$R/report-compare-given.err"
pycheck "report/compare-target-given" "$R/report-compare-given" <<EOF
$TIME_TO_TARGET
[(record, summary)] = runs(sys.argv[1])
assert record["target_accuracy"] == {"accuracy": 0.01, "of": "test", "given": True}, record["target_accuracy"]
assert record["time_to_target_accuracy_s"] == summary["epochs"][0]["elapsed_s"], (record, summary["epochs"])
EOF

# A train directory without test accuracy: the train accuracy is drawn and the target is on it.
run train --algo pipe --iters 20 "${REPORT_RUN[@]}" --no-eval --out "$R/report-train" \
  >"$R/report-train.out" 2>"$R/report-train.err"
expect_success "report/train-exit-0" $? "$R/report-train.out" "$R/report-train.err"
run report "$R/report-train" >"$R/report-train-report.out" 2>"$R/report-train-report.err"
expect_success "report/train-report-exit-0" $? "$R/report-train-report.out" "$R/report-train-report.err"
pycheck "report/train-page-without-test-accuracy" "$R/report-train/report.html" <<EOF
$REPORT_PAGE
html = page(sys.argv[1], 6)
assert "test accuracy not evaluated" in html, "the page does not say the test accuracy was not evaluated"
assert re.search(r"<th>time to \d+\.\d\d% train</th>", html), "no time to a train accuracy"
assert "speedup" not in html, "a speedup for a single run"
EOF

# Problems of the files or of gnuplot: one line naming them, and no page written.
cp -r "$R/report-compare" "$TMP/report-no-metrics"
rm "$TMP/report-no-metrics/2-pipe/metrics.jsonl"
row report-metrics-missing 1 "metrics '$TMP/report-no-metrics/2-pipe/metrics.jsonl': cannot open" report "$TMP/report-no-metrics"
report_row_with_path report-gnuplot-missing /nonexistent 1 "pipesgd report needs gnuplot (apt install gnuplot-nox)" \
  report "$R/report-compare" --out "$TMP/report-no-gnuplot.html"
mkdir -p "$TMP/fake-gnuplot"
printf '#!/bin/sh\necho "report.gp, line 3: undefined variable: boom" >&2\nexit 1\n' >"$TMP/fake-gnuplot/gnuplot"
chmod +x "$TMP/fake-gnuplot/gnuplot"
report_row_with_path report-gnuplot-fails "$TMP/fake-gnuplot:$PATH" 1 \
  "gnuplot exited with status 1: report.gp, line 3: undefined variable: boom" report "$R/report-compare" --out "$TMP/report-failed.html"
if [ ! -e "$TMP/report-no-gnuplot.html" ] && [ ! -e "$TMP/report-failed.html" ]; then
  pass "report/no-page-after-an-error"
else
  fail "report/no-page-after-an-error" "a page was written"
fi
