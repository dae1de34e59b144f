#!/usr/bin/env bash
# The page `pipesgd report` writes, as a person sees it: headless Chromium loads the report of a
# short compare and
#  - its DOM (--dump-dom) holds every plot: 8 <svg> elements in their <figure>s (the 6 plots of the
#    runs and the timelines of the two methods from the run's --trace file in DIR/trace.json), each
#    with <path> elements that carry drawing data, and no <script>;
#  - its screenshot is drawn: png_ink (tests/report/png_ink.cpp) counts the pixels that are not
#    background and the colored ones (the plots' lines and bars).
#
#   tests/report/check_report_in_browser.sh path/to/pipesgd path/to/png_ink
#
# Prints one line per check (`ok <name>` or `FAIL <name>: why`) and, last, `N passed, M failed`;
# exits 0 only if nothing failed. Needs chromium and gnuplot (scripts/install-deps.sh) and python3.
set -u

if [ $# -ne 2 ]; then
  echo "usage: $0 path/to/pipesgd path/to/png_ink" >&2
  exit 2
fi
BIN=$1
PNG_INK=$2
PASSED=0
FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "ok $1"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $1: $2"; }
finish() {
  echo "$PASSED passed, $FAILED failed"
  [ "$FAILED" -eq 0 ]
}
excerpt() { head -c "${2:-300}" "$1" | tr '\r\n' '^|'; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/pipesgd-report-browser.XXXXXX")
trap 'if [ -n "${KEEP_TMP:-}" ]; then echo "kept $TMP" >&2; else rm -rf "$TMP"; fi' EXIT

BROWSER=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$BROWSER" ]; then
  fail setup "chromium not found (scripts/install-deps.sh installs it: apt install chromium)"
  finish
  exit 1
fi

# A short compare with test accuracy after each of its 3 epochs (synthetic data: 12,000 training
# examples, 2 workers x batch 200, 30 iterations an epoch).
OMP_NUM_THREADS=1 timeout 300 "$BIN" compare --algos dsync,pipe --workers 2 --data synthetic --batch 200 --iters 90 \
  --quiet --out "$TMP/run" --trace "$TMP/run/trace.json" >"$TMP/compare.out" 2>"$TMP/compare.err"
rc=$?
if [ $rc -ne 0 ]; then
  fail compare "exit $rc [stderr: $(excerpt "$TMP/compare.err")]"
  finish
  exit 1
fi
pass compare
timeout 120 "$BIN" report "$TMP/run" >"$TMP/report.out" 2>"$TMP/report.err"
rc=$?
if [ $rc -eq 0 ] && [ "$(cat "$TMP/report.out")" = "wrote $TMP/run/report.html" ]; then
  pass report
else
  fail report "exit $rc [stdout: $(excerpt "$TMP/report.out")] [stderr: $(excerpt "$TMP/report.err")]"
  finish
  exit 1
fi

PAGE="file://$TMP/run/report.html"
CHROMIUM_FLAGS=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run --hide-scrollbars
                --user-data-dir="$TMP/profile")
# The page is about 5,000 pixels tall at this width: the screenshot holds all of it.
(cd "$TMP" && HOME=$TMP timeout 120 "$BROWSER" "${CHROMIUM_FLAGS[@]}" --dump-dom "$PAGE") >"$TMP/dom.html" 2>"$TMP/dom.err"
rc=$?
if [ $rc -eq 0 ] && [ -s "$TMP/dom.html" ]; then pass "chromium-dump-dom"; else fail "chromium-dump-dom" "exit $rc [stderr: $(excerpt "$TMP/dom.err" 600)]"; fi
(cd "$TMP" && HOME=$TMP timeout 120 "$BROWSER" "${CHROMIUM_FLAGS[@]}" --window-size=1200,5200 \
  --screenshot="$TMP/page.png" "$PAGE") >"$TMP/shot.out" 2>"$TMP/shot.err"
rc=$?
if [ $rc -eq 0 ] && [ -s "$TMP/page.png" ]; then pass "chromium-screenshot"; else fail "chromium-screenshot" "exit $rc [stderr: $(excerpt "$TMP/shot.err" 600)]"; fi

# The DOM as the browser built it.
message=$(python3 - "$TMP/dom.html" <<'EOF' 2>&1
import re, sys
dom = open(sys.argv[1], encoding="utf-8").read()
figures = ["loss-time", "loss-iterations", "accuracy-time", "accuracy-iterations", "breakdown", "comm-compute",
           "timeline-0", "timeline-1"]
problems = []
if "<script" in dom:
    problems.append("the page has a <script>")
svgs = re.findall(r"<svg\b.*?</svg>", dom, re.S)
if len(svgs) != len(figures):
    problems.append(f"{len(svgs)} <svg> elements, expected {len(figures)}")
for name in figures:
    found = re.search(r'<figure id="' + re.escape(name) + r'">\s*(<svg\b.*?</svg>)', dom, re.S)
    if not found:
        problems.append(f"no <svg> in <figure id=\"{name}\">")
        continue
    # Every plot draws its axes, lines and bars as paths: "M x,y L x,y ..." with numbers.
    drawn = [d for d in re.findall(r'<path\b[^>]*\bd="([^"]*)"', found.group(1)) if re.search(r"[ML]\s*-?\d", d)]
    points = sum(len(re.findall(r"\d+(?:\.\d+)?,\d+(?:\.\d+)?", d)) for d in drawn)
    if len(drawn) < 5 or points < 40:
        problems.append(f"{name}: {len(drawn)} paths with data, {points} points")
if "<table>" not in dom or "speedup vs dsync" not in dom or "time to " not in dom:
    problems.append("the summary table is missing or lacks its speedup and time-to-accuracy columns")
print("; ".join(problems), end="")
EOF
)
if [ -z "$message" ]; then pass "dom-has-every-plot"; else fail "dom-has-every-plot" "$message"; fi

# The screenshot: not blank, and the plots' colors are there (1200 x 5200 = 6.2 M pixels).
if ink=$("$PNG_INK" "$TMP/page.png" 2>&1); then
  read -r width height drawn colored <<<"$ink"
  if [ "$width" -eq 1200 ] && [ "$drawn" -ge 100000 ] && [ "$colored" -ge 20000 ]; then
    pass "screenshot-is-drawn"
  else
    fail "screenshot-is-drawn" "$width x $height pixels, $drawn not background, $colored colored (want >= 100000 and >= 20000)"
  fi
else
  fail "screenshot-is-drawn" "$ink"
fi
finish
