# shellcheck shell=bash
# Helpers shared by the end-to-end tests of the `pipesgd` command line (run_cli_tests.sh,
# run_mpi_cli_tests.sh). Source it, then call `cli_test_setup NAME "$@"` with the script's arguments.
#
# Output contract of every script: one line per check (`ok <name>` or `FAIL <name>: why`) and, last,
# exactly one summary line `N passed, M failed` (cli_test_finish); exit 0 only if nothing failed.

# Checks the arguments (one: the binary), python3, and creates the scratch directory TMP (with
# TMP/rows for `row`), removed on exit. Sets BIN (absolute path). A script that starts processes
# defines cli_test_cleanup, which the exit trap runs before removing TMP.
cli_test_setup() {
  local name=$1
  shift
  if [ $# -ne 1 ]; then
    echo "usage: $0 path/to/pipesgd" >&2
    exit 2
  fi
  BIN=$1
  case $BIN in /*) ;; *) BIN=$PWD/$BIN ;; esac
  if [ ! -x "$BIN" ]; then
    echo "FAIL setup: $BIN is not an executable"
    echo "0 passed, 1 failed"
    exit 1
  fi
  command -v python3 >/dev/null || { echo "FAIL setup: python3 not found"; echo "0 passed, 1 failed"; exit 1; }
  # Help and compare's prose unwrapped (the checks look for phrases in them); the rows on the
  # terminal's width (45_terminal.sh) set COLUMNS themselves.
  export COLUMNS=10000
  TMP=$(mktemp -d "${TMPDIR:-/tmp}/$name.XXXXXX")
  trap cli_test_on_exit EXIT
  mkdir -p "$TMP/rows"
}

# KEEP_TMP=1 keeps the scratch directory (runs, outputs) for a look after a failure.
cli_test_on_exit() {
  if declare -F cli_test_cleanup >/dev/null; then cli_test_cleanup; fi
  if [ -n "${KEEP_TMP:-}" ]; then echo "kept $TMP" >&2; else rm -rf "$TMP"; fi
}

# A setup problem that makes the remaining checks meaningless: report it and stop.
cli_test_abort() {
  echo "FAIL setup: $1"
  echo "$PASSED passed, $((FAILED + 1)) failed"
  exit 1
}

# The summary line; the script's exit status.
cli_test_finish() {
  echo "$PASSED passed, $FAILED failed"
  [ "$FAILED" -eq 0 ]
}

# shellcheck disable=SC2034  # used by the scripts that source this file
REAL_DATA=/usr/share/datasets/fashion-mnist

PASSED=0
FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "ok $1"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL $1: $2"; }

# A file's first characters on one line (for FAIL messages).
excerpt() { head -c "${2:-300}" "$1" | tr '\r\n' '^|'; }

# Every run is bounded in time and, as a guard for the machine shared with other jobs, in memory.
MEMORY_LIMIT_KB=3000000
run() { (ulimit -v "$MEMORY_LIMIT_KB" 2>/dev/null; exec timeout -k 5 "${TIMEOUT:-60}" "$BIN" "$@"); }

CRASH_PATTERN='terminate called|Aborted|core dumped|Segmentation fault|Floating point exception|Exception raised from|frame #[0-9]|Traceback|stack trace|internal error'

# Checks the error contract on files $out/$err left by a run that exited with $rc:
# exit code in the comma-separated list $want; stderr is exactly one newline-terminated line that
# starts with "pipesgd: error:" and contains $fragment; no crash or stack trace anywhere.
# Appends the problems to the array WHY.
check_error_contract() {
  local rc=$1 want=$2 fragment=$3 out=$4 err=$5
  if [ "$rc" -eq 124 ]; then
    WHY+=("hung: stopped by timeout after ${TIMEOUT:-60} s")
  elif [ "$rc" -eq 137 ]; then
    WHY+=("SIGKILL (exit 137): hung past the timeout or out of memory")
  elif [ "$rc" -gt 128 ]; then
    WHY+=("killed by signal $((rc - 128)) (exit $rc), expected exit $want")
  elif [[ ",$want," != *",$rc,"* ]]; then
    WHY+=("exit $rc, expected $want")
  fi
  local lines
  lines=$(awk 'END { print NR }' "$err")
  if [ "$lines" -ne 1 ]; then WHY+=("stderr has $lines lines, expected 1"); fi
  if [ -s "$err" ] && [ -n "$(tail -c 1 "$err")" ]; then WHY+=("stderr does not end with a newline"); fi
  if [[ "$(head -n 1 "$err")" != "pipesgd: error:"* ]]; then WHY+=("stderr does not start with 'pipesgd: error:'"); fi
  if ! grep -qF -- "$fragment" "$err"; then WHY+=("stderr lacks '$fragment'"); fi
  if grep -qE "$CRASH_PATTERN" "$out" "$err"; then WHY+=("crash or stack trace in the output"); fi
}

join_why() { local IFS=';'; echo "${WHY[*]}"; }

# One row of a malformed-input table: row NAME EXPECTED_EXIT FRAGMENT ARGS...
row() {
  local name=$1 want=$2 fragment=$3
  shift 3
  local out="$TMP/rows/$name.out" err="$TMP/rows/$name.err"
  run "$@" >"$out" 2>"$err"
  local rc=$?
  WHY=()
  check_error_contract "$rc" "$want" "$fragment" "$out" "$err"
  if [ ${#WHY[@]} -eq 0 ]; then
    pass "error/$name"
  else
    fail "error/$name" "$(join_why) [pipesgd $* -> stderr: $(excerpt "$err")]"
  fi
}

# Runs python3 with the program on stdin and ARGS; the check passes if it exits 0 and prints nothing.
pycheck() {
  local name=$1
  shift
  local message
  message=$(python3 - "$@" 2>&1)
  local rc=$?
  if [ $rc -eq 0 ] && [ -z "$message" ]; then
    pass "$name"
  else
    fail "$name" "$(printf '%s' "$message" | tr '\n' '|' | head -c 1200)"
  fi
}

# Passes if a run exited 0; otherwise says how it failed.
expect_success() {
  local name=$1 rc=$2 out=$3 err=$4
  if [ "$rc" -eq 0 ]; then
    pass "$name"
  else
    fail "$name" "exit $rc [stderr: $(excerpt "$err")] [stdout: $(excerpt "$out" 200)]"
  fi
}

# Passes if FILE contains every fixed string given.
expect_contains() {
  local name=$1 file=$2
  shift 2
  local missing=()
  for text in "$@"; do grep -qF -- "$text" "$file" || missing+=("'$text'"); done
  if [ ${#missing[@]} -eq 0 ]; then pass "$name"; else fail "$name" "missing ${missing[*]}"; fi
}
