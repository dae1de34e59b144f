# shellcheck shell=bash
# Output that fits a terminal, and mistakes met with help (sourced by run_cli_tests.sh; uses $R,
# $TMP, $FX, run, row, pycheck, pass, fail, expect_success, expect_contains):
#  - --help of every command wrapped to the terminal's width (COLUMNS; 80 when stdout is not a
#    terminal): no line longer;
#  - compare's default table and prose fit 100 characters; --wide shows every column;
#  - a mistyped option or command gets a suggestion ("did you mean --iters?"); --version;
#  - float64 .npy inputs (NumPy's default dtype) are converted to float32, said once on stderr, and
#    train as the same float32 values do;
#  - report finds the run's trace where the run wrote it (summary.json records it), outside --out.
# run_cli_tests.sh exports COLUMNS=10000 (other rows look for phrases of the help): the rows here set
# their own.

# longest_line FILE: the length of FILE's longest line.
longest_line() { awk '{ if (length($0) > m) m = length($0) } END { print m + 0 }' "$1"; }

# expect_width NAME FILE WIDTH: passes if no line of FILE (not empty) is longer than WIDTH.
expect_width() {
  local name=$1 file=$2 width=$3 longest
  longest=$(longest_line "$file")
  if [ -s "$file" ] && [ "$longest" -le "$width" ]; then
    pass "$name"
  else
    fail "$name" "longest line $longest > $width: $(awk -v w="$width" 'length($0) > w { print; exit }' "$file" | head -c 200)"
  fi
}

# --- --help: every command's, at 100 columns, at 60, and at the default 80 (stdout is a file).
run --help >"$R/term-help-top.out" 2>&1
commands=$(awk '/^Subcommands:/ { on = 1; next } on && /^  [a-z]/ { print $1 }' "$R/term-help-top.out")
if [ -z "$commands" ]; then fail "terminal/help-lists-commands" "no Subcommands: in $(excerpt "$R/term-help-top.out")"; fi
for command in "" $commands "bench allreduce"; do
  name=${command:-top}
  name=${name// /-}
  for width in 100 60; do
    # shellcheck disable=SC2086  # the command's words
    COLUMNS=$width run $command --help >"$R/term-help-$name-$width.out" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then fail "terminal/help-$name-$width-exit-0" "exit $rc"; continue; fi
    expect_width "terminal/help-$name-fits-$width" "$R/term-help-$name-$width.out" "$width"
  done
  # shellcheck disable=SC2086
  COLUMNS= run $command --help >"$R/term-help-$name-default.out" 2>&1
  expect_width "terminal/help-$name-fits-80-when-not-a-terminal" "$R/term-help-$name-default.out" 80
done
# --help-all: the subcommands' help indented under their names, still within the width.
for width in 60 100; do
  COLUMNS=$width run --help-all >"$R/term-help-all-$width.out" 2>&1
  expect_width "terminal/help-all-fits-$width" "$R/term-help-all-$width.out" "$width"
done
# Wrapping loses nothing: the train help at 60 columns holds the text of the unwrapped one (a word
# longer than a line is cut).
COLUMNS=10000 run train --help >"$R/term-help-train-wide.out" 2>&1
pycheck "terminal/help-wrapping-keeps-every-word" "$R/term-help-train-wide.out" "$R/term-help-train-60.out" <<'PY'
import sys
wide, narrow = ("".join(open(p).read().split()) for p in sys.argv[1:3])
assert wide == narrow, next((wide[i - 20:i + 20], narrow[i - 20:i + 20]) for i in range(len(wide)) if wide[i] != narrow[i])
PY

# --- Suggestions for typos; none for what is nothing like an option.
row typo-option           2 "unknown option --iter; did you mean --iters?" train --iter 50 --data synthetic --quiet
row typo-option-equals    2 "unknown option --iter; did you mean --iters?" train --iter=50 --data synthetic --quiet
row typo-compare-option   2 "unknown option --algo; did you mean --algos?" compare --algo dsync --data synthetic
row typo-swapped-letters  2 "unknown option --wokrers; did you mean --workers?" train --wokrers 2
row typo-command          2 "unknown command 'trian'; did you mean train?" trian --iters 3
row typo-bench-command    2 "unknown command 'allredce' for pipesgd bench; did you mean allreduce?" bench allredce
row typo-far-from-any     2 "unknown option --frobnicate (see pipesgd train --help)" train --frobnicate
if grep -q "did you mean" "$TMP/rows/typo-far-from-any.err"; then
  fail "terminal/no-suggestion-far-from-any" "$(excerpt "$TMP/rows/typo-far-from-any.err")"
else
  pass "terminal/no-suggestion-far-from-any"
fi
run --version >"$R/term-version.out" 2>"$R/term-version.err"
expect_success "terminal/version-exit-0" $? "$R/term-version.out" "$R/term-version.err"
if grep -qE '^pipesgd .+' "$R/term-version.out" && [ "$(wc -l <"$R/term-version.out")" -eq 1 ]; then
  pass "terminal/version-one-line"
else
  fail "terminal/version-one-line" "stdout: $(excerpt "$R/term-version.out")"
fi

# --- compare: the default output fits 100 characters (stdout is not a terminal, no COLUMNS); --wide
# has every column.
TC=(--algos dsync,pipe,pipe+int8 --data synthetic --iters 10 --workers 2 --quiet)
COLUMNS= run compare "${TC[@]}" --out "$R/term-compare" >"$R/term-compare.out" 2>"$R/term-compare.err"
expect_success "terminal/compare-exit-0" $? "$R/term-compare.out" "$R/term-compare.err"
expect_width "terminal/compare-fits-100" "$R/term-compare.out" 100
expect_contains "terminal/compare-default-columns" "$R/term-compare.out" "samples/s" "iter ms" "exposed wait" \
  "test acc" "time to " "speedup vs dsync" "--wide"
if grep '^method ' "$R/term-compare.out" | grep -qE "predicted ms|comm CPU ns/B|stretch"; then
  fail "terminal/compare-default-leaves-wide-columns" "$(grep -m1 '^method' "$R/term-compare.out")"
else
  pass "terminal/compare-default-leaves-wide-columns"
fi
# Every method family's own table too (layer-wise plans, SAPipe, OD-SGD, parameter servers).
COLUMNS= run compare --algos dsync,wfbp,mgwfbp,sapipe,pssync,odsgd --servers 1 --model cnn --data synthetic \
  --iters 30 --workers 2 --profile-iters 2 --quiet --no-eval >"$R/term-families.out" 2>"$R/term-families.err"
expect_success "terminal/compare-families-exit-0" $? "$R/term-families.out" "$R/term-families.err"
expect_width "terminal/compare-families-fit-100" "$R/term-families.out" 100
expect_contains "terminal/compare-families-tables" "$R/term-families.out" "Layer-wise communication" \
  "plan of wfbp: wfbp: 5 buckets" "OD-SGD paper's Table 1" "SAPipe paper's Table 2"
if grep -qE '^(pssync|odsgd) +0 ' "$R/term-families.out"; then
  fail "terminal/layer-wise-table-leaves-out-servers" "$(grep -E '^(pssync|odsgd) +0 ' "$R/term-families.out" | head -1)"
else
  pass "terminal/layer-wise-table-leaves-out-servers"
fi
COLUMNS= run compare "${TC[@]}" --wide >"$R/term-compare-wide.out" 2>"$R/term-compare-wide.err"
expect_success "terminal/compare-wide-exit-0" $? "$R/term-compare-wide.out" "$R/term-compare-wide.err"
pycheck "terminal/compare-wide-has-every-column" "$R/term-compare-wide.out" "$R/term-compare.out" <<'PY'
import re, sys
def header(path):
    line = next(l for l in open(path).read().splitlines() if l.startswith("method "))
    return re.split(r"\s{2,}", line.strip())
wide, narrow = header(sys.argv[1]), header(sys.argv[2])
for column in ["update", "comp", "forward", "backward", "compute", "stretch", "comm", "comm CPU ns/B",
               "predicted ms", "train acc", "test acc"] + narrow:
    assert column in wide, f"--wide lacks {column!r}: {wide}"
assert len(wide) > len(narrow), (wide, narrow)
PY
pycheck "terminal/compare-json-has-every-figure" "$R/term-compare/compare.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1])):
    for key in ["compute_s", "compute_stretch", "comm_cpu_ns_per_byte", "predicted_iteration_s",
                "final_train_accuracy", "final_test_accuracy", "breakdown", "speedup"]:
        assert key in r, f"{r['method']}: no {key}"
PY

# --- float64 .npy inputs: converted to float32 (said once), the same weights as float32 files.
T64=$TMP/term-npy
if /usr/bin/python3 - "$FX/good" "$T64" <<'PY'; then
import gzip, os, sys
import numpy as np
fixture, out = sys.argv[1], sys.argv[2]
def idx(name, header):
    with gzip.open(os.path.join(fixture, name + ".gz")) as f:
        return np.frombuffer(f.read()[header:], dtype=np.uint8)
x = {"train": idx("train-images-idx3-ubyte", 16).reshape(-1, 28, 28), "test": idx("t10k-images-idx3-ubyte", 16).reshape(-1, 28, 28)}
y = {"train": idx("train-labels-idx1-ubyte", 8).astype(np.int64), "test": idx("t10k-labels-idx1-ubyte", 8).astype(np.int64)}
for dtype in ("float32", "float64"):
    os.makedirs(os.path.join(out, dtype), exist_ok=True)
    for split in ("train", "test"):
        # Values float32 holds exactly, so that the conversion changes none.
        values = (x[split].astype(np.float32) / np.float32(255)).astype(dtype)
        np.save(os.path.join(out, dtype, split + "_x.npy"), values)
        np.save(os.path.join(out, dtype, split + "_y.npy"), y[split])
assert np.load(os.path.join(out, "float64", "train_x.npy")).dtype == np.float64
PY
  T64_RUN=(--workers 2 --batch 10 --iters 5 --quiet --no-eval)
  for dtype in float32 float64; do
    run train --data "npy:$T64/$dtype" "${T64_RUN[@]}" --out "$R/term-npy-$dtype" >"$R/term-npy-$dtype.out" \
      2>"$R/term-npy-$dtype.err"
    expect_success "npy/train-$dtype-inputs-exit-0" $? "$R/term-npy-$dtype.out" "$R/term-npy-$dtype.err"
  done
  pycheck "npy/float64-said-once-on-stderr" "$R/term-npy-float64.err" "$R/term-npy-float32.err" "$T64/float64" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1 and "float64" in lines[0] and "float32" in lines[0], lines
assert f"{sys.argv[3]}/train_x.npy" in lines[0] and f"{sys.argv[3]}/test_x.npy" in lines[0], lines
assert open(sys.argv[2]).read() == "", "float32 inputs: stderr not empty"
PY
  pycheck "npy/float64-trains-as-float32" "$R/term-npy-float32" "$R/term-npy-float64" <<'PY'
import json, sys
def run(d):
    s = json.load(open(d + "/summary.json"))
    return s["weights_checksum"], [json.loads(l)["loss"] for l in open(d + "/metrics.jsonl") if '"iteration"' in l]
a, b = (run(d) for d in sys.argv[1:3])
assert len(a[1]) == 5 and a == b, f"{a} != {b}"
PY
else
  fail "npy/float64-fixtures" "numpy fixtures could not be written (needs /usr/bin/python3 with python3-numpy)"
fi

# --- report finds the trace the run wrote outside its --out directory (summary.json says where).
mkdir -p "$TMP/term-elsewhere"
run train --data synthetic --iters 8 --workers 2 --quiet --no-eval --trace "$TMP/term-elsewhere/run-trace.json" \
  --out "$R/term-traced" >"$R/term-traced.out" 2>"$R/term-traced.err"
expect_success "report/traced-train-exit-0" $? "$R/term-traced.out" "$R/term-traced.err"
pycheck "report/summary-records-the-trace" "$R/term-traced/summary.json" "$TMP/term-elsewhere/run-trace.json" <<'PY'
import json, sys
assert json.load(open(sys.argv[1]))["configuration"]["trace"] == sys.argv[2]
PY
(cd "$TMP" && run report "$R/term-traced" >"$R/term-report.out" 2>"$R/term-report.err")
expect_success "report/finds-recorded-trace-exit-0" $? "$R/term-report.out" "$R/term-report.err"
expect_contains "report/finds-recorded-trace" "$R/term-traced/report.html" "Timeline (from the trace)"
# The same for a compare (each method's summary.json records the file).
run compare --algos dsync,pipe --data synthetic --iters 8 --workers 2 --quiet --no-eval \
  --trace "$TMP/term-elsewhere/compare-trace.json" --out "$R/term-traced-compare" >"$R/term-traced-compare.out" \
  2>"$R/term-traced-compare.err"
expect_success "report/traced-compare-exit-0" $? "$R/term-traced-compare.out" "$R/term-traced-compare.err"
run report "$R/term-traced-compare" >"$R/term-report-compare.out" 2>"$R/term-report-compare.err"
expect_success "report/compare-finds-recorded-trace-exit-0" $? "$R/term-report-compare.out" "$R/term-report-compare.err"
expect_contains "report/compare-finds-recorded-trace" "$R/term-traced-compare/report.html" "Timeline (from the trace)"
# A trace since moved: the page without a timeline, and one line saying why.
mv "$TMP/term-elsewhere/run-trace.json" "$TMP/term-elsewhere/moved.json"
run report "$R/term-traced" >"$R/term-report-gone.out" 2>"$R/term-report-gone.err"
expect_success "report/trace-gone-exit-0" $? "$R/term-report-gone.out" "$R/term-report-gone.err"
expect_contains "report/trace-gone-says-so" "$R/term-report-gone.err" "$TMP/term-elsewhere/run-trace.json" "gone"
